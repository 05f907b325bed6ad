"""serialize_tensor / parse_tensor: byte-compatible with tf.io.serialize_tensor / parse_tensor."""

import json
import pathlib

import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError
from convoy.io import tensor_pb2

FIXTURES = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "serialized_tensors.json").read_text())


def _expected(entry: dict) -> np.ndarray:
    if entry["dtype"] == "string":
        flat = np.array(entry["value"], dtype=object).ravel().tolist() if entry["value"] else []
        array = np.empty(len(flat), dtype=object)
        array[:] = [s.encode("latin-1") for s in flat]
        return array.reshape(entry["shape"])
    if entry["dtype"].startswith("complex"):
        return np.array([complex(*z) for z in entry["value"]], dtype=entry["dtype"])
    return np.array(entry["value"], dtype=entry["dtype"]).reshape(entry["shape"])


@pytest.mark.parametrize("entry", FIXTURES, ids=lambda e: e["name"])
def test_parses_what_tensorflow_serialized(entry: dict) -> None:
    out_type = bytes if entry["dtype"] == "string" else entry["dtype"]
    parsed = cv.io.parse_tensor(bytes.fromhex(entry["serialized"]), out_type)
    expected = _expected(entry)
    assert parsed.dtype == expected.dtype and parsed.shape == expected.shape
    assert parsed.tolist() == expected.tolist()


@pytest.mark.parametrize("entry", FIXTURES, ids=lambda e: e["name"])
def test_serializes_the_bytes_tensorflow_writes(entry: dict) -> None:
    assert cv.io.serialize_tensor(_expected(entry)).hex() == entry["serialized"]


def test_python_values_and_str() -> None:
    """Python ints are int64, floats float64, str is utf-8 bytes (tf.constant's choices,
    except that float stays float64 as numpy stores it)."""
    assert cv.io.parse_tensor(cv.io.serialize_tensor(7), np.int64).tolist() == 7
    assert cv.io.parse_tensor(cv.io.serialize_tensor([1.5]), np.float64).tolist() == [1.5]
    parsed = cv.io.parse_tensor(cv.io.serialize_tensor(["é", b"b"]), "string")
    assert parsed.tolist() == ["é".encode(), b"b"]


def test_type_mismatch_names_both_types() -> None:
    """Ported from tensorflow/python/kernel_tests/io_ops/parsing_ops_test.py:
    ParseTensorOpTest.testInvalidTypes."""
    serialized = cv.io.serialize_tensor(np.array([1.0], np.float32))
    with pytest.raises(InvalidArgumentError, match=r"parsed tensor \(float32\).*\(float64\)"):
        cv.io.parse_tensor(serialized, np.float64)


def test_malformed_input_is_an_error() -> None:
    """Ported from parsing_ops_test.py: ParseTensorOpTest.testInvalidInput."""
    with pytest.raises(InvalidArgumentError, match="TensorProto"):
        cv.io.parse_tensor(b"\xff\xff\xff", np.float32)
    with pytest.raises(InvalidArgumentError, match="serialized"):
        cv.io.parse_tensor(3, np.float32)
    with pytest.raises(InvalidArgumentError, match="out_type"):
        cv.io.parse_tensor(b"", "not-a-dtype")


def test_a_single_value_fills_the_shape() -> None:
    """TensorFlow's rule for *_val fields: fewer values than elements repeat the last."""
    proto = tensor_pb2.TensorProto(dtype=tensor_pb2.DT_INT32, int_val=[4])
    proto.tensor_shape.dim.add(size=3)
    assert cv.io.parse_tensor(proto.SerializeToString(), np.int32).tolist() == [4, 4, 4]


def test_round_trip_keeps_shape_and_dtype() -> None:
    for value in (np.arange(24, dtype=np.uint16).reshape(2, 3, 4), np.array(True),
                  np.array([[b"x"]], dtype=object)):
        parsed = cv.io.parse_tensor(cv.io.serialize_tensor(value), value.dtype)
        assert parsed.dtype == value.dtype and parsed.shape == value.shape
        assert parsed.tolist() == value.tolist()
