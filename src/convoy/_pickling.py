"""Pickling for the wire, with errors that name the part that does not pickle.

cloudpickle's own errors say what kind of object failed ("cannot pickle '_thread.lock'
object"), not where it sits. :func:`dumps` then searches the object, depth first, for the
innermost part that fails: an object's field, an item of a list, tuple, set or dict, or a
variable a function uses from its closure or its module's globals.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from convoy.errors import InvalidArgumentError

#: How much of a value's repr an error message shows.
_REPR_CHARS = 80


def dumps(obj: Any, what: str, name_of: Callable[[Any], str] | None = None) -> bytes:
    """``obj`` pickled with cloudpickle.

    On failure raises :class:`InvalidArgumentError` that opens with ``what`` (say, "the
    dataset cannot be sent to the data service") and names the first part of ``obj`` that
    does not pickle. ``name_of`` names the objects whose fields the message mentions (by
    default, their type's name).
    """
    try:
        return cloudpickle.dumps(obj)
    except Exception as error:
        culprit = _culprit(obj, "", name_of or _type_name, set())
        raise InvalidArgumentError(
            f"{what}: {culprit}: {error}" if culprit else f"{what}: {error}"
        ) from None


def _type_name(obj: Any) -> str:
    return type(obj).__name__


def _pickles(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True


def _culprit(obj: Any, label: str, name_of: Callable[[Any], str], seen: set[int]) -> str:
    """The innermost part of ``obj`` (which does not pickle) that does not pickle, described;
    "" when no part of it is to blame. ``label`` says where ``obj`` itself sits."""
    if id(obj) in seen:
        return ""
    seen.add(id(obj))
    for part_label, part, captured in _parts(obj, label, name_of):
        if _pickles(part):
            continue
        inner = _culprit(part, part_label, name_of, seen)
        if inner:
            return inner
        if captured:
            return f"{part_label} = {part!r:.{_REPR_CHARS}}, which cannot be pickled"
        return f"{part_label} ({part!r:.{_REPR_CHARS}}) cannot be pickled"
    return ""


def _parts(obj: Any, label: str, name_of: Callable[[Any], str]
           ) -> Iterator[tuple[str, Any, bool]]:
    """(label, part, whether it is a function's captured variable) for each part of ``obj``."""
    if isinstance(obj, types.FunctionType):
        where = f"{label} ({obj.__qualname__})" if label else obj.__qualname__
        for name, value in _captured(obj):
            yield f"{where} captures {name!r}", value, True
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for index, item in enumerate(obj):
            yield f"{label}[{index}]", item, False
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield f"{label}[{key!r}]", value, False
    elif not isinstance(obj, (type, types.ModuleType)):
        for name, value in _fields(obj).items():
            yield f"{name_of(obj)}'s {name!r}", value, False


def _captured(function: types.FunctionType) -> list[tuple[str, Any]]:
    """The variables a function uses from its closure and from its module's globals."""
    code = function.__code__
    captured = []
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        try:
            captured.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    module_globals = function.__globals__
    return captured + [(name, module_globals[name]) for name in code.co_names
                       if name in module_globals]


def _fields(obj: Any) -> dict[str, Any]:
    """What pickling ``obj`` would save of it by default: its ``__getstate__``."""
    try:
        state = obj.__getstate__()
    except Exception:  # objects that refuse to be pickled say so here
        return {}
    if isinstance(state, dict):
        return state
    if (isinstance(state, tuple) and len(state) == 2
            and all(isinstance(part, (dict, type(None))) for part in state)):
        return {**(state[0] or {}), **(state[1] or {})}  # (__dict__, __slots__ values)
    return {}
