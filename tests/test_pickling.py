"""convoy._values.pickling.dumps: the user's own modules travel by value, installed ones by
reference; errors name the part of an object that does not pickle."""

from __future__ import annotations

import collections.abc
import json
import os.path
import pickle
import sys
import threading
import types
from typing import Any

import cloudpickle
import numpy as np
import numpy.linalg
import pytest

import convoy
import convoy.data
from convoy._values.pickling import dumps, sent_by_value
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


# ----- which modules travel by value -----------------------------------------------------------

def test_the_standard_library_goes_by_reference() -> None:
    assert not any(sent_by_value(module) for module in (json, os.path, collections.abc, sys))
    assert pickle.loads(dumps(json.dumps, WHAT)) is json.dumps


def test_installed_packages_go_by_reference() -> None:
    assert not sent_by_value(np) and not sent_by_value(numpy.linalg)
    assert pickle.loads(dumps(np.linalg.norm, WHAT)) is np.linalg.norm


def test_convoy_goes_by_reference_wherever_it_is_loaded_from() -> None:
    assert not sent_by_value(convoy) and not sent_by_value(convoy.data)
    assert pickle.loads(dumps(convoy.data.Dataset, WHAT)) is convoy.data.Dataset


def test_modules_without_source_are_left_to_cloudpickle() -> None:
    assert not sent_by_value(types.ModuleType("built_in_a_moment"))
    assert not sent_by_value(sys.modules["__main__"])


def test_a_module_found_through_sys_path_goes_by_value(user_modules) -> None:
    (scale,) = user_modules({"scale.py": """
        FACTOR = 3

        def scaled(x):
            return x * FACTOR
    """})
    assert sent_by_value(scale)
    payload = dumps(scale.scaled, WHAT)
    user_modules.hide()
    loaded = pickle.loads(payload)
    assert loaded is not scale.scaled and loaded(2) == 6


PACKAGE = {
    "shapes/__init__.py": "from . import steps\n",
    "shapes/helpers.py": """
        from typing import Generic, TypeVar

        import numpy as np

        T = TypeVar("T")
        OFFSET = 100


        class Box(Generic[T]):
            def __init__(self, value: T) -> None:
                self.value = value


        def shift(x):
            return np.int64(x) + OFFSET
    """,
    "shapes/steps.py": """
        import shapes
        from . import helpers
        from .helpers import Box


        def boxed_and_shifted(x):
            return Box(helpers.shift(x))


        def through_the_package(x):
            return shapes.steps.boxed_and_shifted(x).value
    """,
}


def test_what_a_function_uses_goes_by_value_with_it(user_modules) -> None:
    shapes, helpers, steps = user_modules(PACKAGE)
    payload = dumps([steps.boxed_and_shifted, helpers.Box(np.arange(2))], WHAT)
    user_modules.hide()
    function, box = pickle.loads(payload)
    assert function(1).value == 101 and type(function(1)).__name__ == "Box"
    assert box.value.tolist() == [0, 1]


def test_a_package_its_functions_refer_back_to_pickles(user_modules) -> None:
    shapes, helpers, steps = user_modules(PACKAGE)
    payload = dumps(steps.through_the_package, WHAT)
    user_modules.hide()
    assert pickle.loads(payload)(5) == 105


def test_nothing_is_registered_with_cloudpickle(user_modules) -> None:
    (scale,) = user_modules({"scale.py": "def scaled(x):\n    return x * 3\n"})
    registered = cloudpickle.list_registry_pickle_by_value()
    by_value = dumps(scale.scaled, WHAT)
    assert cloudpickle.list_registry_pickle_by_value() == registered
    by_reference = cloudpickle.dumps(scale.scaled)  # cloudpickle alone is unchanged
    assert b"scaled" in by_reference and len(by_reference) < len(by_value) / 2


def test_a_module_that_cannot_go_by_value_is_named(user_modules) -> None:
    _, _, steps = user_modules({
        "locked/__init__.py": "",
        "locked/helpers.py": """
            import threading

            LOCK = threading.Lock()

            def twice(x):
                return 2 * x
        """,
        "locked/steps.py": """
            from . import helpers

            def go(x):
                return helpers.twice(x)
        """,
    })
    assert failure(steps.go).startswith(
        f"{WHAT}: go captures 'helpers', a module sent by value (it is not in an installed "
        "package), whose global 'LOCK' = <unlocked _thread.lock object")
