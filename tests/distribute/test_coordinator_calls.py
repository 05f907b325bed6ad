"""The coordinator's side of scheduled calls: a function is pickled once, what it captures
fixed at its first use; arguments that cannot be sent are refused naming them."""

from __future__ import annotations

import operator
import threading

import pytest

from convoy.distribute._coordinator_calls import call_message
from convoy.distribute._wire import is_call
from convoy.errors import InvalidArgumentError


def test_a_function_is_pickled_once_with_what_it_captured_first():
    captured = [1]

    def step(x):
        return x + captured[0]

    first = call_message(step, (1,), {}, 5)
    captured[0] = 2
    second = call_message(step, (2,), {})
    assert is_call(first) and is_call(second)
    assert second[0] == first[0] and second[1] is first[1]  # one pickle, same digest
    assert second[2] != first[2] and (first[3], second[3]) == (5, None)


def test_a_callable_that_cannot_be_weakly_referenced_is_pickled_each_time():
    first_item = operator.itemgetter(0)
    first, second = call_message(first_item, (), {}), call_message(first_item, (), {})
    assert first[0] == second[0] and first[1] is not second[1]


def test_arguments_that_do_not_pickle_are_refused_naming_the_arguments():
    with pytest.raises(InvalidArgumentError, match="arguments of a scheduled function"):
        call_message(max, (threading.Lock(),), {})
