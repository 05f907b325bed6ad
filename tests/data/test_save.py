"""Dataset.save / Dataset.load in TensorFlow's on-disk format, both ways.

Fixtures in tests/data/fixtures/ were written by TensorFlow 2.21 (make_saved_datasets.py,
make_snappy_and_distributed.py);
where TensorFlow is installed (.venv-tf at the repository root) it also reads what convoy wrote.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.data import service
from convoy.errors import (
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)
from convoy.io import snapshot_pb2
from convoy.testing import InProcessCluster

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
TF_PYTHON = Path(__file__).parents[2] / ".venv-tf" / "bin" / "python"
needs_tf = pytest.mark.skipif(not TF_PYTHON.exists(),
                              reason="TensorFlow's environment (.venv-tf, `make bench-tf`) "
                                     "is not installed")


def plain(value: Any) -> Any:
    """An element as JSON-like data (the form of expected.json)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    return np.asarray(value).tolist()


def fixture_element(i: int) -> dict[str, Any]:
    """What the fixtures' pipeline makes, in convoy."""
    return {"id": np.int64(i), "vector": np.array([i, i + 1, i + 2], np.float32) / 2,
            "name": f"item-{i}".encode()}


# ----- convoy reads what TensorFlow wrote ------------------------------------------------------
@pytest.mark.parametrize(("name", "compression"),
                         [("saved_dict", None), ("saved_dict_gzip", "GZIP"),
                          ("saved_dict_snappy", "SNAPPY")])
def test_loads_what_tensorflow_saved(name: str, compression: str | None) -> None:
    dataset = cv.data.Dataset.load(FIXTURES / name, compression=compression)
    assert dataset.element_spec == {"id": cv.data.TensorSpec([], np.int64),
                                    "name": cv.data.TensorSpec([], bytes),
                                    "vector": cv.data.TensorSpec([3], np.float32)}
    assert dataset.cardinality() == 5
    assert [plain(e) for e in dataset] == EXPECTED[name]


def test_a_gzip_directory_read_uncompressed_says_what_to_pass() -> None:
    with pytest.raises(InvalidArgumentError, match="compression='GZIP'"):
        list(cv.data.Dataset.load(FIXTURES / "saved_dict_gzip"))


def test_loads_tensorflow_shards_in_reader_func_order() -> None:
    """TensorFlow wrote shard i % 3 for element i; flat_map reads shard after shard."""
    dataset = cv.data.Dataset.load(FIXTURES / "saved_tuple_sharded",
                                   reader_func=lambda shards: shards.flat_map(lambda s: s))
    assert [int(i) for i, _ in dataset] == [0, 3, 6, 1, 4, 2, 5]
    assert sorted(map(plain, dataset)) == sorted(EXPECTED["saved_tuple_sharded"])


def test_writes_the_bytes_tensorflow_writes(tmp_path: Path) -> None:
    """The same elements make byte-identical shard files and equal metadata and spec."""
    cv.data.Dataset.range(5).map(fixture_element).save(tmp_path)
    ours = glob.glob(str(tmp_path / "*" / "00000000.shard" / "00000000.snapshot"))
    theirs = glob.glob(str(FIXTURES / "saved_dict" / "*" / "00000000.shard" / "*.snapshot"))
    assert Path(ours[0]).read_bytes() == Path(theirs[0]).read_bytes()
    records = []
    for directory in (tmp_path, FIXTURES / "saved_dict"):
        record = snapshot_pb2.SnapshotMetadataRecord.FromString(
            (directory / "snapshot.metadata").read_bytes())
        record.ClearField("run_id")
        record.ClearField("creation_timestamp")
        records.append(record)
    assert records[0] == records[1]
    assert cv.data.Dataset.load(tmp_path).element_spec == \
        cv.data.Dataset.load(FIXTURES / "saved_dict").element_spec


# ----- TensorFlow reads what convoy wrote ------------------------------------------------------
def run_tensorflow(script: str) -> Any:
    completed = subprocess.run(
        [str(TF_PYTHON), "-c", textwrap.dedent(script)], capture_output=True, text=True,
        timeout=240, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


TF_READ = """
    import json, sys
    import tensorflow as tf
    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v.decode() if isinstance(v, bytes) else v.tolist()
    ds = tf.data.Dataset.load(%r, compression=%r, reader_func=lambda s: s.flat_map(lambda x: x))
    spec = tf.nest.map_structure(lambda s: [s.shape.as_list(), s.dtype.name], ds.element_spec)
    print(json.dumps({"spec": spec, "cardinality": int(ds.cardinality()),
                      "elements": [plain(e) for e in ds.as_numpy_iterator()]}))
"""


@needs_tf
@pytest.mark.parametrize("compression", [None, "GZIP", "SNAPPY"])
def test_tensorflow_loads_what_convoy_saved(tmp_path: Path, compression: str | None) -> None:
    cv.data.Dataset.range(5).map(fixture_element).save(tmp_path, compression=compression)
    result = run_tensorflow(TF_READ % (str(tmp_path), compression))
    assert result["spec"] == {"id": [[], "int64"], "name": [[], "string"],
                              "vector": [[3], "float32"]}
    assert result["cardinality"] == 5
    assert result["elements"] == EXPECTED["saved_dict"]


@needs_tf
def test_tensorflow_loads_convoy_shards_and_unknown_sizes(tmp_path: Path) -> None:
    dataset = cv.data.Dataset.from_generator(
        lambda: ((np.int64(i), np.arange(i, dtype=np.int32)) for i in range(6)),
        output_signature=(cv.data.TensorSpec([], np.int64),
                          cv.data.TensorSpec([None], np.int32)))
    dataset.save(tmp_path, shard_func=lambda i, _: i % 2)
    result = run_tensorflow(TF_READ % (str(tmp_path), None))
    assert result["spec"] == [[[], "int64"], [[None], "int32"]]
    assert result["elements"] == [[i, list(range(i))] for i in (0, 2, 4, 1, 3, 5)]


# ----- convoy both ways: ported from tensorflow/python/data/experimental/kernel_tests/io_test.py
@pytest.mark.parametrize("compression", [None, "GZIP", "SNAPPY"])
def test_basic(tmp_path: Path, compression: str | None) -> None:
    """Ported from io_test.py: IOTest.testBasic."""
    dataset = cv.data.Dataset.range(42)
    dataset.save(tmp_path, compression=compression)
    loaded = cv.data.Dataset.load(tmp_path, dataset.element_spec, compression=compression)
    assert [int(x) for x in loaded] == list(range(42))


def test_cardinality(tmp_path: Path) -> None:
    """Ported from io_test.py: IOTest.testCardinality."""
    dataset = cv.data.Dataset.range(42)
    dataset.save(tmp_path)
    assert cv.data.Dataset.load(tmp_path, dataset.element_spec).cardinality() == 42


def test_custom_shard_function(tmp_path: Path) -> None:
    """Ported from io_test.py: IOTest.testCustomShardFunction (the default reader_func
    interleaves the shards)."""
    cv.data.Dataset.range(42).save(tmp_path, shard_func=lambda x: x // 21)
    assert sorted(os.listdir(glob.glob(str(tmp_path / "[0-9]*"))[0])) == \
        ["00000000.shard", "00000001.shard"]
    expected = [x for i in range(21) for x in (i, i + 21)]
    assert [int(x) for x in cv.data.Dataset.load(tmp_path)] == expected


def test_custom_reader_function(tmp_path: Path) -> None:
    """Ported from io_test.py: IOTest.testCustomReaderFunction."""
    cv.data.Dataset.range(42).save(tmp_path, shard_func=lambda x: x % 7)
    loaded = cv.data.Dataset.load(tmp_path, reader_func=lambda d: d.flat_map(lambda y: y))
    assert [int(x) for x in loaded] == [x for i in range(7) for x in range(i, 42, 7)]


def test_element_spec_optional(tmp_path: Path) -> None:
    """Ported from io_test.py: IOTest.testElementSpecOptional."""
    dataset = cv.data.Dataset.zip((
        cv.data.Dataset.range(42),
        cv.data.Dataset.from_tensor_slices({"a": [1, 2], "b": [3, 4]}),
        cv.data.Dataset.from_tensor_slices(([1, 2], [3, 4]))))
    dataset.save(tmp_path)
    loaded = cv.data.Dataset.load(tmp_path)
    assert loaded.element_spec == dataset.element_spec
    assert [plain(e) for e in loaded] == [plain(e) for e in dataset]


def test_repeat_and_prefetch(tmp_path: Path) -> None:
    """Ported from io_test.py: IOTest.testRepeatAndPrefetch."""
    cv.data.Dataset.from_tensor_slices(np.random.rand(16, 32)).save(tmp_path)
    dataset = cv.data.Dataset.load(tmp_path).shuffle(16).batch(16).repeat().prefetch(1)
    iterator = iter(dataset)
    for _ in range(30):
        assert next(iterator).shape == (16, 32)
    iterator.close()


def test_checkpoint_at_every_position(tmp_path: Path) -> None:
    """Ported from io_test.py: LoadCheckpointTest.test (save the iterator anywhere, restore
    it over a new load of the same directory, get the rest)."""
    cv.data.Dataset.range(42).save(tmp_path, shard_func=lambda x: x % 3)
    expected = [int(x) for x in cv.data.Dataset.load(tmp_path)]
    assert sorted(expected) == list(range(42))
    for position in (0, 1, 13, 41, 42):
        iterator = iter(cv.data.Dataset.load(tmp_path))
        head = [int(next(iterator)) for _ in range(position)]
        state = pickle.loads(pickle.dumps(iterator.state_dict()))
        iterator.close()
        restored = iter(cv.data.Dataset.load(tmp_path))
        restored.load_state_dict(state)
        assert head + [int(x) for x in restored] == expected
        restored.close()


def test_empty_dataset(tmp_path: Path) -> None:
    cv.data.Dataset.range(0).save(tmp_path)
    loaded = cv.data.Dataset.load(tmp_path)
    assert loaded.cardinality() == 0 and list(loaded) == []


def test_strings_and_scalars_come_back_as_convoy_makes_them(tmp_path: Path) -> None:
    dataset = cv.data.Dataset.from_tensor_slices(
        {"text": np.array([b"a", b"bc"], object), "flag": np.array([True, False]),
         "grid": np.arange(8, dtype=np.uint8).reshape(2, 2, 2)})
    dataset.save(tmp_path)
    for ours, theirs in zip(cv.data.Dataset.load(tmp_path), dataset, strict=True):
        assert type(ours["text"]) is bytes and ours["text"] == theirs["text"]
        assert ours["flag"].dtype == np.bool_ and ours["flag"] == theirs["flag"]
        assert ours["grid"].dtype == np.uint8 and (ours["grid"] == theirs["grid"]).all()


# ----- refusals ----------------------------------------------------------------------------------
def test_refusals(tmp_path: Path) -> None:
    dataset = cv.data.Dataset.range(3)
    with pytest.raises(UnimplementedError, match="checkpoint_args"):
        dataset.save(tmp_path / "a", checkpoint_args={"directory": str(tmp_path)})
    with pytest.raises(InvalidArgumentError, match="compression"):
        dataset.save(tmp_path / "c", compression="LZMA")
    with pytest.raises(InvalidArgumentError, match="shard_func.*scalar int64"):
        dataset.save(tmp_path / "d", shard_func=lambda x: "invalid")
    with pytest.raises(NotFoundError, match="metadata"):
        cv.data.Dataset.load(tmp_path / "missing")
    dataset.save(tmp_path / "e")
    with pytest.raises(InvalidArgumentError, match="dtypes"):
        cv.data.Dataset.load(tmp_path / "e", element_spec=cv.data.TensorSpec([], np.float32))
    with pytest.raises(InvalidArgumentError, match="reader_func must return a Dataset"):
        cv.data.Dataset.load(tmp_path / "e", reader_func=lambda d: 1)


# ----- the data service ---------------------------------------------------------------------------
def test_a_loaded_dataset_under_the_data_service(tmp_path: Path) -> None:
    cv.data.Dataset.range(20).map(lambda i: (i, np.full(2, i, np.float32))).save(
        tmp_path, shard_func=lambda i, _: i % 4)
    loaded = cv.data.Dataset.load(tmp_path)
    with InProcessCluster(num_workers=2) as cluster:
        read = loaded.apply(service.distribute(service.ShardingPolicy.OFF, cluster.target))
        ids = [int(i) for i, _ in read]
    assert sorted(ids) == sorted(list(range(20)) * 2)  # OFF: every worker reads it all
