"""distributed_save's layout (TensorFlow's distributed snapshot): reading what TensorFlow wrote,
and writing it through the data service.

The fixtures distributed_saved* were written by TensorFlow 2.21 through a one-worker data
service (tests/data/fixtures/make_snappy_and_distributed.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.errors import AlreadyExistsError, InvalidArgumentError
from convoy.testing import InProcessCluster, ProcessCluster

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
TF_PYTHON = Path(__file__).parents[2] / ".venv-tf" / "bin" / "python"
needs_tf = pytest.mark.skipif(not TF_PYTHON.exists(),
                              reason="TensorFlow's environment (.venv-tf, `make bench-tf`) "
                                     "is not installed")


def run_tensorflow(script: str) -> Any:
    completed = subprocess.run(
        [str(TF_PYTHON), "-c", textwrap.dedent(script)], capture_output=True, text=True,
        timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    return np.asarray(value).tolist()


def key(element: Any) -> str:
    return json.dumps(element, sort_keys=True)


# ----- convoy reads what TensorFlow's distributed_save wrote -----------------------------------
@pytest.mark.parametrize("name", ["distributed_saved", "distributed_saved_none"])
def test_loads_what_tensorflow_distributed_save_wrote(name: str) -> None:
    dataset = cv.data.Dataset.load(FIXTURES / name)
    assert dataset.element_spec == {"id": cv.data.TensorSpec([], np.int64),
                                    "name": cv.data.TensorSpec([], bytes),
                                    "vector": cv.data.TensorSpec([3], np.float32)}
    assert dataset.cardinality() == 12
    assert sorted(map(key, map(plain, dataset))) == sorted(map(key, EXPECTED[name]))


def test_load_checks_the_given_spec_and_compression() -> None:
    """Ported from distributed_save_test.py: testBadElementSpec, testBadCompression."""
    with pytest.raises(InvalidArgumentError, match="User specified element_spec"):
        cv.data.Dataset.load(FIXTURES / "distributed_saved", element_spec="bad_element_spec")
    with pytest.raises(InvalidArgumentError,
                       match="User specified compression GZIP, but the actual compression "
                             "is SNAPPY"):
        cv.data.Dataset.load(FIXTURES / "distributed_saved", compression="GZIP")


def test_load_with_custom_reader_func(tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testLoadWithCustomReaderFunc (chunks copied to
    make several)."""
    path = tmp_path / "saved"
    shutil.copytree(FIXTURES / "distributed_saved_none", path)
    for chunk in list((path / "chunks").iterdir()):
        for i in range(2):
            stream, index, count = chunk.name.split("_")[1:]
            shutil.copy(chunk, chunk.with_name(f"chunk_{stream}_{int(index) + 10 * (i + 1)}_"
                                               f"{count}"))
    dataset = cv.data.Dataset.load(
        path, reader_func=lambda chunks: chunks.shuffle(3).interleave(
            lambda x: x, num_parallel_calls=cv.data.AUTOTUNE))
    assert dataset.cardinality() == 36
    assert sorted(int(e["id"]) for e in dataset) == sorted(list(range(12)) * 3)


def test_a_failed_save_says_so(tmp_path: Path) -> None:
    path = tmp_path / "saved"
    shutil.copytree(FIXTURES / "distributed_saved", path)
    (path / "ERROR").write_text("a worker's pipeline raised")
    with pytest.raises(InvalidArgumentError, match="failed to write it"):
        cv.data.Dataset.load(path)


# ----- convoy writes through the data service: ported from tensorflow/python/data/experimental/
# kernel_tests/service/distributed_save_test.py and distributed_save_ft_test.py ----------------
def saved_ids(path: Path) -> list[int]:
    return sorted(int(x) for x in cv.data.Dataset.load(path, wait=True))


@pytest.mark.parametrize(("num_workers", "num_elements"), [(1, 0), (1, 10), (3, 10000)])
def test_save_load(tmp_path: Path, num_workers: int, num_elements: int) -> None:
    """Ported from distributed_save_test.py: testSaveLoad."""
    with InProcessCluster(num_workers=num_workers) as cluster:
        cv.data.experimental.distributed_save(cv.data.Dataset.range(num_elements),
                                              tmp_path / "saved", cluster.address)
        assert saved_ids(tmp_path / "saved") == list(range(num_elements))
    loaded = cv.data.Dataset.load(tmp_path / "saved")
    assert loaded.cardinality() == num_elements
    assert (tmp_path / "saved" / "DONE").exists()


def test_the_dispatcher_marks_the_save_done_when_its_last_worker_cannot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker that finished the last stream is lost before it writes ``DONE``: the
    dispatcher has written it already (TensorFlow's dispatcher writes it too)."""
    from convoy.data._persistence import _distributed_snapshot as layout
    from convoy.data.service import _worker_save

    class LostBeforeDone:  # the worker's view of the layout, minus its final DONE
        def __getattr__(self, name: str) -> Any:
            return getattr(layout, name)

        def mark(self, path: str, name: str, text: str = "") -> None:
            if not (name == layout.DONE_FILE and Path(path) == tmp_path / "saved"):
                layout.mark(path, name, text)

    monkeypatch.setattr(_worker_save, "layout", LostBeforeDone())
    with InProcessCluster(num_workers=1) as cluster:
        cv.data.experimental.distributed_save(cv.data.Dataset.range(10), tmp_path / "saved",
                                              cluster.address)
        assert saved_ids(tmp_path / "saved") == list(range(10))


def test_waiting_for_a_save_no_one_writes_ends_in_an_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from convoy.data._persistence import _distributed_snapshot as layout

    monkeypatch.setattr(layout, "STALL_TIMEOUT_S", 0.5)
    (tmp_path / "saved").mkdir()
    layout.write_metadata(str(tmp_path / "saved"), cv.data.TensorSpec([], np.int64), None)
    with pytest.raises(cv.errors.DeadlineExceededError, match="distributed save at .*saved"):
        list(cv.data.Dataset.load(tmp_path / "saved", wait=True))


def test_waiting_for_metadata_no_one_writes_ends_in_an_error_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from convoy.data._persistence import _distributed_snapshot as layout

    monkeypatch.setattr(layout, "STALL_TIMEOUT_S", 0.5)
    with pytest.raises(cv.errors.DeadlineExceededError, match="metadata to .*never"):
        cv.data.Dataset.load(tmp_path / "never", wait=True)


def test_a_load_waiting_when_the_metadata_appears_reads_it_as_what_it_is(
        tmp_path: Path) -> None:
    """A load waiting for a save that has not started reads the distributed save's text
    metadata once it appears. (Its kind is decided from one reading of the file: reading it
    twice once took a file written between the two readings for ``save``'s binary record.)"""
    from convoy.data._persistence import _distributed_snapshot as layout

    path = tmp_path / "saved"
    path.mkdir()
    loaded: list[cv.data.Dataset] = []
    waiter = threading.Thread(
        target=lambda: loaded.append(cv.data.Dataset.load(path, wait=True)), daemon=True)
    waiter.start()
    time.sleep(0.3)
    layout.write_metadata(str(path), cv.data.TensorSpec([], np.int64), None)
    layout.mark(str(path), layout.DONE_FILE)
    waiter.join(30)
    assert loaded and list(loaded[0]) == []


@pytest.mark.parametrize("compression", [None, "AUTO", "GZIP"])
def test_compression(tmp_path: Path, compression: str | None) -> None:
    """Ported from distributed_save_test.py: testCompression."""
    with InProcessCluster(num_workers=1) as cluster:
        cv.data.experimental.distributed_save(cv.data.Dataset.range(10), tmp_path / "saved",
                                              cluster.address, compression=compression)
        assert saved_ids(tmp_path / "saved") == list(range(10))


@pytest.mark.parametrize("num_workers", [1, 3])
def test_repeated_dataset(tmp_path: Path, num_workers: int) -> None:
    """Ported from distributed_save_test.py: testRepeatedDataset."""
    with InProcessCluster(num_workers=num_workers) as cluster:
        cv.data.experimental.distributed_save(cv.data.Dataset.range(1000).repeat(3),
                                              tmp_path / "saved", cluster.address)
        assert saved_ids(tmp_path / "saved") == sorted(list(range(1000)) * 3)


def test_refusals(tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testBadDispatcherAddress, testBadCardinality,
    testDuplicateSnapshot."""
    dataset = cv.data.Dataset.range(10)
    with pytest.raises(ValueError, match="must be a string"):
        cv.data.experimental.distributed_save(dataset, "", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        cv.data.experimental.distributed_save(dataset, "", "")
    with InProcessCluster(num_workers=1) as cluster:
        with pytest.raises(InvalidArgumentError, match="infinite dataset is not allowed"):
            cv.data.experimental.distributed_save(dataset.repeat(), tmp_path / "a",
                                                  cluster.address)
        cv.data.experimental.distributed_save(dataset, tmp_path / "b", cluster.address)
        with pytest.raises(AlreadyExistsError, match="already started or completed"):
            cv.data.experimental.distributed_save(dataset, tmp_path / "b", cluster.address)


def test_a_failing_pipeline_fails_the_save(tmp_path: Path) -> None:
    """Ported from distributed_save_test.py: testWorkerFailure (check_numerics on a NaN)."""
    def check_numerics(x: Any) -> Any:
        if np.isnan(x):
            raise InvalidArgumentError("message: Tensor had NaN values")
        return x

    components = np.array([1.0, 2.0, 3.0, np.nan, 5.0], np.float32)
    with InProcessCluster(num_workers=1) as cluster:
        cv.data.experimental.distributed_save(
            cv.data.Dataset.from_tensor_slices(components).map(check_numerics),
            tmp_path / "saved", cluster.address)
        deadline = time.monotonic() + 60
        while not (tmp_path / "saved" / "ERROR").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with pytest.raises(InvalidArgumentError, match="failed to write it"):
        cv.data.Dataset.load(tmp_path / "saved")


def test_a_worker_killed_mid_save_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """Ported from distributed_save_ft_test.py: testWorkerFailure (one of several workers is
    SIGKILLed while it writes; another takes its stream over). Every element is saved once."""
    num_elements = 4000

    def slow(x: Any) -> Any:
        time.sleep(0.001)
        return x

    with ProcessCluster(num_workers=2, dispatcher_args=["--worker-timeout-ms", "1500"]) \
            as cluster:
        path = tmp_path / "saved"
        cv.data.experimental.distributed_save(cv.data.Dataset.range(num_elements).map(slow),
                                              path, cluster.dispatcher.address)
        deadline = time.monotonic() + 60
        while not list(path.glob("chunks/chunk_*")):  # a chunk or more committed: mid-save
            assert time.monotonic() < deadline, "no chunk was committed"
            time.sleep(0.05)
        assert not (path / "DONE").exists(), "the save ended before the kill"
        cluster.workers[0].kill()
        cluster.add_worker()
        assert saved_ids(path) == list(range(num_elements))


@needs_tf
def test_tensorflow_loads_a_convoy_distributed_save(tmp_path: Path) -> None:
    with InProcessCluster(num_workers=2) as cluster:
        cv.data.experimental.distributed_save(
            cv.data.Dataset.range(12).map(lambda i: {"id": i, "name": str(i).encode()}),
            tmp_path / "saved", cluster.address)
        saved_ids_ = sorted(int(e["id"]) for e in cv.data.Dataset.load(tmp_path / "saved",
                                                                        wait=True))
        assert saved_ids_ == list(range(12))
    result = run_tensorflow(f"""
        import json
        import tensorflow as tf
        ds = tf.data.Dataset.load({str(tmp_path / "saved")!r})
        print(json.dumps(sorted([int(e["id"]), e["name"].decode()]
                                for e in ds.as_numpy_iterator())))
    """)
    assert result == [[i, str(i)] for i in range(12)]


def test_sparse_and_ragged_components_are_saved_as_save_saves_them(tmp_path: Path) -> None:
    ragged = cv.RaggedTensor.from_row_lengths(np.arange(10), [3, 0, 4, 3])
    sparse = cv.SparseTensor(indices=[[0, 1], [2, 0]], values=np.array([1.0, 2.0]),
                             dense_shape=[4, 3])
    dataset = cv.data.Dataset.from_tensor_slices({"r": ragged, "s": sparse, "x": np.arange(4)})
    with InProcessCluster(num_workers=1) as cluster:
        cv.data.experimental.distributed_save(dataset, tmp_path / "saved", cluster.address)
        loaded = sorted(cv.data.Dataset.load(tmp_path / "saved", wait=True),
                        key=lambda e: int(e["x"]))
    assert cv.data.Dataset.load(tmp_path / "saved").element_spec == dataset.element_spec
    assert [e["r"].tolist() for e in loaded] == ragged.to_list()
    assert [e["s"].to_dense().tolist() for e in loaded] == sparse.to_dense().tolist()
