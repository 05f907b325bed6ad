"""ignore_errors and assert_cardinality: how an input fails or ends.

Scenarios ported from TensorFlow's tensorflow/python/data/experimental/kernel_tests/
ignore_errors_test.py and assert_cardinality_test.py in our own words; each names its source.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from convoy.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, experimental
from convoy.errors import FailedPreconditionError, InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def _check_numerics(x):
    if not np.isfinite(x):
        raise InvalidArgumentError(f"Tensor had NaN or Inf values: {x}")
    return x


def test_map_ignore_error():
    """testMapIgnoreError: the elements a map fails on are dropped."""
    components = np.array([1.0, 2.0, 3.0, np.nan, 5.0], dtype=np.float32)
    ds = Dataset.from_tensor_slices(components).map(_check_numerics).ignore_errors()
    assert [float(x) for x in ds] == [1.0, 2.0, 3.0, 5.0]


def test_parallel_map_ignore_error():
    """testParallelMapIgnoreError."""
    components = np.array([1.0, 2.0, 3.0, np.nan, 5.0], dtype=np.float32)
    ds = Dataset.from_tensor_slices(components).map(
        _check_numerics, num_parallel_calls=2).prefetch(2).ignore_errors()
    assert [float(x) for x in ds] == [1.0, 2.0, 3.0, 5.0]


def test_read_file_ignore_error(tmp_path):
    """testReadFileIgnoreError: reading a file that was deleted is skipped."""
    names = []
    for i in range(5):
        path = tmp_path / f"{i}.txt"
        path.write_text(f"{i}")
        names.append(str(path))

    def read(name):
        with open(name) as f:
            return f.read()

    ds = Dataset.from_tensor_slices(np.array(names, dtype=object)).map(read).ignore_errors()
    assert list(ds) == ["0", "1", "2", "3", "4"]
    (tmp_path / "0.txt").unlink()
    (tmp_path / "4.txt").unlink()
    assert list(ds) == ["1", "2", "3"]


def test_zip_ignore_error():
    """testZipIgnoreError: an error in one input of a zip drops that pair."""
    a = Dataset.from_tensor_slices(np.array([1.0, 2.0, 3.0, np.nan, 5.0])).map(_check_numerics)
    ds = Dataset.zip((a, Dataset.range(5))).ignore_errors()
    assert [(float(x), int(y)) for x, y in ds] == [(1.0, 0), (2.0, 1), (3.0, 2), (5.0, 4)]


def test_zip_error_in_a_middle_input():
    """Our words: whichever input of a zip fails, the inputs before and after it both move past
    the failed row, and an input that ends during a failed row ends the zip."""
    failing = Dataset.range(6).map(lambda x: 10 // (x % 3))
    ds = Dataset.zip((Dataset.range(6), failing, Dataset.range(100, 106))).ignore_errors()
    assert [tuple(int(v) for v in row) for row in ds] == [
        (1, 10, 101), (2, 5, 102), (4, 10, 104), (5, 5, 105)]
    short = Dataset.zip((Dataset.range(6).map(lambda x: 1 // (x - 2)), Dataset.range(2)))
    assert [tuple(int(v) for v in row) for row in short.ignore_errors()] == [(-1, 0), (-1, 1)]


def test_cardinality_is_unknown():
    """Our words: elements may be dropped, so the cardinality is unknown."""
    assert Dataset.range(3).ignore_errors().cardinality() == UNKNOWN_CARDINALITY


def test_log_warning(caplog):
    """testIgnoreErrorWithLogWarning (our words): with log_warning each error is logged."""
    ds = Dataset.range(4).map(lambda x: 1 // (x % 2)).apply(
        experimental.ignore_errors(log_warning=True))
    with caplog.at_level(logging.WARNING, logger="convoy.data"):
        assert list(ds) == [1, 1]
    assert sum("Ignoring error" in r.message for r in caplog.records) == 2


def test_batch_over_failing_map():
    """A batch whose input fails loses the elements it had taken, as in TensorFlow."""
    ds = Dataset.range(10).map(lambda x: 1 // (x - 4) if x == 4 else x).batch(3).ignore_errors()
    assert [b.tolist() for b in ds] == [[0, 1, 2], [5, 6, 7], [8, 9]]


# ----- assert_cardinality ----------------------------------------------------------------------

def test_correct_cardinality():
    """testCorrectCardinality."""
    ds = Dataset.range(10).filter(lambda x: True)
    assert ds.cardinality() == UNKNOWN_CARDINALITY
    ds = ds.apply(experimental.assert_cardinality(10))
    assert ds.cardinality() == 10
    assert [int(x) for x in ds] == list(range(10))


@pytest.mark.parametrize("num_elements, asserted, message", [
    (10, 20, "Input dataset was expected to contain 20 elements but contained only 10 "
             "elements."),
    (1, 20, "Input dataset was expected to contain 20 elements but contained only 1 element."),
    (10, INFINITE_CARDINALITY, "Input dataset was expected to contain an infinite number of "
                               "elements but contained only 10 elements."),
    (1, INFINITE_CARDINALITY, "Input dataset was expected to contain an infinite number of "
                              "elements but contained only 1 element."),
    (10, 5, "Input dataset was expected to contain 5 elements but contained at least 6 "
            "elements."),
    (10, 1, "Input dataset was expected to contain 1 element but contained at least 2 "
            "elements.")])
def test_incorrect_cardinality(num_elements, asserted, message):
    """testIncorrectCardinality: the same messages, as FailedPreconditionError."""
    ds = Dataset.range(num_elements).apply(experimental.assert_cardinality(asserted))
    got = []
    with pytest.raises(FailedPreconditionError) as raised:
        for x in ds:
            got.append(x)
    assert str(raised.value) == message
    if 0 <= asserted < num_elements:
        assert len(got) == asserted
