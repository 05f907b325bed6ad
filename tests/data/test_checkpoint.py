"""Save/restore conformance: every source and transformation resumes exactly where it stopped.

One generic harness (in the style of torchdata's ``run_test_save_load_state``) is run over a
table of pipelines. For each checkpoint position ``k`` (before the first element, after the
first, in the middle, before the last, at the end, plus case-specific extras) it advances an
iterator ``k`` elements, takes ``state_dict()`` (which must be plain data), and checks that
iterators restored from that state yield exactly what the original iterator yields after
``k``: after a pickle round trip; twice; into an iterator that already yielded elements; from
the un-pickled state object after the original moved on; from the state of a just-restored
iterator; into a cloudpickled copy of the dataset (as in a new process); after the original
was abandoned mid-way (as in a crash, leaving the dataset as good as new); and while the
original is still being read.
"""

from __future__ import annotations

import gzip
import itertools
import pickle
from collections import namedtuple
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

from convoy import RaggedTensor, SparseTensor
from convoy.data import (
    AUTOTUNE,
    Dataset,
    Options,
    TensorSpec,
    TextLineDataset,
    TFRecordDataset,
    TFRecordWriter,
    experimental,
)
from convoy.testing import assert_equal

Point = namedtuple("Point", ["x", "y"])


# --- comparing elements ----------------------------------------------------------------------

def assert_elements_equal(actual: Any, expected: Any, path: str = "element") -> None:
    """Structural equality of two elements: same nesting, same types, same values and dtypes."""
    if isinstance(expected, (tuple, list)):  # namedtuples included: the exact type must match
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_elements_equal(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {type(actual)} is not a dict"
        assert sorted(actual) == sorted(expected), (
            f"{path}: keys {sorted(actual)} != {sorted(expected)}")
        for k in expected:
            assert_elements_equal(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (SparseTensor, RaggedTensor)):
        assert_equal(actual, expected, path)
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{path}: {type(actual)} is not an ndarray"
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            assert actual.tolist() == expected.tolist(), f"{path}: {actual!r} != {expected!r}"
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    else:  # scalars: Python or numpy numbers, bools, bytes, str
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        if isinstance(expected, (float, np.floating)) and np.isnan(expected):
            assert np.isnan(actual), f"{path}: {actual!r} != {expected!r}"
        else:
            assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def _canonical(element: Any) -> Any:
    """A hashable, orderable stand-in for an element, for comparing multisets."""
    if isinstance(element, dict):
        return tuple((repr(k), _canonical(v)) for k, v in sorted(element.items()))
    if isinstance(element, (tuple, list)):
        return tuple(_canonical(v) for v in element)
    if isinstance(element, (np.ndarray, np.generic)):
        return (str(element.dtype), np.shape(element), repr(np.asarray(element).tolist()))
    return (type(element).__name__, repr(element))


def assert_sequences_equal(actual: list[Any], expected: list[Any], ordered: bool) -> None:
    assert len(actual) == len(expected), f"got {len(actual)} elements, expected {len(expected)}"
    if not ordered:
        actual = sorted(actual, key=_canonical)
        expected = sorted(expected, key=_canonical)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert_elements_equal(a, e, f"element {i}")


# --- the harness -----------------------------------------------------------------------------

def _take(iterator: Iterator[Any], k: int) -> list[Any]:
    out = list(itertools.islice(iterator, k))
    assert len(out) == k, f"the iterator ended after {len(out)} of {k} elements"
    return out


def _drain(iterator: Any) -> list[Any]:
    try:
        return list(iterator)
    finally:
        iterator.close()


def _restored(ds: Dataset, state: Any, advance: int = 0) -> Any:
    iterator = iter(ds)
    list(itertools.islice(iterator, advance))  # an iterator that already yielded elements
    iterator.load_state_dict(state)
    return iterator


_MISSING = object()
_PLAIN = (type(None), bool, int, float, str, bytes, np.ndarray, np.generic)


def assert_plain(state: Any, path: str = "state") -> None:
    """State is plain data: containers of numbers, strings, bytes and numpy values only."""
    if isinstance(state, dict):
        for key, value in state.items():
            assert isinstance(key, (str, int)), f"{path}: key {key!r}"
            assert_plain(value, f"{path}[{key!r}]")
    elif type(state) in (list, tuple):
        for i, value in enumerate(state):
            assert_plain(value, f"{path}[{i}]")
    else:
        assert isinstance(state, _PLAIN), f"{path}: {type(state).__name__} is not plain data"


def checkpoint_points(n: int, extra: tuple[int, ...] = ()) -> list[int]:
    return sorted({p for p in (0, 1, n // 2, n - 1, n, *extra) if 0 <= p <= n})


def run_test_save_load_state(make: Callable[[], Dataset], ordered: bool = True,
                             extra_points: tuple[int, ...] = (), warm: bool = False,
                             concurrent: bool = True) -> None:
    """Check save/restore of ``make()``'s iterator at every checkpoint position.

    ``make`` builds a fresh, equal dataset each call; the first iteration of every fresh
    dataset must yield the same elements (seeded randomness), which gives the reference.
    ``warm`` iterates each dataset once before the iterator under test (e.g. to fill a cache).
    ``ordered=False`` compares the elements as multisets (non-deterministic map).
    ``concurrent=False`` skips running a restored iterator alongside the original (two
    iterators filling one cache file at once is unsupported, as in tf.data).
    """

    def fresh() -> Dataset:
        ds = make()
        if warm:
            _drain(iter(ds))
        return ds

    reference = fresh()
    expected = _drain(iter(reference))
    _drain(iter(reference))
    third_pass = _drain(iter(reference))  # iterations have keys: compare like with like
    for k in checkpoint_points(len(expected), extra_points):
        ds = fresh()
        it = iter(ds)
        head = _take(it, k)
        state = it.state_dict()
        assert_plain(state)
        snapshot = pickle.dumps(state)
        # The original iterator runs to the end first: restoring must not depend on it.
        rest = _drain(it)
        assert_sequences_equal(head + rest, expected, ordered)

        # Restored from the pickled state.
        it2 = _restored(ds, pickle.loads(snapshot))
        immediate = pickle.dumps(it2.state_dict())  # the state of a just-restored iterator
        assert_sequences_equal(_drain(it2), rest, ordered)
        # The same state restored a second time, into an iterator that already yielded some.
        assert_sequences_equal(_drain(_restored(ds, pickle.loads(snapshot), advance=2)), rest,
                               ordered)
        # The state object itself, after the original moved on: it must be a snapshot.
        assert_sequences_equal(_drain(_restored(ds, state)), rest, ordered)
        # The state of a just-restored iterator is as good as the one it was restored from.
        assert_sequences_equal(_drain(_restored(ds, pickle.loads(immediate))), rest, ordered)
        # An equal dataset unpickled (as in a new process, without in-memory caches) too.
        clone = cloudpickle.loads(cloudpickle.dumps(ds))
        assert_sequences_equal(_drain(_restored(clone, pickle.loads(snapshot))), rest, ordered)

        # The original lost a little after the checkpoint (as in a crash), then restored into
        # its own dataset: the restored iterator finishes what the original started.
        crashed_ds = fresh()
        crashed = iter(crashed_ds)
        crashed_head = _take(crashed, k)
        crashed_state = pickle.dumps(crashed.state_dict())
        list(itertools.islice(crashed, 2))
        crashed.close()
        resumed = _drain(_restored(crashed_ds, pickle.loads(crashed_state)))
        assert_sequences_equal(crashed_head + resumed, expected, ordered)
        # ... and leaves the dataset as good as new (e.g. a complete, intact cache).
        assert_sequences_equal(_drain(iter(crashed_ds)), third_pass, ordered)

        if concurrent:  # a restored iterator and the original, read in turns
            twin_ds = fresh()
            original = iter(twin_ds)
            twin_head = _take(original, k)
            twin = _restored(twin_ds, pickle.loads(pickle.dumps(original.state_dict())))
            pairs = list(itertools.zip_longest(original, twin, fillvalue=_MISSING))
            original.close()
            twin.close()
            from_original = [a for a, _ in pairs if a is not _MISSING]
            from_twin = [b for _, b in pairs if b is not _MISSING]
            assert_sequences_equal(twin_head + from_original, expected, ordered)
            assert_sequences_equal(from_twin, from_original, ordered)


# --- pipelines -------------------------------------------------------------------------------

@dataclass
class Files:
    """Input files written under a test's tmp_path."""

    root: Path
    text: list[str] = field(default_factory=list)
    text_gz: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    records_gz: list[str] = field(default_factory=list)
    records_zlib: list[str] = field(default_factory=list)
    text_crlf: str = ""
    csv: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)

    def fresh(self, name: str) -> str:
        """A path not used before in this test (a cache file per built dataset)."""
        return str(self.root / f"{name}-{next(self.counter)}")


@pytest.fixture
def files(tmp_path: Path) -> Files:
    out = Files(tmp_path)
    crlf = tmp_path / "lines.crlf"
    crlf.write_bytes(b"one\r\ntwo\r\n\r\nfour")
    out.text_crlf = str(crlf)
    for i in range(2):
        csv = tmp_path / f"table-{i}.csv"
        csv.write_text("n,word\n" + "".join(f'{10 * i + j},"w{j}\n,x"\n' for j in range(4)))
        out.csv.append(str(csv))
    for i in range(3):
        lines = [f"file {i} line {j}" for j in range(4 + i)]
        path = tmp_path / f"lines-{i}.txt"
        path.write_text("\n".join(lines) + "\n")
        out.text.append(str(path))
        gz = tmp_path / f"lines-{i}.txt.gz"
        with gzip.open(gz, "wt") as f:
            f.write("\n".join(lines))  # no final newline
        out.text_gz.append(str(gz))
        for options, target in ((None, out.records), ("GZIP", out.records_gz),
                                ("ZLIB", out.records_zlib)):
            suffix = f".{options.lower()}" if options else ""
            record_path = tmp_path / f"data-{i}.tfrecord{suffix}"
            with TFRecordWriter(str(record_path), options) as writer:
                for j in range(5 + i):
                    writer.write(f"record {i}:{j}".encode() * (j + 1))
            target.append(str(record_path))
    return out


def _gen() -> Iterator[tuple[int, list[float]]]:
    for i in range(9):
        yield i, [float(i)] * (i % 3)


def _parse(record: bytes) -> dict[str, Any]:
    return {"length": np.int64(len(record)), "head": record[:8]}


def _sparse_of(i: Any) -> SparseTensor:
    return SparseTensor(indices=[[0]], values=[i], dense_shape=[1])


def _ragged_of(i: Any) -> RaggedTensor:
    return RaggedTensor.from_row_lengths(np.arange(i), [i])


def _square_pair(x: Any) -> tuple[Any, Any]:
    return x, x * x


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Files], Dataset]
    ordered: bool = True
    extra_points: tuple[int, ...] = ()
    warm: bool = False
    concurrent: bool = True


R = Dataset.range
ARRAY = np.arange(24, dtype=np.float32).reshape(8, 3)

CASES = [
    # sources
    Case("range", lambda f: R(10)),
    Case("range_step", lambda f: R(20, 3, -4)),
    Case("range_empty", lambda f: R(0)),
    Case("with_options", lambda f: R(6).with_options(Options(deterministic=True))),
    Case("tensor_slices_array", lambda f: Dataset.from_tensor_slices(ARRAY)),
    Case("tensor_slices_tuple", lambda f: Dataset.from_tensor_slices(
        (np.arange(8), ARRAY, np.array([b"s%d" % i for i in range(8)], dtype=object)))),
    Case("tensor_slices_dict", lambda f: Dataset.from_tensor_slices(
        {"a": np.arange(8, dtype=np.int32), "b": ARRAY})),
    Case("tensors", lambda f: Dataset.from_tensors((np.arange(3), {"k": b"v"}))),
    Case("generator", lambda f: Dataset.from_generator(
        _gen, output_signature=(TensorSpec((), np.int64), TensorSpec((None,), np.float32)))),
    Case("list_files", lambda f: Dataset.list_files(str(f.root / "*.txt"), seed=4)),
    Case("list_files_unshuffled", lambda f: Dataset.list_files(str(f.root / "*.txt"),
                                                               shuffle=False)),
    Case("text_line_one_file", lambda f: TextLineDataset(f.text[0])),
    Case("text_line_files", lambda f: TextLineDataset(f.text)),
    Case("text_line_crlf", lambda f: TextLineDataset(f.text_crlf)),
    Case("text_line_gzip", lambda f: TextLineDataset(f.text_gz, compression_type="GZIP")),
    Case("text_line_parallel_reads", lambda f: TextLineDataset(f.text, num_parallel_reads=2)),
    Case("text_line_dataset_of_files", lambda f: TextLineDataset(
        Dataset.list_files(str(f.root / "*.txt"), seed=3))),
    Case("tfrecord", lambda f: TFRecordDataset(f.records)),
    Case("tfrecord_gzip", lambda f: TFRecordDataset(f.records_gz, compression_type="GZIP")),
    Case("tfrecord_zlib", lambda f: TFRecordDataset(f.records_zlib, compression_type="ZLIB")),
    Case("tfrecord_parallel_reads", lambda f: TFRecordDataset(f.records, num_parallel_reads=3)),
    # batches cut straight from the files' runs of records, across file boundaries
    Case("tfrecord_batch", lambda f: TFRecordDataset(f.records).batch(4)),
    Case("tfrecord_batch_drop_remainder", lambda f: TFRecordDataset(f.records).batch(
        7, drop_remainder=True)),
    Case("tfrecord_gzip_batch", lambda f: TFRecordDataset(f.records_gz,
                                                          compression_type="GZIP").batch(3)),
    # combining datasets
    Case("zip", lambda f: Dataset.zip((R(10), Dataset.from_tensor_slices(ARRAY)))),
    Case("zip_dict", lambda f: Dataset.zip({"n": R(5), "s": R(100, 110).shuffle(4, seed=2)})),
    Case("concatenate", lambda f: R(5).concatenate(R(10, 13))),
    Case("concatenate_empty_first", lambda f: R(0).concatenate(R(3)).concatenate(R(0))),
    Case("sample_from_datasets", lambda f: Dataset.sample_from_datasets(
        [R(0, 8), R(100, 110), R(200, 203)], weights=[0.2, 0.5, 0.3], seed=5)),
    Case("sample_stop_on_empty", lambda f: Dataset.sample_from_datasets(
        [R(0, 8), R(100, 104)], seed=7, stop_on_empty_dataset=True)),
    Case("choose_from_datasets", lambda f: Dataset.choose_from_datasets(
        [R(0, 5), R(10, 15), R(20, 25)], Dataset.from_tensor_slices(
            np.array([0, 1, 2, 2, 1, 0, 0, 0, 0, 0, 1, 2], dtype=np.int64)),
        stop_on_empty_dataset=False)),
    # map and filter
    Case("map", lambda f: R(12).map(_square_pair)),
    Case("map_namedtuple", lambda f: R(6).map(lambda x: Point(x, {"y": np.full(2, x)}))),
    Case("map_parallel", lambda f: R(30).map(_square_pair, num_parallel_calls=4)),
    Case("map_autotune", lambda f: R(30).map(lambda x: x * 3, num_parallel_calls=AUTOTUNE)),
    Case("map_nondeterministic", lambda f: R(30).map(
        lambda x: x + 1, num_parallel_calls=4, deterministic=False), ordered=False),
    Case("filter", lambda f: R(20).filter(lambda x: x % 3 == 0)),
    Case("filter_tuple", lambda f: R(20).map(_square_pair).filter(lambda x, y: y % 2 == 1)),
    Case("flat_map", lambda f: R(5).flat_map(lambda x: R(x))),
    Case("interleave", lambda f: R(1, 7).interleave(
        lambda x: Dataset.from_tensors(x).repeat(x), cycle_length=3, block_length=2)),
    Case("interleave_parallel", lambda f: R(1, 7).interleave(
        lambda x: R(10 * x, 10 * x + x), cycle_length=3, block_length=2,
        num_parallel_calls=2)),
    Case("interleave_inner_pipelines", lambda f: R(1, 6).interleave(
        lambda x: R(10 * x, 10 * x + x).shuffle(3, seed=x).map(
            _square_pair, num_parallel_calls=2).prefetch(1),
        cycle_length=2, block_length=3, num_parallel_calls=2)),
    # batching
    Case("batch", lambda f: R(10).batch(3)),
    Case("batch_drop_remainder", lambda f: R(10).batch(3, drop_remainder=True)),
    Case("batch_structure", lambda f: Dataset.from_tensor_slices(
        {"a": np.arange(8), "b": ARRAY}).batch(3)),
    Case("padded_batch", lambda f: R(1, 8).map(lambda x: np.arange(x)).padded_batch(3)),
    Case("unbatch", lambda f: Dataset.from_tensor_slices(ARRAY).batch(3).unbatch()),
    Case("rebatch", lambda f: R(11).batch(3).rebatch(4)),
    Case("batch_bytes", lambda f: Dataset.from_tensor_slices(
        np.array([b"w%d" % i for i in range(7)], dtype=object)).batch(3)),
    # shuffle and repeat
    Case("shuffle", lambda f: R(20).shuffle(7, seed=11)),
    Case("shuffle_big_buffer", lambda f: R(6).shuffle(100, seed=11)),
    Case("shuffle_reshuffle_repeat", lambda f: R(8).shuffle(8, seed=3).repeat(2)),
    Case("shuffle_no_reshuffle_repeat", lambda f: R(8).shuffle(
        8, seed=3, reshuffle_each_iteration=False).repeat(2)),
    Case("repeat", lambda f: R(4).repeat(3)),
    Case("repeat_zero", lambda f: R(4).repeat(0)),
    Case("repeat_forever_empty", lambda f: R(0).repeat()),
    Case("repeat_forever_take", lambda f: R(4).shuffle(4, seed=2).repeat().take(11)),
    Case("shuffle_repeat_epoch_boundary", lambda f: R(5).shuffle(5, seed=1).repeat(3),
         extra_points=(4, 5, 6, 9, 10, 11)),
    Case("shuffle_repeat_epoch_boundary_prefetch",
         lambda f: R(5).shuffle(5, seed=1).repeat(3).prefetch(2), extra_points=(5, 10)),
    # slicing
    Case("take", lambda f: R(10).take(4)),
    Case("take_all", lambda f: R(5).take(-1)),
    Case("skip", lambda f: R(10).skip(3)),
    Case("skip_all", lambda f: R(5).skip(-1)),
    Case("take_while", lambda f: R(10).take_while(lambda x: x < 6)),
    Case("shard", lambda f: R(17).shard(3, 1)),
    Case("enumerate", lambda f: Dataset.from_tensor_slices(
        np.array([b"a", b"b", b"c", b"d"], dtype=object)).enumerate(5)),
    # prefetch
    Case("prefetch", lambda f: R(20).map(_square_pair).prefetch(2)),
    Case("prefetch_autotune", lambda f: R(20).prefetch(AUTOTUNE)),
    # cache: the original iterator of a fresh dataset fills the cache
    Case("cache_memory", lambda f: R(8).map(lambda x: x * x).cache()),
    Case("cache_memory_fill_and_replay", lambda f: R(6).shuffle(6, seed=9).cache().repeat(2)),
    Case("cache_memory_replay", lambda f: R(8).map(lambda x: x * x).cache(), warm=True),
    Case("cache_file", lambda f: R(8).map(_square_pair).cache(f.fresh("cache")),
         concurrent=False),
    Case("cache_file_fill_and_replay",
         lambda f: R(6).shuffle(6, seed=9).cache(f.fresh("cache")).repeat(2), concurrent=False),
    Case("cache_file_replay", lambda f: R(8).map(_square_pair).cache(f.fresh("cache")),
         warm=True),
    # grouping, windows, stateful and infinite ops
    Case("group_by_window", lambda f: R(20).group_by_window(
        lambda x: x % 3, lambda k, w: w.batch(2), window_size=3), extra_points=(3, 7)),
    Case("group_by_window_size_func", lambda f: R(25).shuffle(10, seed=2).group_by_window(
        lambda x: x % 4, lambda k, w: w.map(lambda x: x * 10 + k),
        window_size_func=lambda k: k + 1)),
    Case("bucket_by_sequence_length", lambda f: R(1, 12).map(lambda x: np.arange(x))
         .bucket_by_sequence_length(len, [4, 8], [2, 3, 2])),
    Case("window_flat_map", lambda f: R(13).window(4, 3, 2).flat_map(lambda w: w.batch(4))),
    Case("window_drop_remainder_zip", lambda f: Dataset.from_tensor_slices(
        (np.arange(9), np.arange(9) * 2)).window(3, drop_remainder=True).flat_map(
            lambda a, b: Dataset.zip((a.batch(3), b.batch(3))))),
    Case("scan", lambda f: R(10).scan(np.int64(0), lambda s, x: (s + x, (s, x)))),
    Case("unique", lambda f: Dataset.from_tensor_slices(
        np.array([3, 1, 3, 2, 1, 5, 2, 7], dtype=np.int64)).unique()),
    Case("ignore_errors", lambda f: R(12).map(lambda x: 10 // (x % 4)).ignore_errors()),
    # batch_test.py, BatchCheckpointTest: testSparse, testNestedSparse (and ragged likewise)
    Case("batch_sparse", lambda f: R(10).map(_sparse_of).batch(5)),
    Case("batch_sparse_nested", lambda f: R(10).map(_sparse_of).batch(5).batch(2)),
    Case("batch_ragged", lambda f: R(10).map(_ragged_of).batch(3)),
    Case("zip_ignore_errors", lambda f: Dataset.zip((
        R(12), R(12).map(lambda x: 10 // (x % 4)), R(100, 112).shuffle(4, seed=3)))
         .ignore_errors()),
    Case("assert_cardinality", lambda f: R(8).filter(lambda x: True).apply(
        experimental.assert_cardinality(8))),
    Case("counter", lambda f: Dataset.counter(5, -2).take(9)),
    Case("random", lambda f: Dataset.random(seed=3).take(2000), extra_points=(1024, 1025)),
    Case("random_rerandomize_repeat", lambda f: Dataset.random(
        seed=3, rerandomize_each_iteration=True).take(4).repeat(3)),
    Case("rejection_resample", lambda f: R(60).rejection_resample(
        lambda x: x % 3, [0.6, 0.2, 0.2], seed=4)),
    Case("rejection_resample_known_initial", lambda f: R(60).rejection_resample(
        lambda x: x % 2, [0.8, 0.2], initial_dist=[0.5, 0.5], seed=4)),
    Case("from_list", lambda f: experimental.from_list([np.arange(i) for i in range(6)])),
    Case("csv", lambda f: experimental.CsvDataset(f.csv, [[0], [""]], header=True)),
    Case("make_csv_dataset", lambda f: experimental.make_csv_dataset(
        f.csv, 2, num_epochs=2, shuffle_seed=1, shuffle_buffer_size=3)),
    # long chains
    Case("chain_files_interleave_records", lambda f: Dataset.list_files(
        str(f.root / "*.tfrecord"), seed=8).interleave(
            TFRecordDataset, cycle_length=2, block_length=1).map(_parse).shuffle(
                5, seed=6).batch(4).prefetch(2)),
    Case("chain_range_shuffle_repeat_batch", lambda f: R(30).shuffle(10, seed=12).repeat(3)
         .batch(7).prefetch(2)),
    Case("chain_text_parallel", lambda f: TextLineDataset(f.text, num_parallel_reads=2)
         .enumerate().filter(lambda i, line: i % 2 == 0)
         .map(lambda i, line: (i, line), num_parallel_calls=3).batch(2).prefetch(AUTOTUNE)),
    Case("chain_cache_shuffle_repeat", lambda f: R(12).map(_square_pair).cache(
        f.fresh("chain")).shuffle(5, seed=4).repeat(2).batch(5).prefetch(1), concurrent=False),
    Case("chain_generator_unbatch_zip", lambda f: Dataset.zip((
        Dataset.from_generator(_gen, output_signature=(
            TensorSpec((), np.int64), TensorSpec((None,), np.float32))).map(
                lambda i, v: np.full(2, i)).unbatch(),
        R(100).shuffle(10, seed=1))).skip(2).take(12)),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_save_load_state(case: Case, files: Files) -> None:
    run_test_save_load_state(lambda: case.make(files), ordered=case.ordered,
                             extra_points=case.extra_points, warm=case.warm,
                             concurrent=case.concurrent)


# --- the epoch boundary, spelled out -------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("at", [5, 10], ids=["end_of_epoch_1", "end_of_epoch_2"])
def test_restore_at_epoch_boundary_yields_next_epochs_order(at: int) -> None:
    ds = R(5).shuffle(5, seed=1).repeat(3)
    it = iter(ds)
    seen = _take(it, at)
    state = pickle.loads(pickle.dumps(it.state_dict()))
    rest = _drain(it)
    assert sorted(seen[at - 5:]) == list(range(5))  # a whole epoch ends at `at`
    assert len(rest) == 15 - at
    epochs = [tuple(e) for e in np.reshape(seen + rest, (3, 5)).tolist()]
    assert len(set(epochs)) > 1  # each epoch is shuffled anew: the next order is not a replay
    restored = _restored(ds, state)
    assert _drain(restored) == rest


def test_assert_elements_equal_catches_differences() -> None:
    assert_elements_equal(Point(1, {"a": np.arange(2)}), Point(1, {"a": np.arange(2)}))
    with pytest.raises(AssertionError):
        assert_elements_equal((1, np.arange(2)), (1, np.arange(3)))
    with pytest.raises(AssertionError):
        assert_elements_equal({"a": b"x"}, {"a": b"y"})
    with pytest.raises(AssertionError):
        assert_elements_equal(np.int64(1), 1)
    with pytest.raises(AssertionError):
        assert_elements_equal(np.arange(2, dtype=np.int32), np.arange(2, dtype=np.int64))
    with pytest.raises(AssertionError):
        assert_elements_equal((1, 2), Point(1, 2))
