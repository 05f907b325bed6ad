"""Scenarios of TensorFlow's distributed save tests (tensorflow/python/data/experimental/
kernel_tests/service/): ``distributed_save_test.py``, ``distributed_save_load_test.py`` and
``distributed_save_load_ft_test.py``, ported to convoy. Every test names the TensorFlow test it
comes from. testSaveLoad, testCompression, testRepeatedDataset, testLoadWithCustomReaderFunc,
testBadDispatcherAddress, testBadCardinality, testDuplicateSnapshot, testWorkerFailure,
testBadElementSpec and testBadCompression (on a save TensorFlow wrote) are in
tests/data/test_distributed_save_layout.py; the dispatcher restarts of
``distributed_save_ft_test.py`` are in test_distributed_save_ft.py.

TensorFlow's "v2" load (``load_op._load_distributed_snapshot_v2``) reads a save while it is
written; convoy's is ``Dataset.load(path, wait=True)``. Where convoy differs:

- DYNAMIC sharding hands out the chunks of a complete save (as TensorFlow's split provider
  does), but refuses a save still being written (its chunks cannot be numbered yet; TensorFlow
  hands them out as they come). The DYNAMIC scenarios wait for the save to be done first.
- A load that finds the save failed raises InvalidArgumentError when it is built, DataLossError
  when the failure comes while it reads; TensorFlow raises the pipeline's own error.
- test_snapshot_chunks_cardinality counts the elements of ``load`` (TensorFlow's counts its
  internal dataset of chunks, which convoy does not expose).

Not ported: the graph-mode halves of every combination (convoy has no graphs).
"""

from __future__ import annotations

import itertools
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data import INFINITE_CARDINALITY
from convoy.data.service import ShardingPolicy
from convoy.errors import DataLossError, InvalidArgumentError, NotFoundError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service
distributed_save = cv.data.experimental.distributed_save

pytestmark = pytest.mark.timeout(90)

POLICIES = pytest.mark.parametrize("policy", [ShardingPolicy.OFF, ShardingPolicy.DYNAMIC],
                                   ids=["OFF", "DYNAMIC"])


def wait_for_save(path: Path, timeout_s: float = 60) -> None:
    """Until the save at ``path`` is marked DONE or ERROR (TensorFlow's _wait_for_snapshot)."""
    deadline = time.monotonic() + timeout_s
    while not ((path / "DONE").exists() or (path / "ERROR").exists()):
        assert time.monotonic() < deadline, f"the save at {path} did not end in {timeout_s} s"
        time.sleep(0.05)


def values(elements: Any) -> list[Any]:
    """Elements as plain Python values (tuples of them for tuples), to compare."""
    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(plain(v) for v in x)
        return x if isinstance(x, bytes) else np.asarray(x).item()
    return [plain(x) for x in elements]


def same_items(actual: list[Any], expected: list[Any]) -> None:
    assert sorted(actual, key=repr) == sorted(expected, key=repr)


def save_and_load(cluster: Any, dataset: Dataset, path: Path, **kwargs: Any) -> list[Any]:
    distributed_save(dataset, path, cluster.address, **kwargs)
    wait_for_save(path)
    return values(Dataset.load(path))


# ----- distributed_save_test.py ----------------------------------------------------------------
@pytest.mark.parametrize("repeated", [False, True], ids=["sliced", "repeated"])
def test_choose_from_datasets(make_cluster: Any, tmp_path: Path, repeated: bool) -> None:
    """Ported from distributed_save_test.py: testChooseFromDatasets,
    testChooseFromRepeatedDatasets (one worker, one chunk: the order carries over)."""
    cluster = make_cluster(1)
    if repeated:
        inputs = [Dataset.from_tensors(x).repeat(5) for x in "abc"]
    else:
        inputs = [Dataset.from_tensor_slices([x] * 5) for x in "abc"]
    dataset = Dataset.choose_from_datasets(inputs, Dataset.range(3).repeat())
    assert save_and_load(cluster, dataset, tmp_path / "saved") == [b"a", b"b", b"c"] * 5


@pytest.mark.parametrize("num_workers", [1, 3])
def test_write_multiple_datasets(make_cluster: Any, tmp_path: Path, num_workers: int) -> None:
    """Ported from distributed_save_test.py: testWriteMultipleDatasets (two saves at once)."""
    cluster = make_cluster(num_workers)
    chosen = Dataset.choose_from_datasets([Dataset.from_tensors(x).repeat(5) for x in "abc"],
                                          Dataset.range(3).repeat())
    distributed_save(Dataset.range(100), tmp_path / "snapshot1", cluster.address)
    distributed_save(chosen, tmp_path / "snapshot2", cluster.address)
    wait_for_save(tmp_path / "snapshot1")
    wait_for_save(tmp_path / "snapshot2")
    first = values(Dataset.load(tmp_path / "snapshot1"))
    second = values(Dataset.load(tmp_path / "snapshot2"))
    if num_workers == 1:
        assert first == list(range(100))
        assert second == [b"a", b"b", b"c"] * 5
    same_items(first, list(range(100)))
    same_items(second, [b"a", b"b", b"c"] * 5)


@pytest.mark.parametrize("num_workers", [1, 3])
@POLICIES
def test_distributed_load(make_cluster: Any, tmp_path: Path, read_within: Any,
                          num_workers: int, policy: ShardingPolicy) -> None:
    """Ported from distributed_save_test.py: testDistributedLoad (a complete save read through
    the data service: every worker reads it under OFF, the workers share its chunks under
    DYNAMIC)."""
    cluster = make_cluster(num_workers)
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address)
    wait_for_save(tmp_path / "saved")
    dataset = Dataset.load(tmp_path / "saved").apply(service.distribute(policy, cluster.target))
    expected = list(range(10)) * (num_workers if policy == ShardingPolicy.OFF else 1)
    same_items(values(read_within(dataset, 60)), expected)


def test_imbalanced_zip_and_repeat(make_cluster: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testImbalancedZipAndRepeat."""
    cluster = make_cluster(1)
    dataset = Dataset.zip((Dataset.range(200), Dataset.range(1000))).repeat(3)
    same_items(save_and_load(cluster, dataset, tmp_path / "saved"),
               [(i, i) for i in range(200)] * 3)


def test_snapshot_does_not_exist(cluster1: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testSnapshotDoesNotExist."""
    with pytest.raises(NotFoundError, match="Could not find metadata file"):
        Dataset.load(tmp_path / "nothing").apply(
            service.distribute(ShardingPolicy.OFF, cluster1.target))


def test_bad_compression(make_cluster: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testBadElementSpec, testBadCompression (on a save
    convoy wrote; AUTO writes SNAPPY, as TensorFlow's does)."""
    cluster = make_cluster(1)
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address,
                     compression="AUTO")
    wait_for_save(tmp_path / "saved")
    with pytest.raises(InvalidArgumentError, match="User specified element_spec "
                                                   "bad_element_spec, but the actual "
                                                   "element_spec is TensorSpec"):
        Dataset.load(tmp_path / "saved", element_spec="bad_element_spec")
    with pytest.raises(InvalidArgumentError, match="User specified compression ZLIB, but the "
                                                   "actual compression is SNAPPY"):
        Dataset.load(tmp_path / "saved", compression="ZLIB")


def assert_checkpoints(dataset: Dataset, num_outputs: int) -> None:
    """The checks of TensorFlow's checkpoint_test_base in short: an iterator saved after ``k``
    elements and restored (after a pickle round trip, into a fresh iterator) yields the rest."""
    expected = values(dataset)
    assert len(expected) == num_outputs
    for k in sorted({0, 1, num_outputs // 2, num_outputs - 1, num_outputs}):
        iterator = iter(dataset)
        head = values(itertools.islice(iterator, k))
        state = pickle.loads(pickle.dumps(iterator.state_dict()))
        rest = values(iterator)
        assert head + rest == expected
        restored = iter(dataset)
        restored.load_state_dict(state)
        assert values(restored) == rest


def test_load_checkpoint(make_cluster: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: LoadCheckpointTest.testLoadCheckpoint."""
    cluster = make_cluster(1)
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address)
    wait_for_save(tmp_path / "saved")
    assert_checkpoints(Dataset.load(tmp_path / "saved"), num_outputs=10)


# ----- distributed_save_load_test.py: reading a save while it is written -----------------------
@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize(("num_elements", "num_repetitions"), [(0, 1), (10, 1), (10, 3)])
@pytest.mark.parametrize("compression", [None, "AUTO", "GZIP"])
def test_save_load(make_cluster: Any, tmp_path: Path, read_within: Any, num_workers: int,
                   num_elements: int, num_repetitions: int, compression: str | None) -> None:
    """Ported from distributed_save_load_test.py: test_save_load (the empty dataset once, not
    once per repetition count)."""
    cluster = make_cluster(num_workers)
    distributed_save(Dataset.range(num_elements).repeat(num_repetitions), tmp_path / "saved",
                     cluster.address, compression=compression)
    loaded = Dataset.load(tmp_path / "saved", wait=True)  # without waiting for DONE
    same_items(values(read_within(loaded, 60)), list(range(num_elements)) * num_repetitions)


@pytest.mark.parametrize("num_workers", [1, 3])
def test_concurrent_save_load(make_cluster: Any, tmp_path: Path, num_workers: int) -> None:
    """Ported from distributed_save_load_test.py: test_concurrent_save_load (the load starts
    before the save does, and waits for it)."""
    cluster = make_cluster(num_workers)
    loaded: list[Any] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            loaded.extend(values(Dataset.load(tmp_path / "saved", wait=True)))
        except BaseException as error:
            errors.append(error)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    time.sleep(1.0)
    assert reader.is_alive(), "the load did not wait for the save to start"
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address)
    reader.join(60)
    assert not reader.is_alive() and not errors, errors
    same_items(loaded, list(range(10)))


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("num_elements", [0, 10])
@pytest.mark.parametrize("repeated_load", [1, 5])
@POLICIES
def test_distributed_load_while_saving(make_cluster: Any, tmp_path: Path, read_within: Any,
                                       num_workers: int, num_elements: int,
                                       repeated_load: int, policy: ShardingPolicy) -> None:
    """Ported from distributed_save_load_test.py: test_distributed_load (under DYNAMIC once
    the save is done; see the module's docstring)."""
    cluster = make_cluster(num_workers)
    distributed_save(Dataset.range(num_elements), tmp_path / "saved", cluster.address)
    if policy == ShardingPolicy.DYNAMIC:
        wait_for_save(tmp_path / "saved")
    dataset = Dataset.load(tmp_path / "saved", wait=True)
    if repeated_load > 1:
        dataset = dataset.repeat(repeated_load)
    dataset = dataset.apply(service.distribute(policy, cluster.target))
    expected = list(range(num_elements)) * repeated_load
    if policy == ShardingPolicy.OFF:
        expected *= num_workers
    same_items(values(read_within(dataset, 60)), expected)


def test_dynamic_sharding_refuses_a_save_being_written(make_cluster: Any,
                                                       tmp_path: Path) -> None:
    """DYNAMIC cannot number the chunks of a save still being written: refused, naming it."""
    path = tmp_path / "saved"
    path.mkdir()
    from convoy.data._persistence import _distributed_snapshot as layout

    layout.write_metadata(str(path), cv.data.TensorSpec([], np.int64), None)
    cluster = make_cluster(1)
    with pytest.raises(InvalidArgumentError, match="distributed save at .* is still being "
                                                   "written"):
        Dataset.load(path, wait=True).apply(
            service.distribute(ShardingPolicy.DYNAMIC, cluster.target))


@pytest.mark.parametrize("num_workers", [1, 3])
def test_save_before_sample(make_cluster: Any, tmp_path: Path, num_workers: int) -> None:
    """Ported from distributed_save_load_test.py: test_save_before_sample."""
    cluster = make_cluster(num_workers)
    for i in range(3):
        distributed_save(Dataset.range(10), tmp_path / f"dataset_{i}", cluster.address)
    loaded = [Dataset.load(tmp_path / f"dataset_{i}", wait=True) for i in range(3)]
    dataset = Dataset.sample_from_datasets(loaded, weights=[1.0] * 3,
                                           stop_on_empty_dataset=False)
    same_items(values(dataset), list(range(10)) * 3)


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("num_repetitions", [1, 3])
def test_save_after_sample(make_cluster: Any, tmp_path: Path, num_workers: int,
                           num_repetitions: int) -> None:
    """Ported from distributed_save_load_test.py: test_save_after_sample."""
    cluster = make_cluster(num_workers)
    inputs = [Dataset.range(10).repeat(num_repetitions) for _ in range(3)]
    dataset = Dataset.sample_from_datasets(inputs, weights=[1.0] * 3,
                                           stop_on_empty_dataset=False)
    distributed_save(dataset, tmp_path / "saved", cluster.address)
    same_items(values(Dataset.load(tmp_path / "saved", wait=True)),
               list(range(10)) * 3 * num_repetitions)


@pytest.mark.parametrize("num_workers", [1, 3])
def test_enumerate(make_cluster: Any, tmp_path: Path, num_workers: int) -> None:
    """Ported from distributed_save_load_test.py: test_enumerate (each stream enumerates its
    own elements: the indexes are 0..8 only with one worker)."""
    cluster = make_cluster(num_workers)
    dataset = Dataset.from_tensor_slices(["a", "b", "c"]).repeat(3).enumerate()
    distributed_save(dataset, tmp_path / "saved", cluster.address)
    indexes, elements = zip(*values(Dataset.load(tmp_path / "saved", wait=True)))
    if num_workers == 1:
        assert sorted(indexes) == list(range(9))
    same_items(list(elements), [b"a", b"b", b"c"] * 3)


def test_worker_failure(make_cluster: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_load_test.py: test_worker_failure (a pipeline that raises
    fails the save, and a load waiting for it)."""
    def check_numerics(x: Any) -> Any:
        if np.isnan(x):
            raise InvalidArgumentError("message: Tensor had NaN values")
        return x

    cluster = make_cluster(1)
    components = np.array([1.0, 2.0, 3.0, np.nan, 5.0], np.float32)
    distributed_save(Dataset.from_tensor_slices(components).map(check_numerics),
                     tmp_path / "saved", cluster.address)
    with pytest.raises((InvalidArgumentError, DataLossError), match="failed to write it"):
        list(Dataset.load(tmp_path / "saved", wait=True))


@pytest.mark.parametrize("num_repetitions", [None, 0, 1, 3])
def test_snapshot_chunks_cardinality(make_cluster: Any, tmp_path: Path,
                                     num_repetitions: int | None) -> None:
    """Ported from distributed_save_load_test.py: test_snapshot_chunks_cardinality (see the
    module's docstring)."""
    cluster = make_cluster(1)
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address)
    wait_for_save(tmp_path / "saved")
    dataset = Dataset.load(tmp_path / "saved")
    if num_repetitions != 1:
        dataset = dataset.repeat(num_repetitions)
    expected = INFINITE_CARDINALITY if num_repetitions is None else 10 * num_repetitions
    assert dataset.cardinality() == expected


def test_save_load_checkpoint(make_cluster: Any, tmp_path: Path) -> None:
    """Ported from distributed_save_load_test.py: SaveLoadCheckpointTest (the checkpoints of a
    load that waits for the save)."""
    cluster = make_cluster(1)
    distributed_save(Dataset.range(10), tmp_path / "saved", cluster.address)
    assert_checkpoints(Dataset.load(tmp_path / "saved", wait=True), num_outputs=10)
    assert os.path.exists(tmp_path / "saved" / "DONE")
