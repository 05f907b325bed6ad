"""convoy._pickling.dumps: errors that name the part of an object that does not pickle."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest

from convoy._pickling import dumps
from convoy.errors import InvalidArgumentError

WHAT = "the thing cannot be sent"


class Holder:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class Guarded:
    """Drops its lock when pickled, as objects that keep one usually do."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"value": self.value}


def failure(obj: Any, **kwargs: Any) -> str:
    with pytest.raises(InvalidArgumentError) as raised:
        dumps(obj, WHAT, **kwargs)
    message = str(raised.value)
    assert message.startswith(WHAT + ": ")
    assert "cannot pickle '_thread.lock' object" in message  # cloudpickle's own error
    return message


def test_what_pickles_round_trips() -> None:
    value = Holder(numbers=[1, 2.5], name="x", scale=lambda v: v * 2)
    loaded = pickle.loads(dumps(value, WHAT))
    assert loaded.numbers == [1, 2.5] and loaded.scale(3) == 6


def test_an_objects_field_is_named() -> None:
    assert failure(Holder(ok=1, lock=threading.Lock())).startswith(
        f"{WHAT}: Holder's 'lock' (<unlocked _thread.lock object")


def test_the_innermost_object_is_named() -> None:
    message = failure(Holder(inner=[1, {"key": Holder(lock=threading.Lock())}]))
    assert f"{WHAT}: Holder's 'lock' (<unlocked _thread.lock" in message


def test_items_of_containers_are_indexed() -> None:
    message = failure(Holder(items=[1, threading.Lock()]))
    assert "Holder's 'items'[1] (<unlocked _thread.lock" in message
    assert "[1] (<unlocked" in failure([0, threading.Lock()])
    assert "['k'] (<unlocked" in failure({"k": threading.Lock()})


def _closure() -> Any:
    guard = threading.Lock()

    def locked(x: Any) -> Any:
        with guard:
            return x

    return locked


def test_a_functions_captured_variable_is_named() -> None:
    message = failure(_closure())
    assert message.startswith(f"{WHAT}: _closure.<locals>.locked captures 'guard' = "
                              "<unlocked _thread.lock")
    assert ", which cannot be pickled: " in message


def test_a_field_holding_a_function_names_both() -> None:
    assert "Holder's 'fn' (_closure.<locals>.locked) captures 'guard' = <unlocked" in failure(
        Holder(fn=_closure()))


def test_the_first_part_that_fails_is_named() -> None:
    message = failure(Holder(first=Holder(a=threading.Lock()), second=threading.RLock()))
    assert "Holder's 'a'" in message and "second" not in message


def test_what_pickling_leaves_out_is_not_blamed() -> None:
    message = failure(Guarded(Holder(lock=threading.Lock())))
    assert "Holder's 'lock'" in message and "_lock" not in message


def test_objects_can_be_named_by_the_caller() -> None:
    message = failure(Holder(lock=threading.Lock()), name_of=lambda obj: "the holder")
    assert message.startswith(f"{WHAT}: the holder's 'lock' (")


def test_an_object_without_parts_is_reported_plainly() -> None:
    assert failure(threading.Lock()) == f"{WHAT}: cannot pickle '_thread.lock' object"


def test_cycles_end() -> None:
    holder = Holder(lock=threading.Lock())
    holder.self = holder
    assert "Holder's 'lock'" in failure(holder)
