"""Datasets of strings yield what TensorFlow 2.21's ``.numpy()`` gives (fixtures/
string_elements.json, by make_string_elements.py): ``bytes`` for a scalar string, an object
array of ``bytes`` for an array of them, whether made of ``str``, ``bytes`` or numpy ``|S`` and
``|U`` arrays; their spec's dtype is ``string``. Non-string components are compared by value
only (TensorFlow makes Python ints int32 where convoy keeps int64)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy import nest

CASES = json.loads((Path(__file__).parent / "fixtures" / "string_elements.json").read_text())
pytestmark = pytest.mark.timeout(60)


def check(got: Any, want: dict[str, Any]) -> None:
    array = np.asarray(got)
    assert list(array.shape) == want["shape"]
    if want["dtype"] not in "SO":
        assert array.reshape(-1).tolist() == want["data"]
        return
    assert type(got).__name__ == want["type"], f"{got!r} is not a {want['type']}"
    if isinstance(got, np.ndarray):
        assert got.dtype == object
    assert array.reshape(-1).tolist() == [base64.b64decode(v) for v in want["data"]]


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["source"] for c in CASES["cases"]])
def test_string_elements_as_tensorflow(case: dict[str, Any]) -> None:
    dataset = eval(case["source"], {"data": cv.data, "np": np})  # noqa: S307 (the fixture's)
    elements = list(dataset)
    assert len(elements) == len(case["elements"])
    for got, want in zip(elements, case["elements"]):
        leaves = _leaves(want, "type")
        assert len(nest.flatten(got)) == len(leaves)
        for leaf, wanted_leaf in zip(nest.flatten(got), leaves):
            check(leaf, wanted_leaf)
    specs = nest.flatten(dataset.element_spec)
    wanted = _leaves(case["spec"], "dtype")
    assert [list(s.shape) for s in specs] == [w["shape"] for w in wanted]
    assert [s.dtype == object for s in specs] == [w["dtype"] == "string" for w in wanted]


def _leaves(structure: Any, key: str) -> list[dict[str, Any]]:
    """The fixture's leaves (dicts holding ``key``), in TensorFlow's flattening order."""
    if isinstance(structure, dict) and key in structure:
        return [structure]
    items = [structure[k] for k in sorted(structure)] if isinstance(structure, dict) \
        else structure
    return [leaf for item in items for leaf in _leaves(item, key)]
