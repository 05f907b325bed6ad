"""cv.metrics against Keras's results (TensorFlow 2.21, Keras 3) on the same inputs: the
reference numbers were made once by fixtures/make_keras_metrics.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import convoy as cv

FIXTURE = Path(__file__).parent / "fixtures" / "keras_metrics.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def decode(value):
    if value is None:
        return None
    return np.array(value["data"], dtype=value["dtype"]).reshape(value["shape"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_matches_keras_after_every_batch(case):
    metric = getattr(cv.metrics, case["metric"])(**case["kwargs"])
    results = []
    for batch in case["batches"]:
        metric.update_state(**{key: decode(value) for key, value in batch.items()})
        result = metric.result()
        assert isinstance(result, np.float32)
        results.append(float(result))
    np.testing.assert_allclose(results, case["results"], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c["metric"] == "AUC"][:4],
                         ids=lambda c: c["name"])
def test_matches_keras_with_torch_tensors_and_lists(case):
    torch = pytest.importorskip("torch")
    metric = cv.metrics.AUC(**case["kwargs"])
    for batch in case["batches"]:
        arguments = {key: decode(value) for key, value in batch.items()}
        metric.update_state(torch.from_numpy(arguments.pop("y_true")),
                            arguments.pop("y_pred").tolist(), **arguments)
    np.testing.assert_allclose(metric.result(), case["results"][-1], rtol=2e-5)
