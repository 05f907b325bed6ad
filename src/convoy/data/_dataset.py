"""The public face of local pipelines: :class:`Dataset`, whose methods chain ops (each op in
a module of its own)."""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from convoy import _check as check
from convoy import nest
from convoy.data._batch import BatchOp, PaddedBatchOp, UnbatchOp
from convoy.data._cache import CacheOp
from convoy.data._combine import ChooseOp, ConcatenateOp, SampleOp, ZipOp
from convoy.data._interleave import InterleaveOp
from convoy.data._iterator import DatasetIterator
from convoy.data._map import FilterOp, MapOp
from convoy.data._op import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    SHARD_HINT,
    UNKNOWN_CARDINALITY,
    Node,
    Op,
    derive_key,
)
from convoy.data._prefetch import PrefetchOp
from convoy.data._shuffle import ShuffleOp
from convoy.data._slicing import EnumerateOp, RepeatOp, ShardOp, SkipOp, TakeOp, TakeWhileOp
from convoy.data._sources import GeneratorOp, ListFilesOp, RangeOp, TensorSlicesOp, TensorsOp
from convoy.data._split import spine
from convoy.errors import FailedPreconditionError, InvalidArgumentError


@dataclasses.dataclass
class Options:
    """Settings that apply to a whole pipeline (merged along it, later ones win).

    ``deterministic``: the default for ``map``/``interleave`` calls that leave theirs as None.
    ``auto_shard_policy``: how the data service's HINT/FILE/DATA policies may shard the input.
    """

    deterministic: bool | None = None
    auto_shard_policy: str | None = None

    def merge(self, other: Options) -> Options:
        fields = dataclasses.fields(self)
        return Options(**{f.name: getattr(other, f.name) if getattr(other, f.name) is not None
                          else getattr(self, f.name) for f in fields})


class _OptionsOp(Op):
    def __init__(self, input: Op, options: Options) -> None:
        self.inputs = (input,)
        self.options = options

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        return self.input.iterator(state, key)

    def static_spec(self) -> Any:
        return self.input.static_spec()


def _is_hint(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and value == SHARD_HINT


def _as_op(dataset: Any, argument: str) -> Op:
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(
            f"{argument} must be a convoy.data.Dataset, got {type(dataset).__name__}"
        )
    return dataset._op


class Dataset:
    """A pipeline of elements, built from sources and transformations, read by iteration.

    Datasets are immutable descriptions: each transformation returns a new one, nothing runs
    until iteration, and the whole graph (with its Python functions) pickles with cloudpickle.
    """

    def __init__(self, op: Op) -> None:
        self._op = op
        self._iterations = 0
        self._spec_cache: Any = None

    # ----- sources -----------------------------------------------------------------------
    @staticmethod
    def range(*args: int) -> Dataset:
        """Integers like Python's ``range(stop)``, ``range(start, stop[, step])``."""
        if not 1 <= len(args) <= 3:
            raise InvalidArgumentError(f"range takes 1 to 3 arguments, got {len(args)}")
        padded = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
        start, stop, step = (check.integer(name, value)
                             for name, value in zip(("start", "stop", "step"), padded))
        if step == 0:
            raise InvalidArgumentError("range: step must not be zero")
        return Dataset(RangeOp(start, stop, step))

    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """One element per row (first-axis slice) of ``tensors``, a structure of arrays."""
        return Dataset(TensorSlicesOp(tensors))

    @staticmethod
    def from_tensors(tensors: Any) -> Dataset:
        """A dataset of exactly one element, ``tensors``."""
        return Dataset(TensorsOp(tensors))

    @staticmethod
    def from_generator(generator: Callable[..., Iterable[Any]], output_types: Any = None,
                       output_shapes: Any = None, args: Sequence[Any] | None = None,
                       output_signature: Any = None) -> Dataset:
        """Elements from ``generator(*args)``, each checked against ``output_signature``."""
        check.function("generator", generator)
        if output_signature is None:
            if output_types is None:
                raise InvalidArgumentError(
                    "from_generator needs output_signature (a structure of TensorSpec), "
                    "or output_types and optionally output_shapes"
                )
            types = nest.flatten(output_types)
            shapes = [None] * len(types)
            if output_shapes is not None:  # a shape is itself a list or tuple: flatten up to it
                try:
                    shapes = nest.flatten_up_to(output_types, output_shapes)
                except InvalidArgumentError as error:
                    raise InvalidArgumentError(
                        f"output_shapes must have the structure of output_types: {error}"
                    ) from None
            output_signature = nest.pack_sequence_as(
                output_types, [nest.TensorSpec(s, t) for t, s in zip(types, shapes)])
        for spec in nest.flatten(output_signature):
            if not isinstance(spec, nest.TensorSpec):
                raise InvalidArgumentError(
                    f"output_signature must be a structure of TensorSpec, found {spec!r}"
                )
        return Dataset(GeneratorOp(generator, output_signature, tuple(args or ())))

    @staticmethod
    def list_files(file_pattern: str | Sequence[str], shuffle: bool | None = None,
                   seed: int | None = None) -> Dataset:
        """File names (as bytes) matching glob pattern(s); shuffled unless ``shuffle=False``."""
        single = isinstance(file_pattern, (str, os.PathLike))
        patterns: list[Any] = (
            [file_pattern] if single or not isinstance(file_pattern, (list, tuple))
            else list(file_pattern))
        for pattern in patterns:
            if not isinstance(pattern, (str, os.PathLike)):
                raise InvalidArgumentError(
                    f"file_pattern must be a string or a list of strings, got {pattern!r}"
                )
        shuffle = True if shuffle is None else check.boolean("shuffle", shuffle)
        return Dataset(ListFilesOp([os.fspath(p) for p in patterns], shuffle,
                                   check.optional_integer("seed", seed)))

    @staticmethod
    def zip(*datasets: Any) -> Dataset:
        """Tuples (or the given structure) of one element from each dataset, in lockstep."""
        structure = datasets[0] if len(datasets) == 1 else datasets
        if isinstance(structure, Dataset) or not nest.is_nested(structure) or not structure:
            raise InvalidArgumentError(
                "zip needs several datasets, or one tuple/dict of datasets, got "
                f"{datasets!r}"
            )
        leaves = nest.flatten(structure)
        ops = tuple(_as_op(d, "datasets") for d in leaves)
        return Dataset(ZipOp(ops, structure))

    @staticmethod
    def sample_from_datasets(datasets: Sequence[Dataset], weights: Sequence[float] | None = None,
                             seed: int | None = None,
                             stop_on_empty_dataset: bool = False) -> Dataset:
        """Each element drawn from a randomly chosen dataset, with probabilities ``weights``."""
        ops = tuple(_as_op(d, "datasets") for d in datasets)
        if not ops:
            raise InvalidArgumentError("sample_from_datasets needs at least one dataset")
        if weights is None:
            weights = [1.0] * len(ops)
        weights = [float(w) for w in weights]
        if len(weights) != len(ops) or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise InvalidArgumentError(
                f"weights must be {len(ops)} non-negative numbers with a positive sum, "
                f"got {weights}"
            )
        return Dataset(SampleOp(ops, weights, check.optional_integer("seed", seed),
                                check.boolean("stop_on_empty_dataset", stop_on_empty_dataset)))

    @staticmethod
    def choose_from_datasets(datasets: Sequence[Dataset], choice_dataset: Dataset,
                             stop_on_empty_dataset: bool = True) -> Dataset:
        """Element ``k`` taken from ``datasets[c]``, where ``c`` is element ``k`` of
        ``choice_dataset``."""
        ops = tuple(_as_op(d, "datasets") for d in datasets)
        if not ops:
            raise InvalidArgumentError("choose_from_datasets needs at least one dataset")
        return Dataset(ChooseOp(_as_op(choice_dataset, "choice_dataset"), ops,
                                check.boolean("stop_on_empty_dataset", stop_on_empty_dataset)))

    # ----- transformations ---------------------------------------------------------------
    def map(self, map_func: Callable[..., Any], num_parallel_calls: int | None = None,
            deterministic: bool | None = None, name: str | None = None) -> Dataset:
        """``map_func`` applied to each element (tuples are unpacked into arguments)."""
        check.function("map_func", map_func)
        parallel = check.optional_integer("num_parallel_calls", num_parallel_calls, 1,
                                          allowed=(AUTOTUNE,))
        return self._then(MapOp(self._op, map_func, parallel,
                                check.optional_boolean("deterministic", deterministic)))

    def filter(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """The elements for which ``predicate`` is true."""
        return self._then(FilterOp(self._op, check.function("predicate", predicate)))

    def flat_map(self, map_func: Callable[..., Dataset], name: str | None = None) -> Dataset:
        """The elements of ``map_func(element)`` for each element, one dataset after another."""
        return self.interleave(map_func, cycle_length=1, block_length=1)

    def interleave(self, map_func: Callable[..., Dataset], cycle_length: int | None = None,
                   block_length: int | None = None, num_parallel_calls: int | None = None,
                   deterministic: bool | None = None, name: str | None = None) -> Dataset:
        """Round-robin over the datasets ``map_func`` makes, ``cycle_length`` open at once."""
        check.function("map_func", map_func)
        cycle = check.optional_integer("cycle_length", cycle_length, 1, allowed=(AUTOTUNE,))
        if cycle is None or cycle == AUTOTUNE:
            cycle = os.cpu_count() or 1
        block = check.optional_integer("block_length", block_length, 1) or 1
        parallel = check.optional_integer("num_parallel_calls", num_parallel_calls, 1,
                                          allowed=(AUTOTUNE,))
        check.optional_boolean("deterministic", deterministic)

        def make_op(element: Any) -> Op:
            result = map_func(*element) if type(element) is tuple else map_func(element)
            return _as_op(result, "the value returned by interleave's map_func")

        return self._then(InterleaveOp(self._op, make_op, cycle, block, parallel is not None))

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_calls: int | None = None, deterministic: bool | None = None,
              name: str | None = None) -> Dataset:
        """Consecutive elements stacked into batches of ``batch_size`` (the last may be short)."""
        size = check.integer("batch_size", batch_size, 1)
        check.optional_integer("num_parallel_calls", num_parallel_calls, 1, allowed=(AUTOTUNE,))
        return self._then(BatchOp(self._op, size,
                                  check.boolean("drop_remainder", drop_remainder)))

    def padded_batch(self, batch_size: int, padded_shapes: Any = None,
                     padding_values: Any = None, drop_remainder: bool = False,
                     name: str | None = None) -> Dataset:
        """Like batch, padding each component to ``padded_shapes`` (None: the batch maximum)."""
        size = check.integer("batch_size", batch_size, 1)
        return self._then(PaddedBatchOp(self._op, size,
                                        check.boolean("drop_remainder", drop_remainder),
                                        padded_shapes, padding_values))

    def unbatch(self, name: str | None = None) -> Dataset:
        """Each row of each element as an element of its own."""
        return self._then(UnbatchOp(self._op))

    def rebatch(self, batch_size: int, drop_remainder: bool = False,
                name: str | None = None) -> Dataset:
        """The same elements regrouped into batches of ``batch_size``."""
        return self.unbatch().batch(batch_size, drop_remainder)

    def shuffle(self, buffer_size: int, seed: int | None = None,
                reshuffle_each_iteration: bool = True, name: str | None = None) -> Dataset:
        """Elements in random order, drawn from a buffer of ``buffer_size``."""
        size = check.integer("buffer_size", buffer_size, 1)
        return self._then(ShuffleOp(self._op, size, check.optional_integer("seed", seed),
                                    check.boolean("reshuffle_each_iteration",
                                                  reshuffle_each_iteration)))

    def repeat(self, count: int | None = None, name: str | None = None) -> Dataset:
        """The dataset ``count`` times (forever if None or -1); each pass is a new iteration."""
        count = -1 if count is None else check.integer("count", count, 0, allowed=(-1,))
        return self._then(RepeatOp(self._op, count))

    def take(self, count: int, name: str | None = None) -> Dataset:
        """The first ``count`` elements (all if -1)."""
        return self._then(TakeOp(self._op, check.integer("count", count, 0, allowed=(-1,))))

    def skip(self, count: int, name: str | None = None) -> Dataset:
        """All but the first ``count`` elements (none if -1)."""
        return self._then(SkipOp(self._op, check.integer("count", count, 0, allowed=(-1,))))

    def take_while(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """Elements up to (not including) the first for which ``predicate`` is false."""
        return self._then(TakeWhileOp(self._op, check.function("predicate", predicate)))

    def shard(self, num_shards: int, index: int, name: str | None = None) -> Dataset:
        """Every ``num_shards``-th element, starting with element ``index``.

        ``shard(SHARD_HINT, SHARD_HINT)`` is a placeholder that the data service's HINT
        sharding policy fills in with ``(number of workers, worker index)``.
        """
        if _is_hint(num_shards) and _is_hint(index):
            return self._then(ShardOp(self._op, SHARD_HINT, SHARD_HINT))
        shards = check.integer("num_shards", num_shards, 1)
        index = check.integer("index", index, 0)
        if index >= shards:
            raise InvalidArgumentError(
                f"index must be less than num_shards ({shards}), got {index}"
            )
        return self._then(ShardOp(self._op, shards, index))

    def enumerate(self, start: int = 0, name: str | None = None) -> Dataset:
        """``(i, element)`` pairs counting from ``start``."""
        return self._then(EnumerateOp(self._op, check.integer("start", start)))

    def concatenate(self, dataset: Dataset, name: str | None = None) -> Dataset:
        """This dataset's elements followed by ``dataset``'s."""
        return self._then(ConcatenateOp(self._op, _as_op(dataset, "dataset")))

    def prefetch(self, buffer_size: int, name: str | None = None) -> Dataset:
        """Elements produced ahead on a background thread, up to ``buffer_size`` of them."""
        size = check.integer("buffer_size", buffer_size, 0, allowed=(AUTOTUNE,))
        return self._then(PrefetchOp(self._op, 8 if size == AUTOTUNE else size))

    def cache(self, filename: str = "", name: str | None = None) -> Dataset:
        """Elements recorded on the first complete pass (in memory, or in ``filename``)."""
        if isinstance(filename, os.PathLike):
            filename = os.fspath(filename)
        filename = check.string("filename", filename, allow_empty=True)
        return self._then(CacheOp(self._op, filename))

    def apply(self, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
        """``transformation_func(self)``, for chaining reusable transformations."""
        result = check.function("transformation_func", transformation_func)(self)
        _as_op(result, "the value returned by transformation_func")
        return result

    def with_options(self, options: Options, name: str | None = None) -> Dataset:
        """The same dataset with ``options`` merged over those set upstream."""
        if not isinstance(options, Options):
            raise InvalidArgumentError(
                f"options must be convoy.data.Options, got {type(options).__name__}"
            )
        return self._then(_OptionsOp(self._op, options))

    def options(self) -> Options:
        """The options in effect, merged from every ``with_options`` in the pipeline."""
        merged = Options()
        for op in reversed(list(spine(self._op))):
            if isinstance(op, _OptionsOp):
                merged = merged.merge(op.options)
        return merged

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """Fold every element into a state with ``reduce_func(state, element)``."""
        state = initial_state
        for element in self:
            state = reduce_func(state, element)
        return state

    # ----- inspection ----------------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """A structure of :class:`TensorSpec` describing each element.

        Known without running anything for sources and most shape-preserving ops; after a
        Python function (map, flat_map ...) it is read off the first element.
        """
        if self._spec_cache is None:
            spec = self._op.static_spec()
            if spec is None:
                first = next(iter(self), None)
                if first is None:
                    raise FailedPreconditionError(
                        "element_spec: the dataset is empty, so its element spec is unknown"
                    )
                spec = nest.spec_from_value(first)
            self._spec_cache = spec
        return self._spec_cache

    def cardinality(self) -> int:
        """The number of elements, or INFINITE_CARDINALITY / UNKNOWN_CARDINALITY."""
        return self._op.cardinality()

    def __len__(self) -> int:
        n = self.cardinality()
        if n == INFINITE_CARDINALITY:
            raise TypeError("the dataset is infinite")
        if n == UNKNOWN_CARDINALITY:
            raise TypeError("the dataset's length is unknown; see cardinality()")
        return n

    def __iter__(self) -> DatasetIterator:
        key = derive_key(0, self._iterations)
        self._iterations += 1
        return DatasetIterator(self, key)

    def as_numpy_iterator(self) -> DatasetIterator:
        """An iterator over the elements (which are numpy values already)."""
        return iter(self)

    def __repr__(self) -> str:
        return f"<{type(self._op).__name__[:-2]}Dataset>"

    def __reduce__(self) -> Any:
        return (Dataset, (self._op,))

    def _then(self, op: Op) -> Dataset:
        return Dataset(op)
