"""Every source and transformation under DYNAMIC sharding, through the real service.

One row per op: the pipeline runs under DYNAMIC with 1 and with 3 workers, and what comes back
is compared with the pipeline read locally. Ops that split cleanly give back the local
elements exactly once (as a multiset). Ops that TensorFlow also applies per worker under
DYNAMIC (take, skip, batch, enumerate ...) say in their row what is promised instead; every
such promise includes "no element twice". Ops that cannot be split are refused by
``distribute`` itself, with an error naming them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError, UnimplementedError
from convoy.testing import InProcessCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

D = cv.data.Dataset
DYNAMIC = cv.data.service.ShardingPolicy.DYNAMIC
NUM_FILES, RECORDS_PER_FILE = 5, 4


# ----- comparing results -------------------------------------------------------------------------

def canon(value: Any) -> Any:
    """A hashable stand-in for an element, equal for equal values whatever their types."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, tuple(canon(v) for v in value.ravel().tolist()))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, canon(v)) for k, v in value.items()))
    return value


def multiset(elements: list[Any]) -> Counter:
    return Counter(map(canon, elements))


def rows(batches: list[Any]) -> list[Any]:
    return [row for batch in batches for row in np.asarray(batch)]


def assert_exactly_once(local: list[Any], got: list[Any], workers: int) -> None:
    assert multiset(got) == multiset(local)


def assert_no_repeats_within(pool: list[Any]) -> Callable[..., None]:
    """Per-worker ops: nothing twice, nothing that is not in ``pool`` (the elements before
    the op), and with one worker exactly the local result."""
    def check(local: list[Any], got: list[Any], workers: int) -> None:
        assert not multiset(got) - multiset(pool), "elements that are not in the input"
        assert all(n == 1 for n in multiset(got).values()), "an element came twice"
        if workers == 1:
            assert multiset(got) == multiset(local)
    return check


def assert_rows_once(batch_size: int) -> Callable[..., None]:
    """Batching per worker: the rows exactly once; no batch larger than ``batch_size``."""
    def check(local: list[Any], got: list[Any], workers: int) -> None:
        assert multiset(rows(got)) == multiset(rows(local))
        assert all(1 <= len(batch) <= batch_size for batch in got)
        if workers == 1:
            assert multiset(got) == multiset(local)
    return check


def assert_full_batches(batch_size: int) -> Callable[..., None]:
    """batch(drop_remainder=True) per worker: each worker drops its own remainder, so rows
    come at most once and every batch is full."""
    def check(local: list[Any], got: list[Any], workers: int) -> None:
        assert all(len(batch) == batch_size for batch in got)
        assert_no_repeats_within(rows(local))(rows(local), rows(got), workers)
    return check


def assert_padded_rows_once(local: list[Any], got: list[Any], workers: int) -> None:
    """padded_batch per worker: padding depends on the batch, so compare rows unpadded."""
    def unpadded(batches: list[Any]) -> Counter:
        return multiset([row[row != 0] for row in rows(batches)])
    assert unpadded(got) == unpadded(local)
    assert all(1 <= len(batch) <= 3 for batch in got)


def assert_enumerated_per_worker(local: list[Any], got: list[Any], workers: int) -> None:
    """enumerate counts per worker (as in TensorFlow): every element once, each worker's
    indices 0, 1, 2 ..., so an index comes at most once per worker."""
    assert multiset([e for _, e in got]) == multiset([e for _, e in local])
    assert max(multiset([i for i, _ in got]).values()) <= workers


def assert_endless_input_per_worker(filler: int) -> Callable[..., None]:
    """choose_from_datasets over an endless input: every worker reads the whole choice
    dataset and has its own share of the endless input, so ``filler`` (its element) comes
    once per worker for each choice of it; the other input's elements exactly once."""
    def check(local: list[Any], got: list[Any], workers: int) -> None:
        def split(elements: list[Any]) -> tuple[Counter, int]:
            values = [int(e) for e in elements]
            return multiset([v for v in values if v != filler]), values.count(filler)
        (got_rest, got_fill), (local_rest, local_fill) = split(got), split(local)
        assert got_rest == local_rest and got_fill == local_fill * workers
    return check


def assert_same_values(local: list[Any], got: list[Any], workers: int) -> None:
    """unique per worker: each worker's values once, so together the same set of values."""
    assert set(map(canon, got)) == set(map(canon, local))
    if workers == 1:
        assert multiset(got) == multiset(local)


def assert_ragged_rows_once(local: list[Any], got: list[Any], workers: int) -> None:
    def ragged_rows(batches: list[Any]) -> Counter:
        return Counter(tuple(row) for batch in batches for row in batch.to_list())
    assert ragged_rows(got) == ragged_rows(local)


def assert_sparse_rows_once(local: list[Any], got: list[Any], workers: int) -> None:
    def sparse_rows(batches: list[Any]) -> Counter:
        return Counter(tuple(int(v) for v in row[: int(np.count_nonzero(row)) + 1])
                       for batch in batches for row in batch.to_dense())
    assert sparse_rows(got) == sparse_rows(local)


def fails_on_fives(x: Any) -> Any:
    if x % 5 == 0:
        raise ValueError(f"{x} is a multiple of five")
    return x


def saved(files: Path) -> str:
    path = files / "saved"
    if not path.exists():
        D.range(6).save(str(path))
    return str(path)


# ----- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    name: str
    build: Callable[[Path], D]
    #: check(local, got, workers) for a pipeline DYNAMIC splits; None when it is refused.
    check: Callable[[list[Any], list[Any], int], None] | None = assert_exactly_once
    #: the op a refusal names
    refused: str = ""


def tfrecords(files: Path) -> list[str]:
    return sorted(str(p) for p in files.glob("*.tfrecord"))


def texts(files: Path) -> list[str]:
    return sorted(str(p) for p in files.glob("*.txt"))


def arange_of(x: Any) -> np.ndarray:
    return np.arange(1, int(x) + 2)  # no zeros: padding is told apart by being 0


ROWS = [
    # ----- sources
    Row("range", lambda f: D.range(3, 40, 2)),
    Row("from_tensor_slices", lambda f: D.from_tensor_slices(
        (np.arange(15), np.arange(15) * 2.5))),
    Row("from_tensors", lambda f: D.from_tensors(np.arange(6))),
    Row("list_files", lambda f: D.list_files(str(f / "*.tfrecord"))),
    Row("list_files+TFRecordDataset", lambda f: D.list_files(str(f / "*.tfrecord")).interleave(
        cv.data.TFRecordDataset, cycle_length=2)),
    Row("TFRecordDataset", lambda f: cv.data.TFRecordDataset(tfrecords(f))),
    Row("TFRecordDataset(num_parallel_reads)", lambda f: cv.data.TFRecordDataset(
        tfrecords(f), num_parallel_reads=2)),
    Row("TextLineDataset", lambda f: cv.data.TextLineDataset(texts(f))),
    Row("from_generator", lambda f: D.from_generator(  # one unit: one worker runs it whole
        lambda: iter(range(12)), output_signature=cv.data.TensorSpec((), np.int64))),
    # ----- combining datasets
    Row("concatenate", lambda f: D.range(10).concatenate(D.range(100, 107))),
    Row("concatenate of three", lambda f: D.range(4).concatenate(
        D.from_tensor_slices(np.arange(50, 55))).concatenate(D.range(90, 93))),
    Row("zip", lambda f: D.zip(D.range(12), D.range(12).map(lambda x: x * 10))),
    # lock-step: unit u of each, so the pairs are the local pairs even split across workers
    Row("zip of unequal lengths", lambda f: D.zip(D.range(6), D.range(100, 120))),
    Row("zip of a dict, nested", lambda f: D.zip(
        {"a": D.range(8), "b": D.zip(D.range(8), D.range(8).concatenate(D.range(3)))})),
    Row("sample_from_datasets", lambda f: D.sample_from_datasets(
        [D.range(10), D.range(100, 106)], weights=[0.7, 0.3], seed=5)),
    Row("choose_from_datasets", lambda f: D.choose_from_datasets(
        [D.range(6), D.range(100, 106)], D.from_tensor_slices(np.array([0, 1, 1, 0] * 5)),
        stop_on_empty_dataset=False)),
    # Every worker reads the whole choice dataset (as in TensorFlow) and stops at its own
    # first empty input: nothing twice, but which elements come depends on the split.
    Row("choose_from_datasets(stop_on_empty)", lambda f: D.choose_from_datasets(
        [D.range(6), D.range(100, 106)], D.from_tensor_slices(np.array([0, 1] * 6))),
        assert_no_repeats_within(list(range(6)) + list(range(100, 106)))),
    Row("interleave", lambda f: D.range(5).interleave(
        lambda x: D.range(x * 10, x * 10 + 3), cycle_length=2, block_length=2)),
    Row("interleave(num_parallel_calls)", lambda f: D.range(5).interleave(
        lambda x: D.from_tensors(x).repeat(3), cycle_length=3, num_parallel_calls=2)),
    Row("flat_map", lambda f: D.range(6).flat_map(lambda x: D.range(x))),
    # ----- element-wise
    Row("map", lambda f: D.range(20).map(lambda x: (x, x * x))),
    Row("map(num_parallel_calls)", lambda f: D.range(20).map(lambda x: -x, num_parallel_calls=3)),
    Row("filter", lambda f: D.range(30).filter(lambda x: x % 3 == 0)),
    Row("prefetch", lambda f: D.range(20).prefetch(4)),
    Row("shuffle", lambda f: D.range(25).shuffle(8, seed=3)),
    Row("cache", lambda f: D.range(15).cache()),
    Row("cache then repeat", lambda f: D.range(10).cache().repeat(2)),
    Row("with_options", lambda f: D.range(10).with_options(cv.data.Options(deterministic=True))),
    Row("take_while", lambda f: D.range(20).take_while(lambda x: x < 9)),  # each worker's units
    # come in increasing order, so each stops at its first unit >= 9 with all its smaller ones
    # ----- repeat
    Row("repeat", lambda f: D.range(7).repeat(3)),  # each epoch is a repetition with its splits
    Row("repeat inside zip", lambda f: D.zip(D.range(12), D.range(4).repeat(3))),
    Row("repeat inside concatenate", lambda f: D.range(3).repeat(2).concatenate(D.range(5))),
    # ----- batching, applied per worker to the units it was handed
    Row("batch", lambda f: D.range(22).batch(4), assert_rows_once(4)),
    Row("batch(drop_remainder)", lambda f: D.range(24).batch(4, drop_remainder=True),
        assert_full_batches(4)),
    Row("padded_batch", lambda f: D.range(10).map(arange_of).padded_batch(3),
        assert_padded_rows_once),
    Row("unbatch", lambda f: D.range(21).batch(4).unbatch()),
    Row("rebatch", lambda f: D.range(21).batch(4).rebatch(3), assert_rows_once(3)),
    # ----- counting ops, applied per worker (as in TensorFlow)
    Row("take", lambda f: D.range(30).take(5), assert_no_repeats_within(list(range(30)))),
    Row("skip", lambda f: D.range(30).skip(5), assert_no_repeats_within(list(range(30)))),
    Row("shard", lambda f: D.range(30).shard(3, 1), assert_no_repeats_within(list(range(30)))),
    Row("enumerate", lambda f: D.range(15).map(lambda x: x * 2).enumerate(),
        assert_enumerated_per_worker),
    # ----- grouping and stateful transformations, applied per worker to its units
    Row("group_by_window", lambda f: D.range(20).group_by_window(
        lambda x: x % 2, lambda key, window: window.batch(3), window_size=3), assert_rows_once(3)),
    Row("bucket_by_sequence_length", lambda f: D.range(1, 12).map(arange_of)
        .bucket_by_sequence_length(lambda x: np.int32(len(x)), [4, 8], [3, 3, 3]),
        assert_padded_rows_once),
    Row("window", lambda f: D.range(20).window(3).flat_map(lambda w: w.batch(3)),
        assert_rows_once(3)),
    Row("scan", lambda f: D.range(20).scan(np.int64(0), lambda count, x: (count + 1, x))),
    Row("unique", lambda f: D.range(20).map(lambda x: x % 7).unique(), assert_same_values),
    Row("ignore_errors", lambda f: D.range(20).map(fails_on_fives).ignore_errors()),
    Row("ragged_batch", lambda f: D.range(10).map(arange_of).ragged_batch(3),
        assert_ragged_rows_once),
    Row("sparse_batch", lambda f: D.range(10).map(arange_of).sparse_batch(3, [10]),
        assert_sparse_rows_once),
    # ----- refused
    Row("cache to a file", lambda f: D.range(6).cache(str(f / "cache")).map(lambda x: x),
        None, "cache"),
    Row("counter", lambda f: D.counter().take(5), None, "counter"),  # infinite sources
    Row("random", lambda f: D.random(seed=1).take(5), None, "random"),
    Row("rejection_resample", lambda f: D.range(10).rejection_resample(  # made of random
        lambda x: x % 2, [0.5, 0.5], seed=1), None, "random"),
    Row("load", lambda f: D.load(saved(f)), None, "load"),
    Row("snapshot", lambda f: D.range(12).snapshot(str(f / "snapshot")), None, "snapshot"),
    # ----- an endless repeat inside a combining op copies its input's units without end
    Row("endless repeat inside zip", lambda f: D.zip(D.range(7), D.range(3).repeat())),
    Row("endless repeat inside choose_from_datasets", lambda f: D.choose_from_datasets(
        [D.range(6), D.from_tensors(-1).repeat()], D.from_tensor_slices(np.array([0, 1] * 8)),
        stop_on_empty_dataset=False), assert_endless_input_per_worker(-1)),
]


# ----- running it ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[1, 3], ids=lambda n: f"{n}-workers")
def cluster(request: pytest.FixtureRequest) -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=request.param, heartbeat_interval_ms=50) as local:
        yield local


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dynamic-files")
    for f in range(NUM_FILES):
        with cv.data.TFRecordWriter(str(directory / f"part-{f}.tfrecord")) as writer:
            for r in range(RECORDS_PER_FILE):
                writer.write(f"record {r} of file {f}".encode())
        (directory / f"part-{f}.txt").write_text(
            "".join(f"line {r} of file {f}\n" for r in range(RECORDS_PER_FILE)))
    return directory


def distribute(dataset: D, cluster: InProcessCluster) -> D:
    return dataset.apply(cv.data.service.distribute(DYNAMIC, cluster.target))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_op_under_dynamic(row: Row, cluster: InProcessCluster, files: Path) -> None:
    if row.check is None:
        with pytest.raises(InvalidArgumentError, match=f"DYNAMIC sharding cannot split "
                                                       f"`{row.refused}`"):
            distribute(row.build(files), cluster)
        return
    local = list(row.build(files))
    got = list(distribute(row.build(files), cluster))
    row.check(local, got, len(cluster.workers))


def test_every_op_has_a_row() -> None:
    names = {row.name.split("(")[0].split(" ")[0].split("+")[0] for row in ROWS}
    ops = {"range", "from_tensor_slices", "from_tensors", "list_files", "TFRecordDataset",
           "TextLineDataset", "from_generator", "concatenate", "zip", "sample_from_datasets",
           "choose_from_datasets", "interleave", "flat_map", "map", "filter", "prefetch",
           "shuffle", "cache", "with_options", "take_while", "repeat", "batch", "padded_batch",
           "unbatch", "rebatch", "take", "skip", "shard", "enumerate", "group_by_window",
           "bucket_by_sequence_length", "window", "scan", "unique", "ignore_errors",
           "ragged_batch", "sparse_batch", "snapshot", "counter", "random",
           "rejection_resample", "load"}
    assert ops <= names
    transformations = {name for name in dir(D) if not name.startswith("_")}
    not_ops = {"apply", "as_numpy_iterator", "cardinality", "element_spec", "options",
               "reduce", "get_single_element", "save"}
    assert transformations - not_ops <= ops


@pytest.mark.timeout(60)
def test_a_service_read_is_refused_at_distribute(cluster: InProcessCluster) -> None:
    inner = D.range(5).apply(cv.data.service.distribute("parallel_epochs", cluster.target))
    with pytest.raises(InvalidArgumentError, match="cannot split `distribute`: it reads "
                                                   "another data service job"):
        distribute(inner.map(lambda x: x + 1), cluster)


@pytest.mark.timeout(60)
def test_from_dataset_id_refuses_at_job_creation(cluster: InProcessCluster) -> None:
    unsplittable = D.zip(D.range(4), D.counter())
    dataset_id = cv.data.service.register_dataset(cluster.target, unsplittable)
    reader = cv.data.service.from_dataset_id(DYNAMIC, cluster.target, dataset_id)
    with pytest.raises(UnimplementedError, match="DYNAMIC sharding needs"):
        list(reader)
    # Registered all the same: OFF reads it, every worker the whole of it.
    off = cv.data.service.from_dataset_id("parallel_epochs", cluster.target, dataset_id)
    assert multiset(list(off)) == multiset(list(unsplittable) * len(cluster.workers))


@pytest.mark.timeout(60)
def test_lock_step_pairs_hold_across_workers(cluster: InProcessCluster) -> None:
    """The zip and concatenate rows above mean little if one worker took every split: here
    each element is slow enough that every worker gets some, and the pairs still line up."""
    def tagged(a: Any, b: Any) -> tuple[Any, Any, str]:
        time.sleep(0.004)
        return a, b, threading.current_thread().name  # each task runs on its own thread

    pairs = D.zip(D.range(60), D.range(60).concatenate(D.range(5)).map(lambda x: x * 3))
    got = list(distribute(pairs.map(tagged), cluster))
    assert sorted((int(a), int(b)) for a, b, _ in got) == [(i, 3 * i) for i in range(60)]
    assert len({task for _, _, task in got}) == len(cluster.workers)
