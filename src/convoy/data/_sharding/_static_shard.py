"""Static sharding: a pipeline rewritten to produce one worker's shard of it.

Under the data service's static policies each worker of a fixed list runs the pipeline
rewritten for its ``(num_workers, worker_index)``, as TensorFlow's auto-shard rewrites it:

- ``FILE``: every source of files keeps the files ``worker_index, worker_index +
  num_workers, ...`` of its list (file ``i`` goes to worker ``i % num_workers``), so each
  worker reads a fixed set of whole files. A source of files is ``list_files`` (its sorted
  names: shuffling then reorders the worker's own files only), a file reader over a list of
  files, or ``from_tensor_slices`` of file names read by an ``interleave``/``flat_map``.
  Combining ops (``zip``, ``concatenate`` ...) shard each of their inputs. Fewer files than
  workers is an error, and so is a source that is not one of files or a ``cache`` to a file
  above the files (the workers of one host would each write their shard to the same file).
- ``DATA``: the whole pipeline runs and its output is ``shard(num_workers, worker_index)``.
- ``FILE_OR_DATA``: FILE where it can shard the files, else DATA.
- ``HINT``: each ``shard(SHARD_HINT, SHARD_HINT)`` becomes ``shard(num_workers,
  worker_index)``; an explicit ``shard(n, i)`` is left as it is, and a ``cache`` to a file
  above a placeholder is refused. Placeholders inside the function of an
  ``interleave``/``flat_map`` are not seen (they fail when run).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from convoy.data._core._op import Op
from convoy.data._ops._cache import CacheOp
from convoy.data._ops._interleave import InterleaveOp
from convoy.data._ops._slicing import ShardOp
from convoy.data._sharding._split import op_name
from convoy.data._sources._basic import ListFilesOp, TensorSlicesOp
from convoy.data._sources._file_reader_ops import FileReaderOp
from convoy.errors import InvalidArgumentError

_FILE_SOURCES = ("list_files, a file reader (TFRecordDataset, TextLineDataset) over a list of "
                 "files, or from_tensor_slices of file names read by interleave or flat_map")


class NotShardableByFileError(InvalidArgumentError):
    """FILE sharding found a source that is not one of files, or a file cache above one."""


#: A static policy's rewrite: ``(op, num_workers, worker_index)`` to that worker's shard.
Rewrite = Callable[[Op, int, int], Op]


def shard_statically(op: Op, rewrite: Rewrite, num_workers: int, worker_index: int) -> Op:
    """``op`` rewritten by ``rewrite`` (:func:`shard_files`, :func:`shard_data`,
    :func:`shard_files_or_data` or :func:`fill_shard_hints`) to produce worker
    ``worker_index``'s shard; raises InvalidArgumentError naming what cannot be sharded."""
    if not 0 <= worker_index < num_workers:
        raise InvalidArgumentError(
            f"worker_index must be in [0, num_workers={num_workers}), got {worker_index}")
    return rewrite(op, num_workers, worker_index)


def shard_files(op: Op, num_workers: int, worker_index: int) -> Op:
    """FILE: each source of files keeps every ``num_workers``-th file from ``worker_index``."""
    return _shard_files(op, num_workers, worker_index, in_interleave=False)


def shard_data(op: Op, num_workers: int, worker_index: int) -> Op:
    """DATA: the output's elements ``worker_index, worker_index + num_workers, ...``."""
    return ShardOp(op, num_workers, worker_index)


def shard_files_or_data(op: Op, num_workers: int, worker_index: int) -> Op:
    """FILE_OR_DATA: FILE if every source of ``op`` is one of files, else DATA."""
    try:
        return shard_files(op, num_workers, worker_index)
    except NotShardableByFileError:
        return shard_data(op, num_workers, worker_index)


def fill_shard_hints(op: Op, num_workers: int, worker_index: int) -> Op:
    """HINT: ``shard(SHARD_HINT, SHARD_HINT)`` becomes ``shard(num_workers, worker_index)``."""
    if not op.inputs:
        return op
    inputs = tuple(fill_shard_hints(i, num_workers, worker_index) for i in op.inputs)
    if isinstance(op, ShardOp) and op.is_hint:
        return ShardOp(inputs[0], num_workers, worker_index)
    if _caches_to_file(op) and _has_hint(op.input):
        raise InvalidArgumentError(_CACHE_REFUSAL.format(policy="HINT"))
    return op.with_inputs(inputs)


def check_file_sources(op: Op) -> None:
    """Raise :class:`NotShardableByFileError` naming what in ``op`` FILE sharding cannot shard
    (what ``distribute`` checks before anything runs)."""
    shard_files(op, 1, 0)


def _shard_files(op: Op, num_workers: int, worker_index: int, in_interleave: bool) -> Op:
    files = _file_list(op, in_interleave)
    if files is not None:
        if len(files) < num_workers:
            raise InvalidArgumentError(
                f"FILE sharding needs at least as many files as workers: `{op_name(op)}` has "
                f"{len(files)} files, not enough for the required {num_workers} "
                f"shards/workers; use fewer workers, more files, or DATA sharding"
            )
        return _keep_files(op, slice(worker_index, None, num_workers))
    if not op.inputs:
        raise NotShardableByFileError(
            f"FILE sharding found no files to shard: `{op_name(op)}` is not a source of "
            f"files ({_FILE_SOURCES}); use DATA or FILE_OR_DATA sharding"
        )
    if _caches_to_file(op):
        raise NotShardableByFileError(_CACHE_REFUSAL.format(policy="FILE"))
    in_interleave = in_interleave or isinstance(op, InterleaveOp)
    return op.with_inputs(tuple(_shard_files(i, num_workers, worker_index, in_interleave)
                                for i in op.inputs))


_CACHE_REFUSAL = ("{policy} sharding cannot shard the input of `cache` to a file: every worker "
                  "on a host would write its own shard to the same file, and read another's "
                  "back; cache in memory (filename=''), or cache after the sharding")


def _caches_to_file(op: Op) -> bool:
    return isinstance(op, CacheOp) and bool(op.filename)


def _has_hint(op: Op) -> bool:
    return (isinstance(op, ShardOp) and op.is_hint) or any(map(_has_hint, op.inputs))


def _file_list(op: Op, in_interleave: bool) -> list[Any] | np.ndarray | None:
    """The files of ``op`` if it is a source of files, else None."""
    if isinstance(op, (ListFilesOp, FileReaderOp)):
        return op.files
    if isinstance(op, TensorSlicesOp) and in_interleave and op.single:
        names = op.leaves[0]
        if isinstance(names, np.ndarray) and names.ndim == 1 and names.dtype.kind in "OSU":
            return names
    return None


def _keep_files(source: Op, keep: slice) -> Op:
    """A copy of the file source ``source`` holding only the files ``keep`` selects."""
    if isinstance(source, TensorSlicesOp):
        return TensorSlicesOp(source.leaves[0][keep])
    clone = copy.copy(source)
    clone.files = source.files[keep]  # type: ignore[attr-defined]
    return clone
