"""The variable store's one dispatch of operations: every registered kind runs, anything else
is refused naming what it got."""

from __future__ import annotations

import numpy as np
import pytest

import convoy.distribute  # noqa: F401  (registers every operation the package defines)
from convoy.distribute import _operations as ops
from convoy.distribute import _store
from convoy.distribute._store import VariableStore
from convoy.errors import InvalidArgumentError


def test_every_registered_operation_has_a_handler():
    assert set(ops.KINDS) == set(_store._HANDLERS)
    assert len(set(ops.KINDS.values())) == len(ops.KINDS)  # kinds are metric labels: unique


def test_operations_run_in_order_and_answer_in_order():
    store = VariableStore()
    answers = store.execute([ops.Create("v", np.zeros((3, 2))),
                             ops.ScatterAdd("v", np.array([1, 1]), np.ones((2, 2))),
                             ops.Gather("v", np.array([1, 0])), ops.Read("v")])
    assert answers[:2] == [None, None]
    np.testing.assert_array_equal(answers[2], [[2.0, 2.0], [0.0, 0.0]])
    assert answers[3].sum() == 4


@pytest.mark.parametrize("operation", [("read", "v"), ("read",), "read", None, 5],
                         ids=["old-tuple", "kind-only", "str", "none", "int"])
def test_what_is_no_operation_is_refused_naming_it(operation):
    store = VariableStore()
    store.execute([ops.Create("v", np.zeros(2))])
    with pytest.raises(InvalidArgumentError, match="unknown variable operation"):
        store.execute([operation])


def test_an_operation_naming_a_variable_by_other_than_a_str_is_refused():
    with pytest.raises(InvalidArgumentError, match="'read' names a variable with a str, got int"):
        VariableStore().execute([ops.Read(3)])


def test_kind_of_names_operations_and_other_values():
    assert ops.kind_of(ops.ScatterAdd("v", np.zeros(1), np.zeros(1))) == "scatter_add"
    assert ops.kind_of(("read", "v")) == "tuple"
