"""Checkpoints of parameter-server variables, as safetensors files.

``Checkpoint(model=..., optimizer=...)`` finds every variable reachable from its objects
(attributes, dicts, lists) and names it by its path (``model/embedding``). A sharded variable
is saved as one logical tensor, so it restores into any number of shards, or into an
unsharded variable. Optimizer slots are saved beside their variable as
``<path>/.slots/<slot>``. A module placed with ``cv.torch.place`` is saved as its variables,
by ``state_dict`` key (``model/fc.weight``), and its buffers. Any other object with
``state_dict()``/``load_state_dict()`` (a ``torch.nn.Module``, a torch optimizer, a dataset
iterator, a metric) is saved through them:
the arrays and tensors of its state as tensors under its path, the rest of its state (numbers,
strings, the structure) in the file's metadata.

``restore(path)`` returns a :class:`CheckpointLoadStatus` with TensorFlow's checks on how well
the checkpoint and the objects matched (``assert_consumed()``, ...). Values are restored into
the objects that exist when ``restore`` is called; unlike TensorFlow, nothing is kept to
restore objects created later, except optimizer slots, which are restored at once.

As in TensorFlow, ``save(prefix)`` numbers its files (``prefix-1``, ``prefix-2``, ...) with a
counter that is saved in the checkpoint, ``write(prefix)`` does not number, and a directory's
state file (``checkpoint.json``: the latest checkpoint and those a CheckpointManager keeps)
tells :func:`latest_checkpoint` which is the newest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import operator
import os
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load, load_file, save, save_file

from convoy._base import fs as _fs
from convoy.distribute import _operations as ops
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import DataLossError, InvalidArgumentError, NotFoundError
from convoy.train._states import StateEncoder, contiguous, decode_state, placed_state

log = logging.getLogger(__name__)

_SLOTS = "/.slots/"
_SUFFIX = ".safetensors"
_STATE = "checkpoint.json"
_FORMAT = "convoy-checkpoint-1"


def _has_state(value: Any) -> bool:
    return not isinstance(value, type) and callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


class _Graph:
    """What a checkpoint holds, found from its objects: the variables and the objects with a
    ``state_dict`` by path; an object reached by several paths is held once, under the first,
    and remembers the others (its aliases)."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.variables: dict[str, Any] = {}
        self.states: dict[str, Any] = {}
        self._first: dict[int, str] = {}
        self._by_path: dict[str, int] = {}
        self._aliases: dict[int, list[str]] = {}
        for name in sorted(objects):
            self._walk(objects[name], name)

    def _walk(self, value: Any, path: str) -> None:
        if value is None or isinstance(value, (str, bytes, int, float, complex, np.ndarray)):
            return
        key = id(value)
        if key in self._first:
            self._aliases.setdefault(key, []).append(path)
            return
        self._first[key] = path
        self._by_path[path] = key
        if isinstance(value, (Variable, ShardedVariable)):
            self.variables[path] = value
        elif callable(getattr(value, "_checkpoint_children", None)):  # a placed torch module
            for item, child in sorted(value._checkpoint_children().items()):
                self._walk(child, f"{path}/{item}")
        elif _has_state(value):
            self.states[path] = value
        elif isinstance(value, (dict, Checkpoint)):
            children = value._objects if isinstance(value, Checkpoint) else value
            for item in sorted(children, key=str):
                self._walk(children[item], f"{path}/{item}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self._walk(item, f"{path}/{i}")
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for item, child in vars(value).items():
                if not item.startswith("_"):
                    self._walk(child, f"{path}/{item}")

    def names(self, path: str) -> list[str]:
        """``path`` and the other paths to the same value through aliased objects."""
        names, pending = [path], [path]
        while pending and len(names) < _MAX_NAMES:
            current = pending.pop()
            ends = [i for i, c in enumerate(current) if c == "/"] + [len(current)]
            for end in ends:
                for alias in self._aliases.get(self._by_path.get(current[:end], -1), ()):
                    other = alias + current[end:]
                    if other not in names:
                        names.append(other)
                        pending.append(other)
        return names


#: The most other names of one value tried (aliases of aliases...).
_MAX_NAMES = 64


def _slots(variable: Variable | ShardedVariable) -> dict[str, np.ndarray]:
    shards = variable.variables if isinstance(variable, ShardedVariable) else [variable]
    per_shard = [v.handle.store.execute([ops.Slots(v.handle.key)])[0] for v in shards]
    names = set().union(*per_shard)
    return {name: np.concatenate([s[name] for s in per_shard]) if per_shard[0][name].ndim
            else per_shard[0][name] for name in names if all(name in s for s in per_shard)}


def _restore_slot(variable: Variable | ShardedVariable, slot: str, value: np.ndarray) -> None:
    if isinstance(variable, ShardedVariable):
        parts = np.split(value, variable._offsets[1:-1]) if value.ndim else \
            [value] * len(variable.variables)
        for shard, part in zip(variable.variables, parts):
            shard.handle.store.execute([ops.SetSlot(shard.handle.key, slot, part)])
    else:
        variable.handle.store.execute([ops.SetSlot(variable.handle.key, slot, value)])


class CheckpointLoadStatus:
    """How a checkpoint and the objects restored from it matched (TensorFlow's checks).

    Deleted without :meth:`expect_partial` while some checkpoint values found no object, or
    some object no value, it logs a warning naming them.
    """

    def __init__(self, path: str, unmatched: list[str], unused: list[str],
                 matched: int) -> None:
        self.path = path
        self._unmatched, self._unused, self._matched = unmatched, unused, matched
        self._partial = [False]
        if unmatched or unused:
            weakref.finalize(self, _warn_partial, path, unmatched, unused, self._partial)

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Raise AssertionError unless every object was restored and every value in the
        checkpoint was used; returns the status."""
        self.assert_existing_objects_matched()
        if self._unused:
            raise AssertionError(
                f"Unused values in checkpoint {self.path} (they exist in the checkpoint but "
                f"were not restored): {self._unused}")
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Raise AssertionError if a variable or object of the checkpoint has no value in the
        checkpoint file (values without an object are allowed); returns the status."""
        if self._unmatched:
            shown = self._unmatched[:10]
            raise AssertionError(
                f"Found {len(self._unmatched)} Python objects that were not bound to "
                f"checkpointed values in {self.path}, likely due to changes in the Python "
                f"program. Showing {len(shown)} of {len(self._unmatched)} unmatched objects: "
                f"{shown}")
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Raise AssertionError if nothing (not even the save counter) matched."""
        if self._matched:
            return self
        if self._unmatched:
            raise AssertionError(
                f"Nothing except the root object matched a checkpointed value in {self.path}. "
                f"Typically this means that the checkpoint does not match the Python program. "
                f"The following objects have no matching checkpointed value: "
                f"{self._unmatched}")
        raise AssertionError(f"Nothing to load from {self.path}: the Checkpoint holds no "
                             f"variables or objects with state yet.")

    def expect_partial(self) -> CheckpointLoadStatus:
        """Silence the warning about an incomplete restore; returns the status."""
        self._partial[0] = True
        return self


def _warn_partial(path: str, unmatched: list[str], unused: list[str],
                  partial: list[bool]) -> None:
    if partial[0]:
        return
    log.warning("a checkpoint restore from %s was partial; to silence this warning, call "
                "expect_partial() on the status restore() returned", path)
    for name in unused:
        log.warning("Value in checkpoint could not be found in the restored object: %s", name)
    for name in unmatched:
        log.warning("An object being restored could not be found in the checkpoint: %s", name)


class InitializationOnlyStatus:
    """The status of ``restore(None)``: nothing was restored, so every check fails."""

    _MESSAGE = "No checkpoint specified (save_path=None); nothing is being restored."

    def assert_consumed(self) -> InitializationOnlyStatus:
        raise AssertionError(self._MESSAGE)

    def assert_existing_objects_matched(self) -> InitializationOnlyStatus:
        raise AssertionError(self._MESSAGE)

    def assert_nontrivial_match(self) -> InitializationOnlyStatus:
        raise AssertionError(self._MESSAGE)

    def expect_partial(self) -> InitializationOnlyStatus:
        return self


def _file(path: str | os.PathLike[str]) -> str:
    """The checkpoint file of ``path``, given with or without its suffix."""
    path = os.fspath(path)
    return path if path.endswith(_SUFFIX) else path + _SUFFIX


def _load(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and metadata of the checkpoint file at ``path`` (a local path or URL)."""
    if not _fs.is_url(path):
        with safe_open(path, "np") as file:
            metadata = file.metadata() or {}
        return load_file(path), metadata
    data = _fs.read_bytes(path)
    if len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "little"):
        raise DataLossError(f"checkpoint {path} is truncated ({len(data)} bytes)")
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    return load(data), header.get("__metadata__") or {}


def _read_state(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state file of ``directory`` (its names joined to the directory), or None if
    there is none."""
    path = os.path.join(directory, _STATE)
    try:
        state = json.loads(_fs.read_bytes(path))
    except (FileNotFoundError, NotFoundError):
        return None
    except (OSError, ValueError) as error:
        raise DataLossError(f"checkpoint state file {path} cannot be read: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("latest"), str) or \
            not isinstance(state.get("all"), list):
        raise DataLossError(f"checkpoint state file {path} does not hold "
                            f'{{"latest": name, "all": [names]}}')
    return {"latest": os.path.join(directory, state["latest"]),
            "all": [os.path.join(directory, name) for name in state["all"]]}


def _write_state(directory: str | os.PathLike[str], latest: str, kept: list[str]) -> None:
    """Record ``latest`` and the ``kept`` (managed) checkpoints, relative to ``directory``."""
    def name(path: str) -> str:
        relative = os.path.relpath(path, directory)
        return path if relative.startswith(os.pardir) else relative

    state = {"latest": name(latest), "all": [name(p) for p in kept]}
    _fs.atomic_write(os.path.join(directory, _STATE), json.dumps(state).encode())


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint that ``save`` or a CheckpointManager wrote in ``checkpoint_dir``,
    or None if there is none (or its file is gone)."""
    state = _read_state(checkpoint_dir)
    if state is None:
        return None
    if not _fs.exists(state["latest"]):
        log.warning("the latest checkpoint in %s, %s, does not exist", checkpoint_dir,
                    state["latest"])
        return None
    return state["latest"]


def _numbers(prefix: str) -> list[int]:
    """The numbers of the existing checkpoint files ``<prefix>-<n>``."""
    directory, base = os.path.split(prefix)
    pattern = re.compile(rf"^{re.escape(base)}-(\d+){re.escape(_SUFFIX)}$")
    try:
        names = _fs.listdir(directory or ".")
    except (FileNotFoundError, NotFoundError):
        return []
    return [int(m[1]) for name in names if (m := pattern.match(name))]


def _restore_variable(name: str, variable: Variable | ShardedVariable,
                      tensors: dict[str, np.ndarray], used: set[str]) -> None:
    """Assign the checkpoint tensor ``name`` to ``variable``, and its slots."""
    value = tensors[name]
    if tuple(value.shape) != tuple(variable.shape):
        raise InvalidArgumentError(
            f"checkpoint tensor {name!r} has shape {list(value.shape)}, the variable "
            f"{list(variable.shape)}"
        )
    variable.assign(value)
    used.add(name)
    prefix = name + _SLOTS
    for key, slot_value in tensors.items():
        if key.startswith(prefix):
            _restore_slot(variable, key[len(prefix):], slot_value)
            used.add(key)


class Checkpoint:
    """Saves and restores the variables and objects with state reachable from ``objects``
    (also settable later as attributes: ``checkpoint.model = model``)."""

    def __init__(self, **objects: Any) -> None:
        self._objects = objects
        self._save_counter = 0

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            super().__setattr__(name, value)
        else:
            self._objects[name] = value

    @property
    def save_counter(self) -> int:
        """How many times ``save`` has numbered a checkpoint (restored with a checkpoint)."""
        return self._save_counter

    def write(self, file_prefix: str | os.PathLike[str]) -> str:
        """Write a checkpoint to ``<file_prefix>.safetensors`` (replacing one that is there);
        returns that path."""
        graph = _Graph(self._objects)
        tensors: dict[str, np.ndarray] = {}
        for path, variable in graph.variables.items():
            tensors[path] = contiguous(variable.read_value())
            for slot, value in _slots(variable).items():
                tensors[f"{path}{_SLOTS}{slot}"] = contiguous(value)
        states = {path: StateEncoder(path, tensors).encode(value.state_dict())
                  for path, value in graph.states.items()}
        metadata = {"format": _FORMAT, "objects": json.dumps(states)}
        if self._save_counter:  # as TensorFlow's, the counter exists once save() numbered
            metadata["save_counter"] = str(self._save_counter)
        target = _file(file_prefix)
        if os.path.dirname(target):
            _fs.makedirs(os.path.dirname(target))
        if _fs.is_url(target):  # one object: there whole or not at all
            _fs.atomic_write(target, save(tensors, metadata=metadata))
            return target
        temporary = target + ".tmp"
        save_file(tensors, temporary, metadata=metadata)
        os.replace(temporary, target)
        return target

    def _numbered_write(self, file_prefix: str, number: int | None) -> str:
        """Write ``<file_prefix>-<number>``, counting the save. Without a number, the next
        after the counter and after any ``<file_prefix>-<n>`` file there is: unlike
        TensorFlow, a fresh Checkpoint never overwrites an earlier run's files."""
        counter = self._save_counter
        if number is None:
            number = max([counter, *_numbers(file_prefix)]) + 1
            self._save_counter = number
        else:
            self._save_counter = counter + 1
        try:
            return self.write(f"{file_prefix}-{number}")
        except BaseException:
            self._save_counter = counter
            raise

    def save(self, file_prefix: str | os.PathLike[str]) -> str:
        """Write the next numbered checkpoint ``<file_prefix>-<n>.safetensors`` and record it
        as its directory's latest; returns its path."""
        path = self._numbered_write(os.fspath(file_prefix), None)
        _write_state(os.path.dirname(path) or ".", path, [])
        return path

    def read(self, save_path: str | os.PathLike[str] | None,
             ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restore every variable (and slot), object with state, and the save counter that
        the checkpoint at ``save_path`` (a path :meth:`write` or :meth:`save` returned, or
        its prefix) holds; returns the status of the restore. ``None`` (no checkpoint yet)
        restores nothing."""
        if save_path is None:
            return InitializationOnlyStatus()
        path = _file(save_path)
        if not _fs.exists(path):
            raise NotFoundError(f"no checkpoint at {path} (restore takes the path save() or "
                                f"write() returned, or that path without {_SUFFIX})")
        try:
            tensors, metadata = _load(path)
            states = json.loads(metadata.get("objects", "{}"))
        except (SafetensorError, OSError, ValueError) as error:
            raise DataLossError(f"checkpoint {path} cannot be read: {error}") from None
        graph = _Graph(self._objects)
        used: set[str] = set()
        unmatched: list[str] = []
        for path_, variable in graph.variables.items():
            name = next((n for n in graph.names(path_) if n in tensors and n not in states),
                        None)
            if name is None:
                unmatched.append(path_)
                continue
            _restore_variable(name, variable, tensors, used)
        for path_, value in graph.states.items():
            name = next((n for n in graph.names(path_) if n in states), None)
            if name is None:
                placed = placed_state(path_, tensors, states, used)
                if placed is None:
                    unmatched.append(path_)
                else:
                    value.load_state_dict(placed)
                continue
            value.load_state_dict(decode_state(states[name], tensors, used))
            used.add(name)
        counter = metadata.get("save_counter")
        if counter is not None:
            self._save_counter = int(counter)
        unused = sorted(set(tensors) - used) + sorted(set(states) - used)
        matched = len(graph.variables) + len(graph.states) - len(unmatched) + \
            (counter is not None)
        return CheckpointLoadStatus(path, unmatched, unused, matched)

    def restore(self, save_path: str | os.PathLike[str] | None,
                ) -> CheckpointLoadStatus | InitializationOnlyStatus:
        """Restore the checkpoint at ``save_path`` (see :meth:`read`); returns its status."""
        return self.read(save_path)


class CheckpointManager:
    """Numbered checkpoints ``<directory>/<checkpoint_name>-<n>``, keeping the newest
    ``max_to_keep`` of those it saved (None: all); its list survives restarts in the
    directory's state file."""

    def __init__(self, checkpoint: Checkpoint, directory: str | os.PathLike[str],
                 max_to_keep: int | None = 5, checkpoint_name: str = "ckpt",
                 init_fn: Callable[[], Any] | None = None) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise InvalidArgumentError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.checkpoint = checkpoint
        self.directory = os.fspath(directory)
        self.max_to_keep = max_to_keep
        self._prefix = os.path.join(self.directory, checkpoint_name)
        self._init_fn = init_fn
        state = _read_state(self.directory)
        self._latest = state["latest"] if state else None
        self._kept: list[str] = state["all"] if state else []

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the checkpoints this manager keeps, oldest first."""
        return list(self._kept)

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint in the directory, or None."""
        return self._latest

    def save(self, checkpoint_number: int | None = None) -> str:
        """Write the next checkpoint (numbered ``checkpoint_number`` if given, else by the
        checkpoint's save counter) and delete the oldest beyond ``max_to_keep``."""
        if checkpoint_number is not None:
            checkpoint_number = operator.index(checkpoint_number)
        path = self.checkpoint._numbered_write(self._prefix, checkpoint_number)
        self._kept = [p for p in self._kept if p != path] + [path]
        self._latest = path
        _write_state(self.directory, path, self._kept)  # before deleting: safe if stopped
        if self.max_to_keep is not None and len(self._kept) > self.max_to_keep:
            for old in self._kept[:-self.max_to_keep]:
                with contextlib.suppress(FileNotFoundError, NotFoundError):
                    _fs.remove(old)
            self._kept = self._kept[-self.max_to_keep:]
            _write_state(self.directory, path, self._kept)
        return path

    def restore_or_initialize(self) -> str | None:
        """Restore the latest checkpoint and return its path; with none, call ``init_fn``
        (if given) and return None."""
        if self._latest is not None:
            self.checkpoint.read(self._latest)
            return self._latest
        if self._init_fn is not None:
            self._init_fn()
        return None
