"""distributed_save writes the element_spec's known shapes in its metadata, as TensorFlow's
does (``DistributedSnapshotMetadata.element_spec``), and TensorFlow's load reports them; sizes
are unknown only where the spec was read off a first element (a Python function's output),
which TensorFlow would know by tracing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy.testing import InProcessCluster

from .test_save import needs_tf, run_tensorflow

pytestmark = pytest.mark.timeout(300)


@needs_tf
def test_tensorflow_loads_the_known_shapes(tmp_path: Path) -> None:
    dataset = cv.data.Dataset.zip((
        cv.data.Dataset.from_tensor_slices(np.ones((6, 2, 3), np.float32)),
        cv.data.Dataset.from_tensor_slices([b"a", b"b", b"c", b"d", b"e", b"f"]),
    )).batch(2, drop_remainder=True).enumerate()
    with InProcessCluster(num_workers=1) as cluster:
        cv.data.experimental.distributed_save(dataset, tmp_path / "saved", cluster.address)
        loaded = cv.data.Dataset.load(tmp_path / "saved", wait=True)
        assert len(list(loaded)) == 3
    assert loaded.element_spec == dataset.element_spec
    result = run_tensorflow(f"""
        import json
        import tensorflow as tf
        ds = tf.data.Dataset.load({str(tmp_path / "saved")!r})
        print(json.dumps([[s.shape.as_list(), s.dtype.name]
                          for s in tf.nest.flatten(ds.element_spec)]))
    """)
    assert result == [[[], "int64"], [[2, 2, 3], "float32"], [[2], "string"]]
