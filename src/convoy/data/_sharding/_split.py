"""Splitting a pipeline into units, for dynamic sharding by the data service.

Under DYNAMIC the dispatcher hands out *splits*: ranges ``[start, stop)`` of a pipeline's
*units*, numbered from 0 to :func:`split_units` for each pass. A unit is an element of range,
from_tensor_slices, from_tensors or list_files, a file of a file reader, or a whole
from_generator. Ops that combine datasets lay their inputs' units out in one numbering:

- ``concatenate``: the first input's units, then the second's;
- ``zip``, ``sample_from_datasets``, the datasets of ``choose_from_datasets``: in lock-step,
  unit ``u`` is unit ``u`` of every input that has one (their count is the largest input's);
  the choice dataset of ``choose_from_datasets`` is read whole by every worker, as in
  TensorFlow, so each worker makes its own choices;
- ``repeat(count)`` inside one of them: ``count`` copies of its input's units, one per epoch;
  an endless ``repeat()`` inside one of them copies them without end (:data:`ENDLESS_UNITS`
  in all), so the pass never ends and every worker goes on reading its own share of every
  input, as TensorFlow's repeated split providers do.

Every other transformation runs on each worker over the units that worker was handed (so
``take``, ``batch``, ``enumerate`` ... apply per worker, as in TensorFlow). A ``repeat`` that
is not inside a combining op repeats the whole pass: each of its epochs is a new repetition
with splits of its own. What cannot be split this way is refused by :func:`split_units`, with
an error naming the op, before a DYNAMIC job is created: nothing is ever read twice.

On a worker, :func:`read_splits` rebuilds the pipeline so that each source reads only the
units of the splits it is handed. All sources of a pass share its splits (one list per pass,
pulled from the dispatcher as the first reader needs them); each reads the part of every split
that falls in its own window of units. Splits come in increasing order, so a source whose
window lies wholly before a split has nothing more to read in this pass.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from convoy.data._core._op import INFINITE_CARDINALITY, Node, Op, SameSpecOp, derive_key
from convoy.data._ops._cache import CacheOp
from convoy.data._ops._combine import ChooseOp, ConcatenateOp, SampleOp, ZipOp
from convoy.data._ops._slicing import RepeatOp
from convoy.data._persistence._load import GrowingChunksOp
from convoy.data._persistence._snapshot import SnapshotOp
from convoy.data._sources._basic import GeneratorOp, IndexSource
from convoy.data._sources._file_reader_ops import FileReaderOp
from convoy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError

#: ``supplier(repetition)`` yields the splits of one pass over the pipeline's units.
SplitSupplier = Callable[[int], Iterator[tuple[int, int]]]

#: The units of a pass that never ends (an endless ``repeat`` inside a combining op): more than
#: any job reads, and within the dispatcher's int64 cursor.
ENDLESS_UNITS = 2 ** 62

_COMBINING = (ConcatenateOp, ZipOp, SampleOp, ChooseOp)
_PUBLIC_NAMES = {
    "TensorSlices": "from_tensor_slices", "Tensors": "from_tensors", "Generator":
    "from_generator", "TextLine": "TextLineDataset", "TFRecord": "TFRecordDataset",
    "Sample": "sample_from_datasets", "Choose": "choose_from_datasets",
    "DataService": "distribute", "_Options": "with_options", "GrowingChunks": "load",
}


def spine(op: Op) -> Iterator[Op]:
    """``op`` and every op upstream of it along first inputs, ending at a source."""
    while True:
        yield op
        if not op.inputs:
            return
        op = op.inputs[0]


def split_units(op: Op) -> int:
    """How many units DYNAMIC sharding hands out per pass of the pipeline ``op``.

    Raises InvalidArgumentError naming the first op (from the output back) that cannot be
    split, and why.
    """
    return _units(op, "")


def source_units(op: Op) -> int:
    """:func:`split_units`, or -1 when the pipeline cannot be split (what a dataset is
    registered with, before anyone asks for a sharding policy)."""
    try:
        return split_units(op)
    except InvalidArgumentError:
        return -1


def op_name(op: Op) -> str:
    """The name users know ``op`` by: ``zip``, ``take_while``, ``from_tensor_slices`` ..."""
    name = type(op).__name__.removesuffix("Op")
    return _PUBLIC_NAMES.get(name) or re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _refuse(op: Op, why: str, how: str = "") -> InvalidArgumentError:
    """The error for ``op``; ``how`` says which use of it is refused ("to a file")."""
    return InvalidArgumentError(f"DYNAMIC sharding cannot split `{op_name(op)}`{how}: {why}")


def _units(op: Op, within: str) -> int:
    """``within``: the combining op this one is an input of (directly or not), or ""."""
    if op.remote:
        raise _refuse(op, "it reads another data service job, which has no units to hand "
                          "out; read that job with OFF, or distribute the pipeline it reads")
    if isinstance(op, IndexSource):
        return op.num_elements()
    if isinstance(op, FileReaderOp):
        return len(op.files)
    if isinstance(op, GeneratorOp):
        return 1  # the whole generator, run by the worker handed unit 0
    if isinstance(op, ConcatenateOp):
        return min(ENDLESS_UNITS, sum(_units(i, "concatenate") for i in op.inputs))
    if isinstance(op, _COMBINING):
        return max(_units(i, op_name(op)) for i in _split_inputs(op))
    if isinstance(op, CacheOp) and op.filename:
        raise _refuse(op, "every worker would fill and replay the same file, holding only "
                          "the splits it was handed; cache in memory (filename='') or use OFF",
                      " to a file")
    if isinstance(op, GrowingChunksOp):
        raise _refuse(op, f"the distributed save at {op.path} is still being written, so its "
                          "chunks cannot be numbered yet; load it once it is done, or use OFF")
    if isinstance(op, SnapshotOp):
        raise _refuse(op, "every worker would write and then read the same snapshot "
                          "directory, holding only the splits it was handed; snapshot before "
                          "distributing, or use OFF")
    if isinstance(op, RepeatOp) and within:
        units = _units(op.input, within)
        # an endless repeat of nothing ends at once, as in TensorFlow
        return min(ENDLESS_UNITS, units * (op.count if op.count >= 0 else ENDLESS_UNITS))
    if not op.inputs and op.cardinality() == INFINITE_CARDINALITY:
        raise _refuse(op, "it is an infinite source, whose elements cannot be handed out in "
                          "splits; use OFF, or a finite source such as range")
    if not op.inputs:
        raise _refuse(op, "it is not a source whose elements can be numbered (range, "
                          "from_tensor_slices, from_tensors, list_files, from_generator, "
                          "the file readers)")
    if len(op.inputs) > 1:
        raise _refuse(op, "it combines datasets in a way DYNAMIC sharding does not know")
    return _units(op.input, within)


def _split_inputs(op: Op) -> tuple[Op, ...]:
    """The inputs of a combining op whose units are handed out (all but a choice dataset)."""
    return op.inputs[1:] if isinstance(op, ChooseOp) else op.inputs


# ----- reading the splits on a worker ------------------------------------------------------------

def read_splits(op: Op, supplier: SplitSupplier) -> Op:
    """``op`` rebuilt so that its sources read the units of the splits ``supplier`` gives.

    Each new iteration of its first source or combining op (from the output back) is the
    next pass, a repetition with splits of its own, as a ``repeat`` above it asks for.
    """
    split_units(op)
    return _rebuild_top(op, _Feed(supplier))


def _rebuild_top(op: Op, feed: _Feed) -> Op:
    if op.inputs and not isinstance(op, _COMBINING):
        return op.with_inputs((_rebuild_top(op.input, feed),))
    return _PassOp(_rebuild(op, feed, 0, ()), feed, split_units(op))


def _rebuild(op: Op, feed: _Feed, start: int, shifts: tuple[_Shift, ...]) -> Op:
    """``op`` (inside the pass) with each source reading its window of units from ``start``
    on, moved on by the current epoch of each enclosing ``repeat`` (``shifts``)."""
    if not op.inputs:
        return _ReaderOp(op, feed, start, shifts)
    if isinstance(op, ConcatenateOp):
        first, second = op.inputs
        return op.with_inputs((_rebuild(first, feed, start, shifts),
                               _rebuild(second, feed, start + _inner_units(first), shifts)))
    if isinstance(op, _COMBINING):
        split = _split_inputs(op)
        kept = op.inputs[:len(op.inputs) - len(split)]
        return op.with_inputs((*kept, *(_rebuild(i, feed, start, shifts) for i in split)))
    if isinstance(op, RepeatOp):  # inside a combining op
        shift = _Shift()
        return _EpochsOp(_rebuild(op.input, feed, start, (*shifts, shift)), op.count,
                         _inner_units(op.input), shift, feed, start, shifts)
    return op.with_inputs((_rebuild(op.input, feed, start, shifts),))


def _inner_units(op: Op) -> int:
    """The units of ``op``, an input of a combining op (already found splittable)."""
    return _units(op, "a combining op")


class _Feed:
    """The splits of the current pass, shared by every source of the pipeline."""

    def __init__(self, supplier: SplitSupplier) -> None:
        self.supplier = supplier
        self.passes = 0
        self.current = _Pass(iter(()), -1)

    def next_pass(self) -> None:
        self.current = _Pass(iter(self.supplier(self.passes)), self.passes)
        self.passes += 1


class _Pass:
    """The splits of one repetition, pulled from the supplier as readers need them."""

    def __init__(self, supplier: Iterator[tuple[int, int]], repetition: int) -> None:
        self.supplier = supplier
        self.repetition = repetition
        self.splits: list[tuple[int, int]] = []
        self.stops: list[int] = []  # the splits' stops, increasing as the splits come in order
        self.ended = False
        self.lock = threading.Lock()

    def window(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """The parts of this pass's splits within units ``[start, stop)``, shifted to count
        from ``start``."""
        index = bisect_right(self.stops, start)
        while start < stop:
            split = self._split(index)
            if split is None:
                return
            index += 1
            if split[0] >= stop:  # later splits all come after the window too
                return
            a, b = max(split[0], start), min(split[1], stop)
            if a < b:
                yield a - start, b - start

    def next_unit(self, unit: int) -> int | None:
        """The first unit from ``unit`` on in this worker's splits (pulling them as needed), or
        None when none is left."""
        index = bisect_right(self.stops, unit)
        split = self._split(index)
        return None if split is None else max(unit, split[0])

    def _split(self, index: int) -> tuple[int, int] | None:
        if index < len(self.splits):
            return self.splits[index]
        with self.lock:
            while index >= len(self.splits):
                split = None if self.ended else next(self.supplier, None)
                if split is None:
                    self.ended = True
                    return None
                self._check_in_order(split)
                self.splits.append(split)
                self.stops.append(split[1])
            return self.splits[index]

    def _check_in_order(self, split: tuple[int, int]) -> None:
        # Readers stop at the first split past their window, so a split that comes after a
        # later one could be missed: refuse it rather than lose units.
        if self.splits and split[0] < self.splits[-1][1]:
            raise FailedPreconditionError(
                f"split {list(split)} of repetition {self.repetition} came after the later "
                f"{list(self.splits[-1])}: this pipeline needs its splits in increasing order"
            )


class _Shift:
    """The current epoch's offset of a ``repeat`` inside a combining op."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0


class _PassOp(SameSpecOp):
    """Each iteration starts the next pass over the pipeline's units."""

    def __init__(self, input: Op, feed: _Feed, units: int) -> None:
        self.inputs = (input,)
        self.feed = feed
        self.units = units

    def reads_remote(self) -> bool:
        # A pass is empty on this worker when the others took all its units; a repeat()
        # above goes on to the next pass then (a worker behind catches up), as over a remote
        # source. Only a source without units is empty for everyone.
        return self.units > 0

    def iterator(self, state: Any, key: int) -> Node:
        _refuse_state(state)
        self.feed.next_pass()
        return self.input.iterator(None, key)


class _ReaderOp(Op):
    """The units of ``source`` that fall in its window of the current pass's splits."""

    def __init__(self, source: Op, feed: _Feed, start: int, shifts: tuple[_Shift, ...]) -> None:
        self.source = source
        self.feed = feed
        self.start = start
        self.shifts = shifts
        self.count = split_units(source)
        self.read = _unit_reader(source)

    def iterator(self, state: Any, key: int) -> Node:
        _refuse_state(state)
        start = self.start + sum(shift.offset for shift in self.shifts)
        ranges = self.feed.current.window(start, start + self.count)
        return _UnsavableNode(chain.from_iterable(self.read(a, b, key) for a, b in ranges))

    def static_spec(self) -> Any:
        return self.source.static_spec()


def _unit_reader(source: Op) -> Callable[[int, int, int], Iterator[Any]]:
    """``read(a, b, key)``: the elements of units ``[a, b)`` of ``source``."""
    if isinstance(source, IndexSource):
        return lambda a, b, key: map(source.element_at, range(a, b))
    if isinstance(source, FileReaderOp):
        files = source.files
        return lambda a, b, key: (element for i in range(a, b)
                                  for element, _ in source.read(files[i], 0))
    assert isinstance(source, GeneratorOp)  # split_units knows no other source
    return lambda a, b, key: source.iterator(None, key).gen


class _EpochsOp(SameSpecOp):
    """``repeat(count)`` inside a combining op (endless if ``count < 0``): epoch ``e`` reads
    the units ``e * stride`` further on. Epochs without units on this worker are skipped, and
    the repeat ends when this worker's splits do."""

    def __init__(self, input: Op, count: int, stride: int, shift: _Shift, feed: _Feed,
                 start: int, shifts: tuple[_Shift, ...]) -> None:
        self.inputs = (input,)
        self.count = count
        self.stride = stride
        self.shift = shift
        self.feed = feed
        self.start = start
        self.shifts = shifts

    def iterator(self, state: Any, key: int) -> Node:
        _refuse_state(state)
        return _UnsavableNode(self._epochs(key))

    def _epochs(self, key: int) -> Iterator[Any]:
        if self.stride == 0:
            return
        base = self.start + sum(shift.offset for shift in self.shifts)
        epoch = 0
        while self.count < 0 or epoch < self.count:
            unit = self.feed.current.next_unit(base + epoch * self.stride)
            if unit is None:
                return
            epoch = (unit - base) // self.stride
            if 0 <= self.count <= epoch:
                return
            self.shift.offset = epoch * self.stride
            node = self.input.iterator(None, derive_key(key, epoch))
            try:
                yield from node.gen
            finally:
                node.close()
            epoch += 1


def _refuse_state(state: Any) -> None:
    if state is not None:
        raise UnimplementedError("iterators over dynamically sharded splits cannot be "
                                 "restored from a checkpoint")


class _UnsavableNode(Node):
    __slots__ = ()

    def __init__(self, gen: Iterator[Any]) -> None:
        self.gen = gen

    def state_dict(self) -> Any:
        raise UnimplementedError("iterators over dynamically sharded splits cannot be saved")

    def close(self) -> None:
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()
