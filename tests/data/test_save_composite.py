"""save and load of sparse and ragged components in TensorFlow's format, both ways.

TensorFlow writes a sparse or ragged component's spec in dataset_spec.pb as a TypeSpecProto
and the component in the shard files as a DT_VARIANT tensor. Fixtures in tests/data/fixtures/
(saved_composite, saved_ragged_rows) were written by TensorFlow 2.21
(make_saved_composites.py); where TensorFlow is installed (.venv-tf at the repository root) it
also reads what convoy wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset, RaggedTensorSpec, SparseTensorSpec, TensorSpec
from convoy.data._persistence import _save
from convoy.errors import DataLossError, InvalidArgumentError, UnimplementedError
from convoy.io import struct_pb2
from convoy.testing import assert_equal

from .test_save import FIXTURES, needs_tf, run_tensorflow

pytestmark = pytest.mark.timeout(120)

EXPECTED = json.loads((FIXTURES / "expected_composites.json").read_text())

COMPOSITE_SPEC = {
    "id": TensorSpec([], np.int64),
    "nested": RaggedTensorSpec([1, None, None], np.float32, 2),
    "ragged": RaggedTensorSpec([2, None], np.int64, 1),
    "sparse": SparseTensorSpec([2, 3], bytes),
}
ROWS = [[0], [], [1, 2, 3], [4, 5], [6, 7, 8, 9]]


def plain(value: Any) -> Any:
    """An element as JSON-like data (the form of expected_composites.json)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, cv.SparseTensor):
        return {"indices": value.indices.tolist(),
                "values": [v.decode() if isinstance(v, bytes) else v
                           for v in value.values.tolist()],
                "dense_shape": value.dense_shape.tolist()}
    if isinstance(value, cv.RaggedTensor):
        return value.to_list()
    return np.asarray(value).tolist()


def composite_element(i: int) -> dict[str, Any]:
    """What make_saved_composites.py's pipeline makes, in convoy."""
    return {
        "id": np.int64(i),
        "sparse": cv.SparseTensor([[0, i % 3], [1, 2]],
                                  np.array([str(i).encode(), str(10 * i).encode()], object),
                                  [2, 3]),
        "ragged": cv.RaggedTensor.from_row_lengths(np.arange(i + 1), [1, i]),
        "nested": cv.RaggedTensor.from_nested_row_lengths(
            np.arange(i + 2, dtype=np.float32), [[2], [1, i + 1]]),
    }


def composites() -> Dataset:
    return Dataset.range(4).map(composite_element)


def ragged_rows() -> Dataset:
    return Dataset.from_tensor_slices(cv.RaggedTensor.from_row_lengths(
        np.arange(10, dtype=np.int32), [len(r) for r in ROWS]))


# ----- convoy reads what TensorFlow wrote ------------------------------------------------------
def test_loads_sparse_and_ragged_components_tensorflow_saved() -> None:
    dataset = Dataset.load(FIXTURES / "saved_composite")
    assert dataset.element_spec == COMPOSITE_SPEC
    assert dataset.cardinality() == 4
    assert [plain(e) for e in dataset] == EXPECTED["saved_composite"]["elements"]
    assert_equal(list(dataset), list(composites()))


def test_loads_ragged_rows_tensorflow_saved_and_batches_them_ragged() -> None:
    dataset = Dataset.load(FIXTURES / "saved_ragged_rows")
    assert dataset.element_spec == RaggedTensorSpec([None], np.int32, 0)
    assert [r.tolist() for r in dataset] == EXPECTED["saved_ragged_rows"]["elements"] == ROWS
    assert [b.to_list() for b in dataset.batch(3)] == [ROWS[:3], ROWS[3:]]


def test_writes_the_spec_and_components_tensorflow_writes(tmp_path: Path) -> None:
    """The same elements make the same dataset_spec.pb (the same message: a map's entries
    may come in any order) and byte-identical shard files (the components' variant encoding
    included)."""
    for name, dataset in (("saved_composite", composites()), ("saved_ragged_rows",
                                                               ragged_rows())):
        dataset.save(tmp_path / name, shard_func=lambda *_: 0)
        ours = next((tmp_path / name).glob("*/00000000.shard/00000000.snapshot"))
        theirs = next((FIXTURES / name).glob("*/00000000.shard/00000000.snapshot"))
        assert ours.read_bytes() == theirs.read_bytes(), name
        specs = [struct_pb2.StructuredValue.FromString((d / name / "dataset_spec.pb")
                                                       .read_bytes())
                 for d in (tmp_path, FIXTURES)]
        assert specs[0] == specs[1], name


# ----- TensorFlow reads what convoy wrote ------------------------------------------------------
TF_READ = """
    import json
    import tensorflow as tf
    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, tf.SparseTensor):
            return {"indices": v.indices.numpy().tolist(),
                    "values": [x.decode() if isinstance(x, bytes) else x
                               for x in v.values.numpy().tolist()],
                    "dense_shape": v.dense_shape.numpy().tolist()}
        if isinstance(v, tf.RaggedTensor):
            return v.to_list()
        return v.numpy().tolist()
    results = []
    for path in %r:
        ds = tf.data.Dataset.load(path)
        spec = ds.element_spec
        spec = {k: repr(v) for k, v in spec.items()} if isinstance(spec, dict) else repr(spec)
        results.append({"spec": spec, "cardinality": int(ds.cardinality()),
                        "elements": [plain(e) for e in ds]})
    print(json.dumps(results))
"""


@needs_tf
def test_tensorflow_loads_sparse_and_ragged_components_convoy_saved(tmp_path: Path) -> None:
    names = ["saved_composite", "saved_ragged_rows"]
    composites().save(tmp_path / names[0])
    ragged_rows().save(tmp_path / names[1])
    results = run_tensorflow(TF_READ % [str(tmp_path / name) for name in names])
    for name, result in zip(names, results):
        expected = EXPECTED[name]
        assert result["spec"] == expected["spec"]
        assert result["cardinality"] == len(expected["elements"])
        # the default reader_func interleaves the shards
        def order(element: Any) -> str:
            return json.dumps(element, sort_keys=True)

        assert sorted(result["elements"], key=order) == sorted(expected["elements"], key=order)


# ----- convoy both ways --------------------------------------------------------------------------
def test_round_trip_of_composites_through_batch_and_unbatch(tmp_path: Path) -> None:
    """Our words: batched sparse and ragged components (ragged_rank 2 and 3 after a batch)
    save and load as they were, and unbatch after the load."""
    batched = composites().batch(3)
    batched.save(tmp_path)
    loaded = Dataset.load(tmp_path)
    assert loaded.element_spec == batched.element_spec
    assert_equal(list(loaded), list(batched))
    assert_equal(list(loaded.unbatch()), list(composites()))


def test_a_snapshot_of_composites_reads_back(tmp_path: Path) -> None:
    """snapshot writes the same files: its second pass reads the components back."""
    dataset = composites().snapshot(str(tmp_path))
    first = list(dataset)
    assert_equal(list(dataset), first)
    assert_equal(first, list(composites()))


def test_damaged_or_unsupported_components(tmp_path: Path) -> None:
    """A component that is not what its spec says is a DataLossError; a component of a kind
    convoy does not carry is named."""
    Dataset.range(3).save(tmp_path / "dense")
    with pytest.raises(InvalidArgumentError, match="dtypes.*variant.*int64"):
        Dataset.load(tmp_path / "dense", element_spec=RaggedTensorSpec([None], np.int64, 0))
    with pytest.raises(DataLossError,
                       match=r"sparse component must be a variant tensor of shape \[\.\.\., 3\]"):
        list(Dataset.load(FIXTURES / "saved_ragged_rows",
                          element_spec=SparseTensorSpec([None], np.int32)))
    value = struct_pb2.StructuredValue()
    value.type_spec_value.type_spec_class = 5  # a nested dataset's
    value.type_spec_value.type_spec_class_name = "DatasetSpec"
    with pytest.raises(UnimplementedError, match="DatasetSpec"):
        _save.decode_spec(value)
