"""Checkpoints of parameter-server variables, as safetensors files.

``Checkpoint(model=..., optimizer=...)`` finds every variable reachable from its objects
(attributes, dicts, lists) and names it by its path (``model/embedding``). A sharded variable
is saved as one logical tensor, so it restores into any number of shards, or into an
unsharded variable. Optimizer slots are saved beside their variable as
``<path>/.slots/<slot>``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import InvalidArgumentError, NotFoundError

_SLOTS = "/.slots/"


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


class Checkpoint:
    """Saves and restores the variables reachable from ``objects``."""

    def __init__(self, **objects: Any) -> None:
        if not objects:
            raise InvalidArgumentError("Checkpoint needs at least one object, e.g. model=...")
        self._objects = objects

    def _named(self) -> dict[str, Any]:
        seen: set[int] = set()
        named: dict[str, Any] = {}
        for name in sorted(self._objects):
            named.update(_variables(self._objects[name], name, seen))
        return named

    def write(self, file_prefix: str | os.PathLike[str]) -> str:
        """Write a checkpoint to ``<file_prefix>.safetensors``; returns that path."""
        tensors: dict[str, np.ndarray] = {}
        for path, variable in self._named().items():
            tensors[path] = _contiguous(variable.read_value())
            for slot, value in _slots(variable).items():
                tensors[f"{path}{_SLOTS}{slot}"] = _contiguous(value)
        target = f"{os.fspath(file_prefix)}.safetensors"
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        temporary = target + ".tmp"
        save_file(tensors, temporary, metadata={"format": "convoy-checkpoint-1"})
        os.replace(temporary, target)
        return target

    save = write

    def read(self, save_path: str | os.PathLike[str]) -> Checkpoint:
        """Restore every variable (and slot) from a checkpoint written by :meth:`write`."""
        path = os.fspath(save_path)
        if not path.endswith(".safetensors"):
            path += ".safetensors"
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
        return self

    restore = read


class CheckpointManager:
    """Numbered checkpoints in ``directory``, keeping the newest ``max_to_keep``."""

    def __init__(self, checkpoint: Checkpoint, directory: str | os.PathLike[str],
                 max_to_keep: int | None = 5, checkpoint_name: str = "ckpt") -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise InvalidArgumentError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.checkpoint = checkpoint
        self.directory = Path(directory)
        self.max_to_keep = max_to_keep
        self._name = checkpoint_name
        self._pattern = re.compile(rf"^{re.escape(checkpoint_name)}-(\d+)\.safetensors$")

    @property
    def checkpoints(self) -> list[str]:
        """Paths of the kept checkpoints, oldest first."""
        if not self.directory.exists():
            return []
        found = [(int(m[1]), str(self.directory / p.name)) for p in self.directory.iterdir()
                 if (m := self._pattern.match(p.name))]
        return [path for _, path in sorted(found)]

    @property
    def latest_checkpoint(self) -> str | None:
        kept = self.checkpoints
        return kept[-1] if kept else None

    def save(self, checkpoint_number: int | None = None) -> str:
        """Write the next checkpoint and delete the oldest beyond ``max_to_keep``."""
        if checkpoint_number is None:
            latest = self.latest_checkpoint
            checkpoint_number = 1 if latest is None else int(
                self._pattern.match(Path(latest).name)[1]) + 1  # type: ignore[index]
        path = self.checkpoint.write(self.directory / f"{self._name}-{checkpoint_number}")
        kept = self.checkpoints
        if self.max_to_keep is not None:
            for old in kept[:-self.max_to_keep]:
                os.remove(old)
        (self.directory / "checkpoint.json").write_text(json.dumps(
            {"latest": Path(path).name, "all": [Path(p).name for p in self.checkpoints]}))
        return path

    def restore_or_initialize(self) -> str | None:
        """Restore the latest checkpoint if there is one; returns its path or None."""
        latest = self.latest_checkpoint
        if latest is not None:
            self.checkpoint.read(latest)
        return latest
