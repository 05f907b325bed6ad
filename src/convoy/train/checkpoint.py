"""Checkpoints of parameter-server variables, as safetensors files.

``Checkpoint(model=..., optimizer=...)`` finds every variable reachable from its objects
(attributes, dicts, lists) and names it by its path (``model/embedding``). A sharded variable
is saved as one logical tensor, so it restores into any number of shards, or into an
unsharded variable. Optimizer slots are saved beside their variable as
``<path>/.slots/<slot>``.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import DataLossError, InvalidArgumentError, NotFoundError

log = logging.getLogger(__name__)

_SLOTS = "/.slots/"
_SUFFIX = ".safetensors"
_STATE = "checkpoint.json"


def _variables(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, Any]]:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, (Variable, ShardedVariable)):
        yield path, value
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _variables(value[key], f"{path}/{key}", seen)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _variables(item, f"{path}/{i}", seen)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for key, item in vars(value).items():
            if not key.startswith("_"):
                yield from _variables(item, f"{path}/{key}", seen)


def _slots(variable: Variable | ShardedVariable) -> dict[str, np.ndarray]:
    shards = variable.variables if isinstance(variable, ShardedVariable) else [variable]
    per_shard = [v._store.execute([("slots", v._key)])[0] for v in shards]
    names = set().union(*per_shard)
    return {name: np.concatenate([s[name] for s in per_shard]) if per_shard[0][name].ndim
            else per_shard[0][name] for name in names if all(name in s for s in per_shard)}


def _contiguous(value: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns a scalar (e.g. a step counter) into shape (1,).
    return np.asarray(value, order="C")


def _restore_slot(variable: Variable | ShardedVariable, slot: str, value: np.ndarray) -> None:
    if isinstance(variable, ShardedVariable):
        parts = np.split(value, variable._offsets[1:-1]) if value.ndim else \
            [value] * len(variable.variables)
        for shard, part in zip(variable.variables, parts):
            shard._store.execute([("set_slot", shard._key, slot, part)])
    else:
        variable._store.execute([("set_slot", variable._key, slot, value)])


def _file(path: str | os.PathLike[str]) -> str:
    """The checkpoint file of ``path``, given with or without its suffix."""
    path = os.fspath(path)
    return path if path.endswith(_SUFFIX) else path + _SUFFIX


def _read_state(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The state file of ``directory`` (its names joined to the directory), or None if
    there is none."""
    path = os.path.join(directory, _STATE)
    try:
        with open(path) as file:
            state = json.load(file)
    except FileNotFoundError:
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

    target = os.path.join(directory, _STATE)
    temporary = target + ".tmp"
    with open(temporary, "w") as file:
        json.dump({"latest": name(latest), "all": [name(p) for p in kept]}, file)
    os.replace(temporary, target)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint that ``save`` or a CheckpointManager wrote in ``checkpoint_dir``,
    or None if there is none (or its file is gone)."""
    state = _read_state(checkpoint_dir)
    if state is None:
        return None
    if not os.path.exists(state["latest"]):
        log.warning("the latest checkpoint in %s, %s, does not exist", checkpoint_dir,
                    state["latest"])
        return None
    return state["latest"]


def _numbers(prefix: str) -> list[int]:
    """The numbers of the existing checkpoint files ``<prefix>-<n>``."""
    directory, base = os.path.split(prefix)
    pattern = re.compile(rf"^{re.escape(base)}-(\d+){re.escape(_SUFFIX)}$")
    try:
        names = os.listdir(directory or ".")
    except FileNotFoundError:
        return []
    return [int(m[1]) for name in names if (m := pattern.match(name))]


class Checkpoint:
    """Saves and restores the variables reachable from ``objects``."""

    def __init__(self, **objects: Any) -> None:
        self._objects = objects
        self._save_counter = 0

    @property
    def save_counter(self) -> int:
        """How many times ``save`` has numbered a checkpoint (restored with a checkpoint)."""
        return self._save_counter

    def _named(self) -> dict[str, Any]:
        seen: set[int] = set()
        named: dict[str, Any] = {}
        for name in sorted(self._objects):
            named.update(_variables(self._objects[name], name, seen))
        return named

    def write(self, file_prefix: str | os.PathLike[str]) -> str:
        """Write a checkpoint to ``<file_prefix>.safetensors`` (replacing one that is there);
        returns that path."""
        tensors: dict[str, np.ndarray] = {}
        for path, variable in self._named().items():
            tensors[path] = _contiguous(variable.read_value())
            for slot, value in _slots(variable).items():
                tensors[f"{path}{_SLOTS}{slot}"] = _contiguous(value)
        target = _file(file_prefix)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        temporary = target + ".tmp"
        save_file(tensors, temporary, metadata={"format": "convoy-checkpoint-1",
                                                "save_counter": str(self._save_counter)})
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

    def read(self, save_path: str | os.PathLike[str] | None) -> Checkpoint:
        """Restore every variable (and slot, and the save counter) from a checkpoint written
        by :meth:`write` or :meth:`save`; ``None`` (no checkpoint yet) restores nothing."""
        if save_path is None:
            return self
        path = _file(save_path)
        if not os.path.exists(path):
            raise NotFoundError(f"no checkpoint at {path}")
        tensors = load_file(path)
        for name, variable in self._named().items():
            if name not in tensors:
                raise NotFoundError(f"checkpoint {path} has no tensor {name!r}; it has "
                                    f"{sorted(k for k in tensors if _SLOTS not in k)}")
            value = tensors[name]
            if tuple(value.shape) != tuple(variable.shape):
                raise InvalidArgumentError(
                    f"checkpoint tensor {name!r} has shape {list(value.shape)}, the variable "
                    f"{list(variable.shape)}"
                )
            variable.assign(value)
            prefix = name + _SLOTS
            for key, slot_value in tensors.items():
                if key.startswith(prefix):
                    _restore_slot(variable, key[len(prefix):], slot_value)
        with safe_open(path, "np") as file:
            counter = (file.metadata() or {}).get("save_counter")
        if counter is not None:
            self._save_counter = int(counter)
        return self

    restore = read


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
                with contextlib.suppress(FileNotFoundError):
                    os.remove(old)
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
