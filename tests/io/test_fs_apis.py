"""Every convoy API that takes a path, on s3:// URLs against the S3 test server: the same
results as on local paths, and never a local folder named ``s3:``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy._base import fs as _fs
from convoy.errors import DataLossError, NotFoundError

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def bucket(s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket; the test runs in an empty directory that must stay empty."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield s3_bucket
    assert os.listdir(work) == [], "a URL was written as a local path"


def _write_records(url: str, records: list[bytes], compression: str | None = None) -> None:
    with cv.data.TFRecordWriter(url, compression) as writer:
        for record in records:
            writer.write(record)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_tfrecord_write_and_read(bucket: str, compression: str | None) -> None:
    records = [b"record %d" % i for i in range(100)]
    _write_records(f"{bucket}/data/x.tfrecord", records, compression)
    read = cv.data.TFRecordDataset(f"{bucket}/data/x.tfrecord", compression_type=compression)
    assert [bytes(r) for r in read.as_numpy_iterator()] == records


def test_tfrecord_writer_leaves_nothing_when_interrupted(bucket: str) -> None:
    with pytest.raises(RuntimeError), cv.data.TFRecordWriter(f"{bucket}/x.tfrecord") as writer:
        writer.write(b"half")
        raise RuntimeError("stopped")
    assert not _fs.exists(f"{bucket}/x.tfrecord")


def test_list_files_globs_a_bucket_with_tensorflows_order(bucket: str) -> None:
    for i in (3, 1, 2):
        _write_records(f"{bucket}/shards/part-{i}.tfrecord", [b"%d" % i])
    _write_records(f"{bucket}/shards/other.txt", [b"no"])
    pattern = f"{bucket}/shards/part-*.tfrecord"
    files = list(cv.data.Dataset.list_files(pattern, shuffle=False).as_numpy_iterator())
    assert files == [f"{bucket}/shards/part-{i}.tfrecord".encode() for i in (1, 2, 3)]
    # a seed makes the shuffled order repeat from one dataset to the next, as in TensorFlow
    orders = [list(cv.data.Dataset.list_files(pattern, seed=7).as_numpy_iterator())
              for _ in range(2)]
    assert orders[0] == orders[1] and sorted(orders[0]) == files
    read = cv.data.Dataset.list_files(pattern, shuffle=False).interleave(
        cv.data.TFRecordDataset, cycle_length=3)
    assert sorted(read.as_numpy_iterator()) == [b"1", b"2", b"3"]
    with pytest.raises(NotFoundError):
        cv.data.Dataset.list_files(f"{bucket}/shards/none-*")


def test_text_lines_and_csv(bucket: str) -> None:
    with _fs.open_file(f"{bucket}/t.csv", "w") as file:
        file.write("a,b\n1,2.5\n3,4.5\n")
    lines = cv.data.TextLineDataset(f"{bucket}/t.csv").as_numpy_iterator()
    assert list(lines) == [b"a,b", b"1,2.5", b"3,4.5"]
    csv = cv.data.experimental.CsvDataset(f"{bucket}/t.csv", [np.int32, np.float32],
                                          header=True)
    assert [(int(a), float(b)) for a, b in csv.as_numpy_iterator()] == [(1, 2.5), (3, 4.5)]
    made = cv.data.experimental.make_csv_dataset(f"{bucket}/*.csv", batch_size=2,
                                                 num_epochs=1, shuffle=False)
    batch = next(iter(made))
    assert list(batch["a"]) == [1, 3]


def test_save_and_load(bucket: str) -> None:
    dataset = cv.data.Dataset.range(10).map(lambda x: (x, x * 2))
    dataset.save(f"{bucket}/saved")
    loaded = cv.data.Dataset.load(f"{bucket}/saved")
    assert list(loaded.as_numpy_iterator()) == list(dataset.as_numpy_iterator())
    assert loaded.cardinality() == 10


def test_snapshot_writes_then_reads(bucket: str) -> None:
    dataset = cv.data.Dataset.range(20).snapshot(f"{bucket}/snap")
    assert list(dataset.as_numpy_iterator()) == list(range(20))
    assert _fs.glob(f"{bucket}/snap/*/snapshot.metadata")
    assert list(dataset.as_numpy_iterator()) == list(range(20))


def test_cache_to_a_url(bucket: str) -> None:
    calls = []

    def count(x: np.int64) -> np.int64:
        calls.append(1)
        return x

    dataset = cv.data.Dataset.range(5).map(count).cache(f"{bucket}/cache/c")
    assert list(dataset.as_numpy_iterator()) == list(range(5))
    assert list(dataset.as_numpy_iterator()) == list(range(5))
    assert len(calls) == 5


def test_an_unfinished_cache_pass_leaves_no_object(bucket: str) -> None:
    dataset = cv.data.Dataset.range(5).cache(f"{bucket}/c")
    iterator = iter(dataset)
    next(iterator)
    del iterator
    import gc

    gc.collect()
    assert not _fs.glob(f"{bucket}/c*")


def test_checkpoint_save_restore_manager(bucket: str) -> None:
    variable = cv.Variable(np.arange(4, dtype=np.float32))
    checkpoint = cv.train.Checkpoint(v=variable)
    first = checkpoint.save(f"{bucket}/ckpt/model")
    assert first == f"{bucket}/ckpt/model-1.safetensors"
    assert cv.train.latest_checkpoint(f"{bucket}/ckpt") == first
    variable.assign(np.zeros(4, np.float32))
    checkpoint.restore(first)
    assert list(variable.numpy()) == [0, 1, 2, 3]
    written = checkpoint.write(f"{bucket}/one/w")
    checkpoint.read(written)
    manager = cv.train.CheckpointManager(checkpoint, f"{bucket}/managed", max_to_keep=2)
    for _ in range(3):
        manager.save()
    assert len(manager.checkpoints) == 2
    assert _fs.listdir(f"{bucket}/managed") == sorted(
        ["checkpoint.json", *(os.path.basename(p) for p in manager.checkpoints)])
    again = cv.train.CheckpointManager(checkpoint, f"{bucket}/managed", max_to_keep=2)
    assert again.latest_checkpoint == manager.latest_checkpoint


def test_a_truncated_checkpoint_is_data_loss(bucket: str) -> None:
    checkpoint = cv.train.Checkpoint(v=cv.Variable(np.ones(1000, np.float32)))
    path = checkpoint.write(f"{bucket}/c")
    _fs.atomic_write(path, _fs.read_bytes(path)[:-100])
    with pytest.raises(DataLossError, match=path):
        checkpoint.read(path)


def test_missing_object_is_not_found_naming_the_url(bucket: str) -> None:
    with pytest.raises(NotFoundError, match=f"{bucket}/nope.tfrecord"):
        list(cv.data.TFRecordDataset(f"{bucket}/nope.tfrecord"))
    with pytest.raises(NotFoundError, match="-gone/x.tfrecord"):
        list(cv.data.TFRecordDataset(f"{bucket}-gone/x.tfrecord"))


def test_distributed_save_and_load(bucket: str) -> None:
    from convoy.testing import InProcessCluster

    with InProcessCluster(num_workers=2) as cluster:
        cv.data.experimental.distributed_save(cv.data.Dataset.range(100),
                                              f"{bucket}/dsaved", cluster.address)
        waited = cv.data.Dataset.load(f"{bucket}/dsaved", wait=True)
        assert sorted(int(x) for x in waited) == list(range(100))
    assert _fs.exists(f"{bucket}/dsaved/DONE")
    assert cv.data.Dataset.load(f"{bucket}/dsaved").cardinality() == 100


def test_dispatcher_with_a_missing_bucket_is_one_line_exit_1(s3_bucket: str,
                                                             tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "convoy", "dispatcher", "--port", "0", "--fault-tolerant",
         "--work-dir", f"{s3_bucket}-missing/work"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{s3_bucket}-missing/work" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and os.listdir(tmp_path) == []


def test_a_truncated_tfrecord_object_is_data_loss_naming_the_url(bucket: str) -> None:
    url = f"{bucket}/cut.tfrecord"
    _write_records(url, [b"x" * 100] * 3)
    _fs.atomic_write(url, _fs.read_bytes(url)[:-10])
    with pytest.raises(DataLossError, match=url):
        list(cv.data.TFRecordDataset(url))


def test_tfrecord_writer_sync_and_flush_on_a_url(bucket: str) -> None:
    url = f"{bucket}/synced.tfrecord"
    with cv.data.TFRecordWriter(url) as writer:
        writer.write(b"a")
        writer.flush()
        writer.sync()
        writer.write(b"b")
    assert list(cv.data.TFRecordDataset(url).as_numpy_iterator()) == [b"a", b"b"]
