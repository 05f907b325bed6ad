"""convoy parses records TensorFlow wrote to the values TensorFlow parsed them to (the fixtures
come from fixtures/make_fixtures.py, run once with TensorFlow); and TensorFlow parses records
convoy's message classes wrote (where the project's .venv-tf exists)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.testing import assert_equal

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
TF_PYTHON = ROOT / ".venv-tf" / "bin" / "python"
io = cv.io

EXAMPLE_FEATURES = {
    "id": io.FixedLenFeature([], np.int64),
    "big": io.FixedLenFeature([5], np.int64),
    "scores": io.FixedLenFeature([2, 3], np.float32),
    "name": io.FixedLenFeature([], bytes),
    "optional": io.FixedLenFeature([2], np.float32, default_value=[-1.0, -2.0]),
    "tokens": io.VarLenFeature(bytes),
    "ids": io.VarLenFeature(np.int64),
    "weights": io.FixedLenSequenceFeature([], np.float32, allow_missing=True,
                                          default_value=-9.0),
    "ragged_ids": io.RaggedFeature(np.int64, value_key="rids"),
    "sparse": io.SparseFeature("idx", "val", np.float32, 10),
    "nested": io.RaggedFeature(np.int64, value_key="flat", partitions=[
        io.RaggedFeature.RowLengths("row_lengths")]),
}
CONTEXT_FEATURES = {"length": io.FixedLenFeature([], np.int64),
                    "label": io.FixedLenFeature([], "string")}
SEQUENCE_FEATURES = {
    "frames": io.FixedLenSequenceFeature([3], np.float32, allow_missing=True),
    "words": io.VarLenFeature(object),
    "counts": io.RaggedFeature(np.int64),
}


def records(name: str) -> list[bytes]:
    return list(cv.data.TFRecordDataset(str(FIXTURES / name)).as_numpy_iterator())


def expected(npz: Any, prefix: str, key: str) -> Any:
    """TensorFlow's value of ``key`` as convoy represents it."""
    name = f"{prefix}{key}"
    if f"{name}.indices" in npz:
        return cv.SparseTensor(npz[f"{name}.indices"], npz[f"{name}.values"],
                               npz[f"{name}.dense_shape"])
    if f"{name}.flat_values" in npz:
        splits = [npz[f"{name}.row_splits{i}"].astype(np.int64)
                  for i in range(4) if f"{name}.row_splits{i}" in npz]
        return cv.RaggedTensor.from_nested_row_splits(npz[f"{name}.flat_values"], splits)
    value = npz[name]
    if value.dtype.kind == "S":  # a scalar string
        return np.array(value.item(), dtype=object)
    return value


def test_parse_example_matches_tensorflow() -> None:
    npz = np.load(FIXTURES / "examples_parsed.npz", allow_pickle=True)
    parsed = io.parse_example(records("examples.tfrecord"), EXAMPLE_FEATURES)
    assert sorted(parsed) == sorted(EXAMPLE_FEATURES)
    for key, value in parsed.items():
        assert_equal(value, expected(npz, "", key), key)


def test_parse_single_example_matches_tensorflow() -> None:
    npz = np.load(FIXTURES / "examples_parsed.npz", allow_pickle=True)
    parsed = io.parse_single_example(records("examples.tfrecord")[3], EXAMPLE_FEATURES)
    for key, value in parsed.items():
        want = expected(npz, "single/", key)
        if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 0:
            value = np.array(value.item(), dtype=object)
        elif not isinstance(value, (np.ndarray, cv.SparseTensor, cv.RaggedTensor)):
            value = np.array(value, dtype=want.dtype)
        assert_equal(value, want, key)


def test_parse_sequence_example_matches_tensorflow() -> None:
    npz = np.load(FIXTURES / "sequence_examples_parsed.npz", allow_pickle=True)
    context, lists, lengths = io.parse_sequence_example(
        records("sequence_examples.tfrecord"), CONTEXT_FEATURES, SEQUENCE_FEATURES)
    for key, value in context.items():
        assert_equal(value, expected(npz, "context/", key), key)
    for key, value in lists.items():
        assert_equal(value, expected(npz, "lists/", key), key)
    assert_equal(lengths, {"frames": npz["lengths/frames"]})


def test_parse_single_sequence_example_matches_tensorflow() -> None:
    npz = np.load(FIXTURES / "sequence_examples_parsed.npz", allow_pickle=True)
    context, lists = io.parse_single_sequence_example(
        records("sequence_examples.tfrecord")[3], CONTEXT_FEATURES, SEQUENCE_FEATURES)
    assert context["label"] == npz["single_context/label"].item()
    assert context["length"] == npz["single_context/length"]
    for key, value in lists.items():
        assert_equal(value, expected(npz, "single_lists/", key), key)


def test_the_messages_serialize_as_tensorflows() -> None:
    """Our Example messages read TensorFlow's records and write them back to the same size
    (map entries may come in another order) and the same message."""
    for name, message in (("examples.tfrecord", io.Example),
                          ("sequence_examples.tfrecord", io.SequenceExample)):
        for record in records(name):
            parsed = message.FromString(record)
            again = parsed.SerializeToString()
            assert len(again) == len(record) and message.FromString(again) == parsed


@pytest.mark.skipif(not TF_PYTHON.exists(),
                    reason="TensorFlow's environment (.venv-tf, made by `make bench-tf`) is "
                           "absent")
def test_tensorflow_parses_what_convoy_wrote(tmp_path: Path) -> None:
    path = tmp_path / "written.tfrecord"
    with cv.data.TFRecordWriter(path) as writer:
        for i in range(3):
            example = cv.train.Example(features=cv.train.Features(feature={
                "i": cv.train.Feature(int64_list=cv.train.Int64List(value=[i, -i])),
                "f": cv.train.Feature(float_list=cv.train.FloatList(value=[i / 2])),
                "s": cv.train.Feature(bytes_list=cv.train.BytesList(value=[b"x" * i])),
            }))
            writer.write(example.SerializeToString())
    code = textwrap.dedent(f"""
        import json, tensorflow as tf
        features = {{"i": tf.io.FixedLenFeature([2], tf.int64),
                     "f": tf.io.FixedLenFeature([], tf.float32),
                     "s": tf.io.VarLenFeature(tf.string)}}
        ds = tf.data.TFRecordDataset({str(path)!r}).batch(3).map(
            lambda r: tf.io.parse_example(r, features))
        out = next(iter(ds))
        print(json.dumps({{"i": out["i"].numpy().tolist(), "f": out["f"].numpy().tolist(),
                          "s": [v.decode() for v in out["s"].values.numpy()]}}))
    """)
    done = subprocess.run([str(TF_PYTHON), "-c", code], capture_output=True, text=True,
                          timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"i": [[0, 0], [1, -1], [2, -2]], "f": [0.0, 0.5, 1.0],
                      "s": ["", "x", "xx"]}
    ours = io.parse_example(records_of(path), {"i": io.FixedLenFeature([2], np.int64)})
    assert ours["i"].tolist() == result["i"]


def records_of(path: Path) -> list[bytes]:
    return list(cv.data.TFRecordDataset(str(path)).as_numpy_iterator())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
