"""Saved datasets of every shape, both ways: {dense of varying shape, sparse, ragged, nested} x
{unbatched, batch, padded_batch, ragged_batch} x {no compression, GZIP, SNAPPY}, as
``fixtures/make_saved_matrix.py`` builds them with TensorFlow (whose fixtures, written by
TensorFlow 2.21, convoy loads element for element); where TensorFlow is installed (.venv-tf
at the repository root) TensorFlow loads what convoy saved and saves afresh for convoy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected_matrix.json").read_text())
SCRIPT = FIXTURES / "make_saved_matrix.py"
TF_PYTHON = Path(__file__).parents[2] / ".venv-tf" / "bin" / "python"
needs_tf = pytest.mark.skipif(not TF_PYTHON.exists(),
                              reason="TensorFlow's environment (.venv-tf, `make bench-tf`) "
                                     "is not installed")


def element(kind: str, i: int) -> Any:
    """Element ``i`` of a kind, as make_saved_matrix.py makes it in TensorFlow."""
    if kind == "dense":
        return np.arange(i)
    if kind == "sparse":
        return cv.SparseTensor.from_dense(np.arange(1, i + 1))
    if kind == "ragged":
        return cv.RaggedTensor.from_row_lengths(np.arange(i + 1), [i, 1])
    return {"sparse": element("sparse", i), "ragged": element("ragged", i),
            "t": (np.int64(i * 10), str(i).encode())}


def dataset(case: str) -> Dataset:
    """convoy's pipeline of a case ``<kind>-<batching>-<compression>``."""
    kind, batching, _ = case.split("-")
    result = Dataset.range(1, 4).map(lambda i: element(kind, int(i)))
    return result if batching == "unbatched" else getattr(result, batching)(2)


def compression(case: str) -> str | None:
    name = case.rsplit("-", 1)[-1]
    return None if name == "NONE" else name


def plain(value: Any) -> Any:
    """An element as JSON-like data (the form of expected_matrix.json)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, cv.SparseTensor):
        return {"indices": value.indices.tolist(), "values": value.values.tolist(),
                "dense_shape": value.dense_shape.tolist()}
    if isinstance(value, cv.RaggedTensor):
        return value.to_list()
    if isinstance(value, bytes):
        return value.decode()
    listed = np.asarray(value).tolist()
    return [v.decode() if isinstance(v, bytes) else v for v in listed] \
        if isinstance(listed, list) else listed


def run_tf(*args: str) -> Any:
    completed = subprocess.run(
        [str(TF_PYTHON), str(SCRIPT), *args], capture_output=True, text=True, timeout=400,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_the_matrix_is_whole() -> None:
    """Every kind and batching TensorFlow accepts, in every compression: 36 cases."""
    assert len(EXPECTED) == 36
    assert {case.split("-")[1] for case in EXPECTED} == {"unbatched", "batch", "padded_batch",
                                                          "ragged_batch"}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_loads_what_tensorflow_saved(case: str) -> None:
    loaded = Dataset.load(FIXTURES / "saved_matrix" / case, compression=compression(case))
    elements = list(loaded)
    assert [plain(e) for e in elements] == EXPECTED[case]["elements"]
    assert [plain(e) for e in elements] == [plain(e) for e in dataset(case)]
    spec = loaded.element_spec
    assert all(cv.nest.spec_from_value(e) is not None for e in elements)
    assert cv.nest.flatten(spec)  # a structure of specs, as TensorFlow wrote it


def test_saves_round_trip_in_convoy(tmp_path: Path) -> None:
    for case in sorted(EXPECTED):
        dataset(case).save(tmp_path / case, compression=compression(case))
        loaded = Dataset.load(tmp_path / case, compression=compression(case))
        assert [plain(e) for e in loaded] == EXPECTED[case]["elements"], case


@needs_tf
def test_tensorflow_loads_what_convoy_saved(tmp_path: Path) -> None:
    """Element for element, with TensorFlow's own spec (sizes that vary unknown)."""
    for case in EXPECTED:
        dataset(case).save(tmp_path / case, compression=compression(case))
    found = run_tf("--load", str(tmp_path))
    assert sorted(found) == sorted(EXPECTED)
    for case, expected in EXPECTED.items():
        assert found[case]["elements"] == expected["elements"], case
        assert found[case]["spec"] == expected["spec"], case


@needs_tf
def test_loads_what_tensorflow_saves_now(tmp_path: Path) -> None:
    saved = run_tf("--save", str(tmp_path))
    assert sorted(saved) == sorted(EXPECTED)
    for case, expected in saved.items():
        loaded = Dataset.load(tmp_path / case, compression=compression(case))
        assert [plain(e) for e in loaded] == expected["elements"], case


@needs_tf
def test_tensorflow_loads_a_distributed_save_of_varying_shapes(tmp_path: Path) -> None:
    """The issue's examples through ``distributed_save``: a map's varying shapes and batches
    of sparse rows of varying dense shapes."""
    from convoy.testing import InProcessCluster

    cases = {"dense-unbatched-NONE": None, "sparse-batch-GZIP": "GZIP",
             "nested-ragged_batch-NONE": None}
    with InProcessCluster(num_workers=1) as cluster:
        for case, compression_name in cases.items():
            cv.data.experimental.distributed_save(dataset(case), tmp_path / case,
                                                  cluster.address,
                                                  compression=compression_name)
            loaded = Dataset.load(tmp_path / case, wait=True)
            assert [plain(e) for e in loaded] == EXPECTED[case]["elements"], case
    found = run_tf("--load", str(tmp_path))
    for case in cases:
        assert found[case]["elements"] == EXPECTED[case]["elements"], case


def test_specs_read_off_a_first_element_promise_no_sizes(tmp_path: Path) -> None:
    """The issue's examples: a map's spec is its first element's, and what is derived from
    it (padded_batch, a batch of sparse rows, a save) does not claim that element's sizes."""
    ds = Dataset.range(1, 4).map(lambda i: np.arange(i))
    assert ds.element_spec == cv.data.TensorSpec([1], np.int64)  # what it has seen
    assert ds.padded_batch(2).element_spec == cv.data.TensorSpec([None, None], np.int64)
    sparse = Dataset.range(1, 4).map(lambda i: cv.SparseTensor.from_dense(np.arange(1, i + 1)))
    assert sparse.batch(3).element_spec == cv.data.SparseTensorSpec([None, None], np.int64)
    ds.save(tmp_path / "p")
    assert Dataset.load(tmp_path / "p").element_spec == cv.data.TensorSpec([None], np.int64)
    fixed = Dataset.range(3).map(lambda i: np.full(2, i))
    fixed.save(tmp_path / "f")  # every element fits the first one's spec: it stays
    assert Dataset.load(tmp_path / "f").element_spec == cv.data.TensorSpec([2], np.int64)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
