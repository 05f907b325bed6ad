"""Splitting a pipeline's source, for dynamic sharding by the data service.

A pipeline's *source* is the op at the end of its spine (first inputs, followed upstream).
Sources made of numbered units are splittable: the elements of range and from_tensor_slices,
the file names of list_files, the files of a file reader. A *split* is a range ``[start,
stop)`` of units. :func:`read_splits` rebuilds a pipeline so that its source produces only
the units of the splits it is handed, in the order handed, from any split supplier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from convoy.data._op import Node, Op
from convoy.data._readers import FileReaderOp
from convoy.data._sources import IndexSource
from convoy.errors import UnimplementedError

#: ``supplier(repetition)`` yields the splits of one pass over the source.
SplitSupplier = Callable[[int], Iterator[tuple[int, int]]]


def spine(op: Op) -> Iterator[Op]:
    """``op`` and every op upstream of it along first inputs, ending at the source."""
    while True:
        yield op
        if not op.inputs:
            return
        op = op.inputs[0]


def source_units(op: Op) -> int:
    """How many splittable units the pipeline's source has, or -1 if it cannot be split."""
    source = list(spine(op))[-1]
    if isinstance(source, IndexSource):
        return source.num_elements()
    if isinstance(source, FileReaderOp):
        return len(source.files)
    return -1


def read_splits(op: Op, supplier: SplitSupplier) -> Op:
    """``op`` with its source replaced by one that reads the splits ``supplier`` gives."""
    if not op.inputs:
        if source_units(op) < 0:
            raise UnimplementedError(
                f"cannot split a pipeline whose source is {type(op).__name__[:-2]}; "
                f"DYNAMIC sharding needs range, from_tensor_slices, list_files or a file reader"
            )
        return _SplitReaderOp(op, supplier)
    return op.with_inputs((read_splits(op.inputs[0], supplier), *op.inputs[1:]))


class _SplitReaderOp(Op):
    """The units of ``source`` named by the supplied splits. Each new iterator is the next
    pass (repetition) over the source, as a ``repeat()`` downstream asks for."""

    def __init__(self, source: Op, supplier: SplitSupplier) -> None:
        self.source = source
        self.supplier = supplier
        self.passes = 0

    def iterator(self, state: Any, key: int) -> Node:
        if state is not None:
            raise UnimplementedError("iterators over dynamically sharded splits cannot be "
                                     "restored from a checkpoint")
        repetition = self.passes
        self.passes += 1
        splits = self.supplier(repetition)
        if isinstance(self.source, FileReaderOp):
            reader = self.source
            files = (reader.read(reader.files[i], 0) for a, b in splits for i in range(a, b))
            return _UnsavableNode(element for f in files for element, _ in f)
        element_at = self.source.element_at  # type: ignore[attr-defined]
        return _UnsavableNode(chain.from_iterable(map(element_at, range(a, b))
                                                  for a, b in splits))

    def static_spec(self) -> Any:
        return self.source.static_spec()


class _UnsavableNode(Node):
    __slots__ = ()

    def __init__(self, gen: Iterator[Any]) -> None:
        self.gen = gen

    def state_dict(self) -> Any:
        raise UnimplementedError("iterators over dynamically sharded splits cannot be saved")
