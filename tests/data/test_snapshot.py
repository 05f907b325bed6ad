"""Dataset.snapshot: computed once into files (TensorFlow's layout), read afterwards.

Most tests are ported from tensorflow/python/data/experimental/kernel_tests/snapshot_test.py
(SnapshotDatasetTest); each names its source.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy.data._persistence import _load, _save
from convoy.errors import InvalidArgumentError

CPUS = os.cpu_count() or 1


def write_tfrecords(directory: Path, num_files: int = 10, num_records: int = 100) -> list[str]:
    names = []
    for f in range(num_files):
        name = str(directory / f"tf_record.{f}.txt")
        with cv.data.TFRecordWriter(name) as writer:
            for r in range(num_records):
                writer.write(b"Record %d of file %d" % (r, f))
        names.append(name)
    return names


EXPECTED_RECORDS = [b"Record %d of file %d" % (r, f) for f in range(10) for r in range(100)]


def assert_snapshot_directory(directory: Path, fingerprints: int, runs: int,
                              shards: int) -> None:
    """TensorFlow's layout, plus the element spec convoy keeps beside the metadata."""
    listed = sorted(os.listdir(directory))
    assert len(listed) == fingerprints
    for fingerprint in listed:
        entries = sorted(os.listdir(directory / fingerprint))
        assert entries[runs:] == ["dataset_spec.pb", "snapshot.metadata"]
        for run in entries[:runs]:
            assert sorted(os.listdir(directory / fingerprint / run)) == \
                [f"{i:08d}.shard" for i in range(shards)]


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    path = tmp_path / "snapshot"
    path.mkdir()
    return path


def test_create_snapshot_dataset(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testCreateSnapshotDataset."""
    cv.data.Dataset.from_tensors([1, 2, 3]).snapshot(str(snapshot_dir))


def test_read_snapshot_default(tmp_path: Path, snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testReadSnapshotDatasetDefault (the second pipeline
    reads the snapshot: its input files are gone)."""
    files = write_tfrecords(tmp_path)
    dataset = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir))
    assert list(dataset) == EXPECTED_RECORDS
    assert_snapshot_directory(snapshot_dir, 1, 1, min(CPUS, 1000))
    for name in files:
        os.remove(name)
    again = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir))
    assert list(again) == EXPECTED_RECORDS


def test_read_snapshot_custom_shard_func(tmp_path: Path, snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testReadSnapshotDatasetCustomShardFn."""
    files = write_tfrecords(tmp_path)
    dataset = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir),
                                                      shard_func=lambda _: np.int64(0))
    assert list(dataset) == EXPECTED_RECORDS
    assert_snapshot_directory(snapshot_dir, 1, 1, 1)
    for name in files:
        os.remove(name)
    again = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir), shard_func=lambda _: 0)
    assert list(again) == EXPECTED_RECORDS


def test_read_snapshot_custom_reader_func(tmp_path: Path, snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testReadSnapshotDatasetCustomReaderFn."""
    files = write_tfrecords(tmp_path)

    def reader(datasets: cv.data.Dataset) -> cv.data.Dataset:
        return datasets.interleave(lambda x: x, cycle_length=4, num_parallel_calls=4)

    dataset = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir), reader_func=reader)
    assert list(dataset) == EXPECTED_RECORDS
    assert_snapshot_directory(snapshot_dir, 1, 1, CPUS)
    for name in files:
        os.remove(name)
    again = cv.data.TFRecordDataset(files).snapshot(str(snapshot_dir), reader_func=reader)
    assert sorted(again) == sorted(EXPECTED_RECORDS)


def test_invalid_shard_func(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testSnapshotDatasetInvalidShardFn (refused at the first
    element: a Python function's result is known only once it runs)."""
    dataset = cv.data.Dataset.range(1000).snapshot(str(snapshot_dir),
                                                   shard_func=lambda _: "invalid_fn")
    with pytest.raises(InvalidArgumentError, match="scalar int64"):
        next(iter(dataset))


def test_invalid_reader_func(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testSnapshotDatasetInvalidReaderFn."""
    with pytest.raises(TypeError):
        cv.data.Dataset.range(1000).snapshot(str(snapshot_dir), reader_func=lambda x: x + 1)


def test_write_simple(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotDatasetSimple."""
    dataset = cv.data.Dataset.range(1000).snapshot(str(snapshot_dir))
    assert list(dataset) == list(range(1000))
    assert_snapshot_directory(snapshot_dir, 1, 1, CPUS)
    assert [int(x) for x in dataset] == list(range(1000))  # now read from the snapshot
    assert dataset.cardinality() == 1000


def test_write_multiple_fingerprints(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotDatasetMultipleFingerprints."""
    assert list(cv.data.Dataset.range(1000).snapshot(str(snapshot_dir))) == list(range(1000))
    assert list(cv.data.Dataset.range(2000).snapshot(str(snapshot_dir))) == list(range(2000))
    assert_snapshot_directory(snapshot_dir, 2, 1, CPUS)


def test_same_fingerprint_multiple_complete_runs(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotDatasetSameFingerprintMultipleCompleteRuns
    (the second pipeline reads what the first wrote: one run)."""
    assert list(cv.data.Dataset.range(1000).snapshot(str(snapshot_dir))) == list(range(1000))
    second = cv.data.Dataset.range(1000).snapshot(str(snapshot_dir))
    assert [int(x) for x in second] == list(range(1000))
    assert_snapshot_directory(snapshot_dir, 1, 1, CPUS)


def test_same_fingerprint_incomplete_run_restart(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotDatasetSameFingerprintIncompleteRunRestart
    (an unfinished snapshot is not read: the second iterator writes a run of its own)."""
    first = iter(cv.data.Dataset.range(1000).snapshot(str(snapshot_dir)))
    assert [next(first) for _ in range(500)] == list(range(500))
    second = iter(cv.data.Dataset.range(1000).snapshot(str(snapshot_dir)))
    assert [next(second) for _ in range(500)] == list(range(500))
    for i in range(500, 1000):
        assert next(first) == i and next(second) == i
    for iterator in (first, second):
        with pytest.raises(StopIteration):
            next(iterator)
    assert_snapshot_directory(snapshot_dir, 1, 2, CPUS)


def test_custom_shard_function(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotCustomShardFunction."""
    dataset = cv.data.Dataset.range(1000).enumerate().snapshot(
        str(snapshot_dir), shard_func=lambda i, _: i % 2).map(lambda _, elem: elem)
    assert list(dataset) == list(range(1000))
    assert_snapshot_directory(snapshot_dir, 1, 1, 2)


def test_write_tuples(snapshot_dir: Path) -> None:
    """Ported from snapshot_test.py: testWriteSnapshotDatasetWithTuples."""
    dataset = cv.data.Dataset.zip(tuple(cv.data.Dataset.range(k * 1000, (k + 1) * 1000)
                                        for k in range(4))).snapshot(str(snapshot_dir))
    expected = [(i, i + 1000, i + 2000, i + 3000) for i in range(1000)]
    assert list(dataset) == expected
    assert_snapshot_directory(snapshot_dir, 1, 1, CPUS)
    assert [tuple(int(x) for x in e) for e in dataset] == expected


@pytest.mark.parametrize("compression", ["AUTO", None, "GZIP"])
def test_compressions_read_back(snapshot_dir: Path, compression: str | None) -> None:
    def build() -> cv.data.Dataset:
        return cv.data.Dataset.range(50).map(lambda i: {"i": i, "s": b"x" * int(i)}).snapshot(
            str(snapshot_dir), compression=compression)

    expected = list(build())
    read = list(build())
    assert [(int(e["i"]), e["s"]) for e in read] == [(e["i"], e["s"]) for e in expected]


# ----- iterator checkpoints: exactly once within an epoch ----------------------------------------
def snapshot_contents(snapshot_dir: Path) -> list[int]:
    """Every element in the files of the finalized run (AUTO: SNAPPY), shard after shard."""
    (fingerprint,) = os.listdir(snapshot_dir)
    metadata = _save.read_metadata(str(snapshot_dir / fingerprint))
    assert metadata is not None and metadata.finalized
    op = _load.reader_op(str(snapshot_dir / fingerprint / metadata.run_id), "SNAPPY",
                         cv.data.TensorSpec([], np.int64), lambda d: d.flat_map(lambda s: s))
    return [int(x) for x in cv.data.Dataset(op)]


@pytest.mark.parametrize("position", [0, 1, 37, 99, 100])
def test_checkpoint_while_writing_resumes_exactly_once(snapshot_dir: Path,
                                                       position: int) -> None:
    """A writing iterator saved at ``position`` and restored over a new build of the pipeline
    (as after a crash) finishes the same run: each element is in the snapshot once. The
    original went on writing after the checkpoint; restoring drops what it wrote then."""
    def build() -> cv.data.Dataset:
        return cv.data.Dataset.range(100).snapshot(str(snapshot_dir))

    original = iter(build())
    head = [int(next(original)) for _ in range(position)]
    state = pickle.loads(pickle.dumps(original.state_dict()))
    for _ in range(min(10, 100 - position)):  # written after the checkpoint, then "crashed"
        next(original)
    original.close()
    restored = iter(build())
    restored.load_state_dict(state)
    assert head + [int(x) for x in restored] == list(range(100))
    assert sorted(snapshot_contents(snapshot_dir)) == list(range(100))
    assert [int(x) for x in build()] == list(range(100))


def test_checkpoint_while_reading(snapshot_dir: Path) -> None:
    dataset = cv.data.Dataset.range(60).snapshot(str(snapshot_dir))
    list(dataset)
    iterator = iter(dataset)
    head = [int(next(iterator)) for _ in range(25)]
    state = iterator.state_dict()
    restored = iter(cv.data.Dataset.range(60).snapshot(str(snapshot_dir)))
    restored.load_state_dict(state)
    assert head + [int(x) for x in restored] == list(range(60))


def test_an_interrupted_write_restarts_cleanly(snapshot_dir: Path) -> None:
    """Without a checkpoint, a run that stopped early is left unfinalized; the next iteration
    writes a complete run of its own and later ones read it."""
    dataset = cv.data.Dataset.range(30).snapshot(str(snapshot_dir))
    iterator = iter(dataset)
    [next(iterator) for _ in range(10)]
    iterator.close()
    assert list(dataset) == list(range(30))
    assert [int(x) for x in dataset] == list(range(30))
    assert_snapshot_directory(snapshot_dir, 1, 2, CPUS)


# ----- the fingerprint ---------------------------------------------------------------------------
FINGERPRINT = """
import numpy as np, convoy as cv
from convoy.data._persistence._snapshot import fingerprint
scale = np.array([{scale}])
ds = cv.data.Dataset.range(10).map(lambda x: x * scale).batch(2)
print(fingerprint(ds._op))
"""


def test_the_fingerprint_is_stable_across_processes() -> None:
    def run(scale: int) -> str:
        return subprocess.run([sys.executable, "-c", FINGERPRINT.format(scale=scale)],
                              capture_output=True, text=True, check=True,
                              timeout=120).stdout.strip()

    first, second, other = run(2), run(2), run(3)
    assert first == second and first.isdigit()
    assert other != first
