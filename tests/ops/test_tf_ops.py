"""convoy's ops give TensorFlow 2.21's results (fixtures/tf_ops.json, by make_tf_ops.py)."""

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv

CASES = json.loads((Path(__file__).parent / "fixtures" / "tf_ops.json").read_text())["cases"]


def decode(value: dict[str, Any]) -> Any:
    if "py" in value:
        return value["py"]
    if "list" in value:
        return [decode(v) for v in value["list"]]
    if "ragged" in value:
        return cv.RaggedTensor.from_nested_row_splits(decode(value["ragged"]),
                                                      value["nested_row_splits"])
    if "sparse" in value:
        return cv.SparseTensor(*[decode(v) for v in value["sparse"]])
    if value["dtype"] == "bytes":
        data = [base64.b64decode(v) for v in value["data"]]
        if value["shape"] == []:
            return data[0]
        array = np.empty(len(data), dtype=object)
        array[:] = data
        return array.reshape(value["shape"])
    return np.array(value["data"], dtype=value["dtype"]).reshape(value["shape"])


def op(name: str) -> Any:
    fn: Any = cv
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn


def tolerance(case: dict[str, Any]) -> float:
    name, kwargs = case["op"], case["kwargs"]
    if name in ("image.resize", "image.resize_with_pad") and kwargs.get("method") != "nearest":
        return 1e-4
    if name == "image.per_image_standardization":
        return 1e-4
    return 1e-6


def is_jpeg(case: dict[str, Any]) -> bool:
    first = case["args"][0]
    return case["op"].startswith("io.decode") and \
        base64.b64decode(first["data"][0]).startswith(b"\xff\xd8")


def assert_same(got: Any, want: Any, case: dict[str, Any]) -> None:
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, case)
    elif isinstance(want, cv.RaggedTensor):
        assert isinstance(got, cv.RaggedTensor)
        for g, w in zip(got.nested_row_splits, want.nested_row_splits):
            np.testing.assert_array_equal(g, w)
        assert_same(got.flat_values, want.flat_values, case)
    elif isinstance(want, cv.SparseTensor):
        for g, w in zip((got.indices, got.values, got.dense_shape),
                        (want.indices, want.values, want.dense_shape)):
            assert_same(g, w, case)
    else:
        got = np.array(got, dtype=object) if isinstance(got, bytes) else np.asarray(got)
        want = np.array(want, dtype=object) if isinstance(want, bytes) else want
        assert got.shape == want.shape
        assert got.dtype == want.dtype, f"dtype {got.dtype}, TensorFlow's {want.dtype}"
        if is_jpeg(case):  # IDCT variants differ: a mean difference of at most 1 in 255
            scale = 255 if want.dtype.kind == "f" else 1
            assert np.abs(got.astype(float) - want).mean() * scale <= 1
        elif want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=0, atol=tolerance(case))
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['op']}" for i, c in enumerate(CASES)])
def test_matches_tensorflow(case: dict[str, Any]) -> None:
    if case["op"].startswith("io."):
        pytest.importorskip("PIL")
    args = [decode(a) for a in case["args"]]
    got = op(case["op"])(*args, **case["kwargs"])
    if case["op"] == "unique":
        got = [got.y, got.idx]
    assert_same(got, decode(case["result"]), case)
