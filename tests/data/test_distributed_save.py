"""distributed_save's layout (TensorFlow's distributed snapshot): reading what TensorFlow wrote,
and writing it through the data service.

The fixtures distributed_saved* were written by TensorFlow 2.21 through a one-worker data
service (tests/data/fixtures/make_snappy_and_distributed.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


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
