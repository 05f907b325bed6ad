"""cv.metrics in one process: the API beside Keras's numbers (reset, state, errors, where
the state lives). Keras's results themselves are checked in test_keras_reference.py."""

from __future__ import annotations

import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError


def test_result_is_a_numpy_float32_scalar_and_reset_zeroes_it():
    metric = cv.metrics.Mean()
    assert metric.result() == 0.0  # nothing seen: 0, not nan (Keras's divide_no_nan)
    metric.update_state([1, 3, 5, 7])
    result = metric.result()
    assert isinstance(result, np.float32) and result == 4.0
    metric.reset_state()
    assert metric.result() == 0.0
    metric.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
    assert metric.result() == 2.0


def test_call_updates_and_returns_the_result():
    metric = cv.metrics.Sum()
    assert metric([1.0, 2.0]) == 3.0
    assert metric([4.0], sample_weight=[0.5]) == 5.0


def test_auc_thresholds_have_epsilon_endpoints():
    # Keras's example (keras/src/metrics/confusion_metrics.py, AUC docstring)
    metric = cv.metrics.AUC(num_thresholds=3)
    assert metric.thresholds == [0.0 - 1e-7, 0.5, 1.0 + 1e-7]
    metric.update_state([0, 0, 1, 1], [0, 0.5, 0.3, 0.9])
    np.testing.assert_array_equal(metric.true_positives.numpy(), [2, 1, 0])
    np.testing.assert_array_equal(metric.false_positives.numpy(), [2, 0, 0])
    np.testing.assert_array_equal(metric.false_negatives.numpy(), [0, 1, 2])
    np.testing.assert_array_equal(metric.true_negatives.numpy(), [0, 2, 2])
    assert metric.result() == pytest.approx(0.75)
    given = cv.metrics.AUC(thresholds=[0.7, 0.2])
    assert given.num_thresholds == 4
    assert given.thresholds == [0.0 - 1e-7, 0.2, 0.7, 1.0 + 1e-7]


@pytest.mark.parametrize("kwargs, message", [
    ({"multi_label": True}, r"multi_label=True\) is not supported"),
    ({"num_labels": 3}, "num_labels"),
    ({"num_thresholds": 1}, "num_thresholds"),
    ({"curve": "XY"}, "Invalid AUC curve"),
    ({"summation_method": "middle"}, "Invalid AUC summation method"),
])
def test_auc_refuses_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        cv.metrics.AUC(**kwargs)


def test_bad_sample_weight_names_it():
    with pytest.raises(InvalidArgumentError, match="sample_weight"):
        cv.metrics.AUC().update_state([0, 1, 1], [0.1, 0.2, 0.3], sample_weight=[1, 2])


def test_state_dict_round_trip():
    source = cv.metrics.AUC(num_thresholds=10)
    source.update_state([0, 1, 1, 0], [0.2, 0.8, 0.4, 0.6])
    state = source.state_dict()
    assert sorted(state) == ["false_negatives", "false_positives", "true_negatives",
                             "true_positives"]
    target = cv.metrics.AUC(num_thresholds=10)
    target.load_state_dict(state)
    assert target.result() == source.result()
    with pytest.raises(InvalidArgumentError, match="has shape"):
        cv.metrics.AUC(num_thresholds=11).load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="total"):
        cv.metrics.Mean().load_state_dict({"total": 1.0})


def test_outside_a_scope_the_state_lives_here_and_cannot_go_to_workers():
    import cloudpickle

    metric = cv.metrics.BinaryAccuracy(threshold=0.3)
    assert [v.name for v in metric.variables] == ["binary_accuracy/total",
                                                  "binary_accuracy/count"]
    assert all(v.device.endswith("/replica:0/task:0/device:CPU:0") and "/job:ps" not in
               v.device for v in metric.variables)
    with pytest.raises(InvalidArgumentError, match="outside strategy.scope"):
        cloudpickle.dumps(metric)
