"""get_single_element. Scenarios ported from TensorFlow's tensorflow/python/data/
kernel_tests/get_single_element_test.py in our own words."""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import Dataset
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("skip, take, error", [
    (0, 1, None), (5, 1, None), (10, 1, None), (100, 1, "Dataset was empty."),
    (0, 2, "Dataset had more than one element.")])
def test_basic(skip, take, error):
    """testBasic: an element built from the one left after skip/take, or TF's errors."""
    ds = Dataset.range(100).skip(skip).map(lambda x: (x * x, np.full((1,), x))).take(take)
    if error:
        with pytest.raises(InvalidArgumentError, match=f"^{error}$"):
            ds.get_single_element()
    else:
        square, vector = ds.get_single_element()
        assert square == skip * skip and vector.tolist() == [skip]


def test_structures():
    """testNested (our words): dicts and tuples come back as they are."""
    element = {"a": np.arange(3), "b": (b"x", np.float32(2.0))}
    got = Dataset.from_tensors(element).get_single_element()
    assert got["a"].tolist() == [0, 1, 2] and got["b"] == (b"x", np.float32(2.0))
