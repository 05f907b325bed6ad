"""The public face of local pipelines: :class:`Dataset`, whose methods chain ops (each op in
a module of its own).

Long by design: one method per tf.data transformation, each checking its arguments and
building its op, so the whole API reads in one place.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from convoy._base import check
from convoy._values import nest
from convoy.data._core._op import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    SHARD_HINT,
    UNKNOWN_CARDINALITY,
    Node,
    Op,
    SameSpecOp,
    derive_key,
    register_face,
)
from convoy.data._core._options import PIPELINE_DETERMINISTIC, Options
from convoy.data._iterator import DatasetIterator
from convoy.data._ops._batch import BatchOp, PaddedBatchOp, UnbatchOp, refuse_composite
from convoy.data._ops._cache import CacheOp
from convoy.data._ops._combine import ChooseOp, ConcatenateOp, SampleOp, ZipOp
from convoy.data._ops._faults import IgnoreErrorsOp
from convoy.data._ops._grouping import GroupByWindowOp, WindowOp, bucket_by_sequence_length
from convoy.data._ops._interleave import InterleaveOp
from convoy.data._ops._map import FilterOp, MapOp
from convoy.data._ops._prefetch import PrefetchOp
from convoy.data._ops._ragged import RaggedBatchOp, SparseBatchOp
from convoy.data._ops._resample import rejection_resample
from convoy.data._ops._scan import ScanOp
from convoy.data._ops._shuffle import ShuffleOp
from convoy.data._ops._slicing import EnumerateOp, RepeatOp, ShardOp, SkipOp, TakeOp, TakeWhileOp
from convoy.data._ops._unique import UniqueOp, check_unique_spec
from convoy.data._persistence import _load, _save
from convoy.data._persistence._snapshot import SnapshotOp
from convoy.data._sources._basic import (
    ElementsOp,
    GeneratorOp,
    ListFilesOp,
    RangeOp,
    TensorSlicesOp,
    TensorsOp,
    to_tensor_structure,
)
from convoy.data._sources._infinite import CounterOp, RandomOp
from convoy.errors import FailedPreconditionError, InvalidArgumentError


class _OptionsOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op, options: Options) -> None:
        self.inputs = (input,)
        self.options = options

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        """The input's iterator, its ops built under this ``deterministic`` setting."""
        if self.options.deterministic is None:
            return self.input.iterator(state, key)
        token = PIPELINE_DETERMINISTIC.set(self.options.deterministic)
        try:
            return self.input.iterator(state, key)
        finally:
            PIPELINE_DETERMINISTIC.reset(token)


def _is_hint(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and value == SHARD_HINT


def _as_op(dataset: Any, argument: str) -> Op:
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(
            f"{argument} must be a convoy.data.Dataset, got {type(dataset).__name__}"
        )
    return dataset._op


_NONE = object()


def _upstream_first(op: Op) -> list[Op]:
    """Every op of the graph ending at ``op``, each after its inputs (the first input's
    first): the order in which ``with_options`` settings merge."""
    order: list[Op] = []
    seen: set[int] = set()
    stack: list[tuple[Op, bool]] = [(op, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.inputs))
    return order


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
    def load(path: str | os.PathLike[str], element_spec: Any = None,
             compression: str | None = None,
             reader_func: Callable[[Dataset], Dataset] | None = None,
             wait: bool = False) -> Dataset:
        """The dataset ``save`` (convoy's or TensorFlow's) wrote under ``path``; its element
        spec is read from there unless given."""
        return Dataset(_load.load(path, element_spec, compression, reader_func, wait))

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

    @staticmethod
    def counter(start: int = 0, step: int = 1, dtype: Any = np.int64,
                name: str | None = None) -> Dataset:
        """``start``, ``start + step``, ``start + 2 * step`` ... for ever."""
        try:
            kind = np.dtype(dtype)
        except TypeError:
            kind = None
        if kind is None or kind.kind not in "iuf":
            raise InvalidArgumentError(f"counter: dtype must be a numeric dtype, got {dtype!r}")
        return Dataset(CounterOp(check.integer("start", start), check.integer("step", step),
                                 kind))

    @staticmethod
    def random(seed: int | None = None, rerandomize_each_iteration: bool | None = None,
               name: str | None = None) -> Dataset:
        """Pseudo-random int64 values in [0, 2**32) for ever; the same sequence for the same
        seed (each iteration a new one with ``rerandomize_each_iteration``)."""
        return Dataset(RandomOp(check.optional_integer("seed", seed),
                                bool(check.optional_boolean("rerandomize_each_iteration",
                                                            rerandomize_each_iteration))))

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
        spec = self._op.static_spec()
        for component in [] if spec is None else nest.flatten(spec):
            refuse_composite(component)
        return self._then(PaddedBatchOp(self._op, size,
                                        check.boolean("drop_remainder", drop_remainder),
                                        padded_shapes, padding_values))

    def ragged_batch(self, batch_size: int, drop_remainder: bool = False,
                     row_splits_dtype: Any = np.int64, name: str | None = None) -> Dataset:
        """Like batch, with every component of rank >= 1 batched into a
        :class:`~convoy.RaggedTensor` (so its first dimension may differ between elements),
        whose row splits are ``row_splits_dtype``."""
        size = check.integer("batch_size", batch_size, 1)
        if np.dtype(row_splits_dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise InvalidArgumentError(
                f"row_splits_dtype must be int32 or int64, got {row_splits_dtype!r}")
        op = RaggedBatchOp(self._op, size, check.boolean("drop_remainder", drop_remainder))
        op.row_splits_dtype = np.dtype(row_splits_dtype)
        return self._then(op)

    def sparse_batch(self, batch_size: int, row_shape: Any,
                     name: str | None = None) -> Dataset:
        """Batches as :class:`~convoy.SparseTensor` of dense shape ``[batch, *row_shape]``
        (-1 in ``row_shape``: the batch's largest size); every entry is a value."""
        size = check.integer("batch_size", batch_size, 1)
        try:
            shape = tuple(-1 if d is None else int(d) for d in row_shape)
        except TypeError:
            raise InvalidArgumentError(
                f"row_shape must be a shape (a list of sizes), got {row_shape!r}") from None
        return self._then(SparseBatchOp(self._op, size, shape))

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

    def save(self, path: str | os.PathLike[str], compression: str | None = None,
             shard_func: Callable[..., Any] | None = None, checkpoint_args: Any = None) -> None:
        """Writes every element under ``path`` in TensorFlow's format (``load`` reads it)."""
        _save.save(self, path, compression, shard_func, checkpoint_args)

    def snapshot(self, path: str | os.PathLike[str], compression: str | None = "AUTO",
                 reader_func: Callable[[Dataset], Dataset] | None = None,
                 shard_func: Callable[..., Any] | None = None,
                 name: str | None = None) -> Dataset:
        """The same elements, computed once into ``path`` and read from there afterwards."""
        return self._then(SnapshotOp(self._op, path, compression, reader_func, shard_func))

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
        for op in _upstream_first(self._op):
            if isinstance(op, _OptionsOp):
                merged = merged.merge(op.options)
        return merged.frozen()

    def scan(self, initial_state: Any, scan_func: Callable[[Any, Any], Any],
             name: str | None = None) -> Dataset:
        """``scan_func(state, element) -> (new_state, output)`` over the elements, yielding
        the outputs; the state starts as ``initial_state``."""
        check.function("scan_func", scan_func)
        return self._then(ScanOp(self._op, to_tensor_structure(initial_state,
                                                               "initial_state"), scan_func))

    def unique(self, name: str | None = None) -> Dataset:
        """Each distinct element once, at its first appearance (int32, int64 or string
        scalars or vectors)."""
        spec = self._op.static_spec()
        check_unique_spec(spec)
        return self._then(UniqueOp(self._op))

    def ignore_errors(self, log_warning: bool = False, name: str | None = None) -> Dataset:
        """The elements whose computation did not raise; the others are dropped."""
        return self._then(IgnoreErrorsOp(self._op, check.boolean("log_warning", log_warning)))

    def group_by_window(self, key_func: Callable[..., Any],
                        reduce_func: Callable[[Any, Dataset], Dataset],
                        window_size: int | None = None,
                        window_size_func: Callable[[Any], Any] | None = None,
                        name: str | None = None) -> Dataset:
        """Elements grouped by ``key_func`` (a scalar int64); each group of ``window_size``
        (or ``window_size_func(key)``) elements becomes ``reduce_func(key, dataset)``, whose
        elements are yielded. What is left at the end is flushed in increasing key order."""
        if (window_size is not None and window_size_func) or not (
                window_size is not None or window_size_func):
            raise InvalidArgumentError(
                "Either the `window_size` argument or the `window_size_func` argument must "
                "be specified.")
        check.function("key_func", key_func)
        check.function("reduce_func", reduce_func)
        if window_size is not None:
            size = check.integer("window_size", window_size)
            window_size_func = lambda key: size  # noqa: E731
        else:
            check.function("window_size_func", window_size_func)
        spec = self._op.static_spec()

        def reduce_op(key: int, elements: list[Any]) -> Op:
            result = reduce_func(np.int64(key), Dataset(ElementsOp(elements, spec)))
            return _as_op(result, "the value returned by group_by_window's reduce_func")

        assert window_size_func is not None
        return self._then(GroupByWindowOp(self._op, key_func, reduce_op, window_size_func))

    def bucket_by_sequence_length(self, element_length_func: Callable[..., Any],
                                  bucket_boundaries: Sequence[int],
                                  bucket_batch_sizes: Sequence[int],
                                  padded_shapes: Any = None, padding_values: Any = None,
                                  pad_to_bucket_boundary: bool = False,
                                  no_padding: bool = False, drop_remainder: bool = False,
                                  name: str | None = None) -> Dataset:
        """Elements bucketed by ``element_length_func`` against ``bucket_boundaries`` and
        padded-batched, with ``bucket_batch_sizes[i]`` elements per batch of bucket ``i``."""
        return bucket_by_sequence_length(
            self, element_length_func, list(bucket_boundaries), list(bucket_batch_sizes),
            padded_shapes, padding_values, pad_to_bucket_boundary, no_padding, drop_remainder)

    def window(self, size: int, shift: int | None = None, stride: int = 1,
               drop_remainder: bool = False, name: str | None = None) -> Dataset:
        """Windows of ``size`` elements (``stride`` apart), a new one every ``shift``
        elements (default ``size``). Each window has the structure of an element, with a
        dataset of that component's values at each leaf."""
        size = check.integer("size", size)
        if size <= 0:
            raise InvalidArgumentError("Window size must be greater than zero.")
        shift = size if shift is None else check.integer("shift", shift)
        if shift <= 0:
            raise InvalidArgumentError("Window shift must be greater than zero.")
        stride = check.integer("stride", stride)
        if stride <= 0:
            raise InvalidArgumentError("Window stride must be greater than zero.")
        return self._then(WindowOp(self._op, size, shift, stride,
                                   check.boolean("drop_remainder", drop_remainder)))

    def rejection_resample(self, class_func: Callable[..., Any], target_dist: Any,
                           initial_dist: Any = None, seed: int | None = None,
                           name: str | None = None) -> Dataset:
        """``(class, element)`` pairs, resampled so the classes follow ``target_dist``."""
        check.function("class_func", class_func)
        return rejection_resample(self, class_func, target_dist, initial_dist,
                                  check.optional_integer("seed", seed))

    def get_single_element(self, name: str | None = None) -> Any:
        """The one element of a dataset that has exactly one."""
        with iter(self) as iterator:
            first = next(iterator, _NONE)
            if first is _NONE:
                raise InvalidArgumentError("Dataset was empty.")
            if next(iterator, _NONE) is not _NONE:
                raise InvalidArgumentError("Dataset had more than one element.")
        return first

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


register_face(Dataset)
