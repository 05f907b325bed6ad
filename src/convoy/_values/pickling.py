"""Pickling for other processes: the user's own modules travel by value, and errors name the
part that does not pickle.

cloudpickle pickles a function or class by reference (its module and name) whenever its module
is importable here; a worker then fails with ``ModuleNotFoundError`` when the module is the
user's own (next to the script, or in a directory added to ``sys.path``). :func:`dumps` sends
such modules by value instead, wherever they are met in the object (a function, the
functions, classes and modules it uses, the classes of objects it holds): see
:func:`sent_by_value`. convoy's own pickler applies the rule, so nothing is registered in
cloudpickle's (process-wide) registry and concurrent calls do not interfere.

cloudpickle's own errors say what kind of object failed ("cannot pickle '_thread.lock'
object"), not where it sits. :func:`dumps` then searches the object, depth first, for the
innermost part that fails: an object's field, an item of a list, tuple, set or dict, a
variable a function uses from its closure or its module's globals, or a global of a module
sent by value.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import site
import sys
import sysconfig
import threading
import types
import typing
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cloudpickle_internals

from convoy.errors import InvalidArgumentError

#: How much of a value's repr an error message shows.
_REPR_CHARS = 80


def dumps(obj: Any, what: str, name_of: Callable[[Any], str] | None = None) -> bytes:
    """``obj`` pickled with cloudpickle for another process, the modules
    :func:`sent_by_value` picks travelling by value.

    On failure raises :class:`InvalidArgumentError` that opens with ``what`` (say, "the
    dataset cannot be sent to the data service") and names the first part of ``obj`` that
    does not pickle. ``name_of`` names the objects whose fields the message mentions (by
    default, their type's name).
    """
    try:
        return _dumps(obj)
    except Exception as error:
        culprit = _culprit(obj, "", name_of or _type_name, set())
        raise InvalidArgumentError(
            f"{what}: {culprit}: {error}" if culprit else f"{what}: {error}"
        ) from None


#: The caches of pickles this process keeps to send again (see keep_sent_pickles_in).
_sent_caches: list[Any] = []


def keep_sent_pickles_in(cache: Any) -> None:
    """Have :func:`forget_sent_pickles` clear ``cache`` (anything with ``clear()``): a cache
    of pickles this process sends again and again (scheduled functions, placed modules)."""
    _sent_caches.append(cache)


def forget_sent_pickles() -> None:
    """Clear every cache :func:`keep_sent_pickles_in` names: what they pickled has changed
    under them (a parameter server the pickles name moved to a new address)."""
    for cache in _sent_caches:
        cache.clear()


class PickleCache:
    """Each object's (SHA-1 digest, pickle) from :func:`dumps`, made on its first use only:
    what a function or class captures is fixed when it is first sent. Weakly keyed; a value
    that cannot be weakly referenced is pickled every time. Thread-safe."""

    def __init__(self) -> None:
        self._cache: weakref.WeakKeyDictionary[Any, tuple[bytes, bytes]] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, obj: Any, what: str) -> tuple[bytes, bytes]:
        """``obj``'s (digest, pickle); ``what`` opens the error if it does not pickle."""
        with self._lock:
            try:
                cached = self._cache.get(obj)
            except TypeError:  # not weakly referenceable
                cached = None
        if cached is None:
            cached = digested(dumps(obj, what))
            with self._lock:
                try:
                    self._cache[obj] = cached
                except TypeError:
                    pass
        return cached

    def clear(self) -> None:
        """Forget every pickle made so far."""
        with self._lock:
            self._cache.clear()


def digested(data: bytes) -> tuple[bytes, bytes]:
    """(the SHA-1 digest of ``data``, ``data``): how a pickle sent again is recognised."""
    return hashlib.sha1(data).digest(), data


def sent_by_value(module: types.ModuleType) -> bool:
    """Whether :func:`dumps` sends ``module``'s code rather than its name.

    True for a module of Python source outside the standard library and installed packages:
    its file is not under the standard library, site-packages (dist-packages), the directory
    of an installed distribution or a directory a ``.pth`` file adds to the path, and its
    top-level package is neither convoy (which workers run) nor one an editable install
    provides. ``__main__`` is left to cloudpickle, which already sends its functions and
    classes by value.
    """
    file = getattr(module, "__file__", None)
    key = (getattr(module, "__name__", ""), file if isinstance(file, str) else None)
    decision = _decisions.get(key)
    if decision is None:
        decision = _decisions[key] = _decide(*key)
    return decision


# ----- the rule: which modules travel by value -------------------------------------------------

#: (module name, file) -> sent by value; filled once per module (concurrent fills agree).
_decisions: dict[tuple[str, str | None], bool] = {}


@dataclass(frozen=True)
class _Installed:
    """Where installed code lives: directories (each ending in a separator) and top-level
    packages that stay by reference wherever they are loaded from."""

    dirs: tuple[str, ...]
    packages: frozenset[str]


def _decide(name: str, file: str | None) -> bool:
    installed = _installed()
    if name == "__main__" or name.partition(".")[0] in installed.packages:
        return False
    if file is None or not file.endswith((".py", ".pyc")) or not os.path.isabs(file):
        return False  # built in, frozen, a namespace package, compiled or made up: by name
    path = os.path.realpath(file)
    # not a file: in a zip archive (eggs, a zipped standard library), where installed code is
    return os.path.isfile(path) and not path.startswith(installed.dirs)


@functools.cache
def _installed() -> _Installed:
    paths = sysconfig.get_paths()
    site_dirs = [*getattr(site, "getsitepackages", list)(),
                 *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    site_dirs += [entry for entry in sys.path
                  if os.path.basename(entry) in ("site-packages", "dist-packages")]
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    dirs.update(site_dirs, _pth_dirs(site_dirs))
    packages = {__name__.partition(".")[0]}
    for distribution in importlib.metadata.distributions():
        try:
            dirs.add(str(distribution.locate_file("")))
            if _editable(distribution):
                packages.update((distribution.read_text("top_level.txt") or "").split())
        except Exception:  # a broken installation record says nothing about our modules
            continue
    return _Installed(tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d),
                      frozenset(packages))


def _pth_dirs(site_dirs: list[str]) -> set[str]:
    """The directories the ``.pth`` files of ``site_dirs`` add to the path (as editable
    installs do)."""
    found = set()
    for site_dir in site_dirs:
        try:
            names = sorted(name for name in os.listdir(site_dir) if name.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(site_dir, name), encoding="utf-8") as file:
                    lines = file.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in (line.strip() for line in lines):
                if line and not line.startswith(("#", "import ", "import\t")):
                    path = os.path.join(site_dir, line)
                    if os.path.isdir(path):
                        found.add(path)
    return found


def _editable(distribution: importlib.metadata.Distribution) -> bool:
    try:
        url = json.loads(distribution.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return isinstance(url, dict) and bool(url.get("dir_info", {}).get("editable"))


# ----- the pickler -----------------------------------------------------------------------------

def _dumps(obj: Any) -> bytes:
    with io.BytesIO() as file:
        _Pickler(file).dump(obj)
        return file.getvalue()


class _Pickler(cloudpickle.Pickler):
    """cloudpickle's pickler, sending the functions, classes, type variables and module
    objects of the modules :func:`sent_by_value` picks by value (with cloudpickle's own
    reducers for what it sends by value: private names, which tests/test_pickling.py pins)."""

    def reducer_override(self, obj: Any) -> Any:
        if _by_reference.get(id(obj)) is obj:
            return NotImplemented
        if isinstance(obj, types.FunctionType):
            if _of_module_sent_by_value(obj):
                return self._dynamic_function_reduce(obj)
            return _remember_if_by_reference(obj, super().reducer_override(obj))
        elif isinstance(obj, type):
            if _of_module_sent_by_value(obj):
                return _cloudpickle_internals._dynamic_class_reduce(obj)
            return _remember_if_by_reference(obj, super().reducer_override(obj))
        elif isinstance(obj, types.ModuleType):
            if sent_by_value(obj):
                # the state apart, so a module its own functions refer back to is no cycle
                return (_new_module, (obj.__name__,), _module_state(obj), None, None,
                        _set_module_state)
        elif isinstance(obj, typing.TypeVar) and _of_module_sent_by_value(obj):
            return (_cloudpickle_internals._make_typevar,
                    _cloudpickle_internals._decompose_typevar(obj))
        return super().reducer_override(obj)


#: The functions and classes found to be pickled by reference (by name), by id: the same one
#: is pickled on every call that sends it (a scheduled function's arguments name the same
#: classes every step), and deciding it costs a module lookup. Held, so no id is reused.
_by_reference: dict[int, Any] = {}


def _remember_if_by_reference(obj: Any, reduced: Any) -> Any:
    if reduced is NotImplemented and len(_by_reference) < 100_000:
        _by_reference[id(obj)] = obj
    return reduced


def _of_module_sent_by_value(obj: Any) -> bool:
    name = getattr(obj, "__module__", None)
    module = sys.modules.get(name) if isinstance(name, str) else None
    return isinstance(module, types.ModuleType) and sent_by_value(module)


#: What a module sent by value leaves behind: how this process found and loaded it.
_LOCAL_TO_MODULE = ("__builtins__", "__loader__", "__spec__", "__cached__")


def _module_state(module: types.ModuleType) -> dict[str, Any]:
    return {name: value for name, value in vars(module).items()
            if name not in _LOCAL_TO_MODULE}


def _new_module(name: str) -> types.ModuleType:
    return types.ModuleType(name)


def _set_module_state(module: types.ModuleType, state: dict[str, Any]) -> None:
    module.__dict__.update(state)
    module.__dict__["__builtins__"] = builtins.__dict__


# ----- diagnostics: which part does not pickle -------------------------------------------------

def _type_name(obj: Any) -> str:
    return type(obj).__name__


def _pickles(value: Any) -> bool:
    try:
        _dumps(value)
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
    """(label, part, whether it is a variable) for each part of ``obj``."""
    if isinstance(obj, types.FunctionType):
        where = f"{label} ({obj.__qualname__})" if label else obj.__qualname__
        for name, value in _captured(obj):
            yield f"{where} captures {name!r}", value, True
    elif isinstance(obj, types.ModuleType):
        if sent_by_value(obj):
            where = f"{label}, a module" if label else f"module {obj.__name__!r}"
            for name, value in _module_state(obj).items():
                yield (f"{where} sent by value (it is not in an installed package), whose "
                       f"global {name!r}"), value, True
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for index, item in enumerate(obj):
            yield f"{label}[{index}]", item, False
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield f"{label}[{key!r}]", value, False
    elif not isinstance(obj, type):
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
