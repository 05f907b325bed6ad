"""snapshot: a pipeline computed once into files (TensorFlow's snapshot layout), read afterwards.

Under ``path`` a directory named by the pipeline's fingerprint holds ``snapshot.metadata``,
``dataset_spec.pb`` and ``<run_id>/<shard>.shard/<checkpoint>.snapshot`` files in the format
of :mod:`convoy.data._persistence._save`. An iteration that finds a finalized snapshot reads
it; any other starts a new run that writes each element as it yields it and finalizes the
snapshot when the input ends (a run that stops early leaves an unfinalized run behind, as
TensorFlow's does).

Exactly once: an iterator checkpoint closes the current files and writes later elements to the
next checkpoint files; restoring deletes what the run wrote after that checkpoint and goes on.
"""

from __future__ import annotations

import hashlib
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from convoy._base import fs as _fs
from convoy._values import nest
from convoy.data._core._op import Node, Op, SameSpecOp
from convoy.data._persistence import _load, _save
from convoy.errors import DataLossError, InvalidArgumentError


def check_snapshot_compression(compression: Any) -> str | None:
    """``"AUTO"`` means SNAPPY, as in TensorFlow."""
    return "SNAPPY" if compression == "AUTO" else _save.check_compression(compression)


class SnapshotOp(SameSpecOp):
    """``input`` computed once into ``path``/<fingerprint> and read from there afterwards."""

    def __init__(self, input: Op, path: Any, compression: Any,
                 reader_func: Callable[[Any], Any] | None,
                 shard_func: Callable[..., Any] | None) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgumentError(f"path must be a string, got {path!r}")
        for name, fn in (("reader_func", reader_func), ("shard_func", shard_func)):
            if fn is not None and not callable(fn):
                raise InvalidArgumentError(f"{name} must be callable, got {fn!r}")
        self.inputs = (input,)
        self.compression = check_snapshot_compression(compression)
        self.reader_func = reader_func
        self.shard_func = shard_func
        self.hash = fingerprint(input)
        self.directory = os.path.join(os.fspath(path), self.hash)
        if reader_func is not None:  # refused now rather than when a snapshot is read
            _load.reader_op(os.path.join(self.directory, "none"), None, (), reader_func)

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        if state is None:
            metadata = _save.read_metadata(self.directory)
            if metadata is not None and metadata.finalized:
                state = {"mode": "read", "run_id": metadata.run_id, "reader": None}
            else:
                state = {"mode": "write", "run_id": None, "checkpoint": 0, "count": 0,
                         "spec": None, "done": False, "input": None}
        if state["mode"] == "read":
            return _ReadNode(self, state["run_id"], state["reader"], key)
        return _WriteNode(self, state, key)


class _ReadNode(Node):
    __slots__ = ("run_id", "reader")

    def __init__(self, op: SnapshotOp, run_id: str, state: Any, key: int) -> None:
        run_dir = os.path.join(op.directory, run_id)
        # (a prefix without objects is no directory on an object store: an empty run's)
        if not _fs.is_url(run_dir) and not os.path.isdir(run_dir):
            raise DataLossError(f"the snapshot run {run_dir} does not exist any more")
        self.run_id = run_id
        structure = _save.read_spec(op.directory)
        self.reader = _load.reader_op(run_dir, op.compression, structure,
                                      op.reader_func).iterator(state, key)
        self.gen = self.reader.gen

    def state_dict(self) -> Any:
        return {"mode": "read", "run_id": self.run_id, "reader": self.reader.state_dict()}

    def close(self) -> None:
        self.reader.close()


class _WriteNode(Node):
    """Passes the input through, writing each element before yielding it."""

    __slots__ = ("op", "input", "run_id", "checkpoint", "count", "spec", "done", "writers",
                 "restored")

    def __init__(self, op: SnapshotOp, state: dict[str, Any], key: int) -> None:
        self.op = op
        self.input = op.input.iterator(state["input"], key)
        self.run_id: str | None = state["run_id"]
        self.checkpoint: int = state["checkpoint"]
        self.count: int = state["count"]
        self.spec = state["spec"]
        self.done: bool = state["done"]
        self.restored = self.run_id is not None
        self.writers: _save.ShardWriters | None = None
        self.gen = self._run()

    def _start(self) -> _save.ShardWriters:
        op = self.op
        if self.run_id is None:
            self.run_id = _save.new_run_id()
            _fs.makedirs(os.path.join(op.directory, self.run_id))
        else:  # restored: forget what the run wrote after the checkpoint
            _remove_checkpoints_from(os.path.join(op.directory, self.run_id), self.checkpoint)
        _save.write_metadata(op.directory, self.run_id, self.spec or (), 0, finalized=False,
                             graph_hash=op.hash)
        return _save.ShardWriters(os.path.join(op.directory, self.run_id), self.checkpoint,
                                  op.compression)

    def _run(self) -> Iterator[Any]:
        if self.done:
            return
        op = self.op
        writers = self.writers = self._start()
        shard_func = op.shard_func
        shards = os.cpu_count() or 1
        for element in self.input.gen:
            if self.spec is None:
                self.spec = nest.spec_from_value(element)
            shard = (self.count % shards if shard_func is None
                     else _save.shard_index(shard_func, element))
            writers.write(shard, element)
            self.count += 1
            yield element
        writers.close()
        # The spec of the first element: only its structure and dtypes are read back.
        _save.write_spec(op.directory, self.spec if self.spec is not None else ())
        _save.write_metadata(op.directory, self.run_id or "", self.spec or (), self.count,
                             finalized=True, graph_hash=op.hash)
        self.done = True

    def state_dict(self) -> Any:
        if self.writers is not None and not self.done:
            # The files written so far now hold exactly the elements yielded so far.
            self.writers.close()
            self.checkpoint += 1
            self.writers.checkpoint = self.checkpoint
        return {"mode": "write", "run_id": self.run_id, "checkpoint": self.checkpoint,
                "count": self.count, "spec": self.spec, "done": self.done,
                "input": self.input.state_dict()}

    def close(self) -> None:
        if self.writers is not None:
            self.writers.close()
        self.input.close()


def _remove_checkpoints_from(run_dir: str, checkpoint: int) -> None:
    for path in _fs.glob_below(run_dir, "*.shard", "*.snapshot"):
        name = os.path.basename(path)[:-len(".snapshot")]
        if name.isdigit() and int(name) >= checkpoint:
            _fs.remove(path)


# ----- the pipeline's fingerprint ----------------------------------------------------------------
def fingerprint(op: Op) -> str:
    """A stable hash (as TensorFlow prints its graph hash: a decimal uint64) of the pipeline.

    It is built from a structural description, not a pickle: each op's class and attributes,
    each Python function's code (bytecode, constants, names), defaults, closure and the
    globals it names, arrays' dtype, shape and bytes. Equal pipelines built in different
    processes share it; an op whose seed was drawn at random (``shuffle`` without a seed)
    gives a new one each time it is built.
    """
    digest = hashlib.sha256()
    _Describer(digest).describe(op)
    return str(int.from_bytes(digest.digest()[:8], "little"))


class _Describer:
    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.seen: dict[int, int] = {}

    def token(self, *parts: Any) -> None:
        for part in parts:
            self.digest.update(str(part).encode())
            self.digest.update(b"\0")

    def describe(self, value: Any) -> None:
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            self.token(type(value).__name__, repr(value))
            return
        if id(value) in self.seen:
            self.token("ref", self.seen[id(value)])
            return
        self.seen[id(value)] = len(self.seen)
        if isinstance(value, np.ndarray):
            self.token("ndarray", value.dtype.str, value.shape)
            if value.dtype.hasobject:
                for item in value.ravel().tolist():
                    self.describe(item)
            else:
                self.digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, np.generic):
            self.token("npscalar", value.dtype.str, repr(value.item()))
        elif isinstance(value, (list, tuple)):
            self.token(type(value).__qualname__, len(value))
            for item in value:
                self.describe(item)
        elif isinstance(value, dict):
            self.token("dict", len(value))
            for key in sorted(value, key=repr):
                self.describe(key)
                self.describe(value[key])
        elif isinstance(value, (set, frozenset)):
            self.token("set", sorted(repr(v) for v in value))
        elif isinstance(value, types.FunctionType):
            self.describe_function(value)
        elif isinstance(value, types.CodeType):
            self.describe_code(value)
        elif isinstance(value, types.ModuleType):
            self.token("module", value.__name__)
        elif isinstance(value, (types.BuiltinFunctionType, type)):
            self.token("named", getattr(value, "__module__", ""), value.__qualname__)
        elif isinstance(value, types.MethodType):
            self.token("method")
            self.describe(value.__func__)
            self.describe(value.__self__)
        else:
            self.describe_object(value)

    def describe_object(self, value: Any) -> None:
        self.token("object", type(value).__module__, type(value).__qualname__)
        attributes = getattr(value, "__dict__", None)
        if attributes is not None:
            # Underscored attributes of ops are caches (a memory cache's elements ...).
            self.describe({k: v for k, v in attributes.items()
                           if not (isinstance(value, Op) and k.startswith("_"))})
        slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ())]
        for slot in slots:
            if hasattr(value, slot):
                self.token(slot)
                self.describe(getattr(value, slot))
        if attributes is None and not slots:
            try:
                reduced = value.__reduce_ex__(4)
            except Exception:  # noqa: BLE001 - an object we cannot take apart: its type only
                return
            if isinstance(reduced, tuple):
                self.describe(reduced[1:3])

    def describe_function(self, fn: types.FunctionType) -> None:
        self.token("function", fn.__module__, fn.__qualname__)
        self.describe_code(fn.__code__)
        self.describe(fn.__defaults__)
        self.describe(fn.__kwdefaults__)
        self.describe([cell.cell_contents if _filled(cell) else None
                       for cell in fn.__closure__ or ()])
        names = _global_names(fn.__code__)
        self.describe({name: fn.__globals__[name] for name in sorted(names)
                       if name in fn.__globals__})

    def describe_code(self, code: types.CodeType) -> None:
        self.token("code", code.co_code.hex(), code.co_names, code.co_varnames,
                   code.co_argcount)
        self.describe(code.co_consts)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
