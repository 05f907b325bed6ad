"""Metrics that aggregate across workers, with Keras 3's semantics: ``Mean``, ``Sum``,
``Accuracy``, ``BinaryAccuracy`` and ``AUC``.

A metric's state is a few ``cv.Variable`` s. Made under ``strategy.scope()`` they are placed
together on one parameter server (never partitioned): each ``update_state``, from any
worker's scheduled function, adds its batch's counts in one call applied there atomically,
and ``result()`` on the chief reads them all in one call. Made outside a scope they live in
this process (in a scheduled function: for that call). Inputs may be numpy arrays, torch
tensors or Python lists; as in Keras, the state and results are float32.

A metric is checkpointed by ``cv.train.Checkpoint(metric=m)`` (its ``state_dict()``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from convoy.distribute import _operations, _scope
from convoy.distribute.variables import Variable, read_together, update_together
from convoy.errors import InvalidArgumentError

__all__ = ["AUC", "Accuracy", "BinaryAccuracy", "Mean", "Metric", "Sum"]

#: Keras's ``backend.epsilon()``: the AUC's end thresholds are ``-EPSILON`` and ``1+EPSILON``.
EPSILON = 1e-7


def _array(value: Any) -> np.ndarray:
    """``value`` as an array, typed as Keras's ``convert_to_tensor`` types it: arrays and
    tensors keep their dtype, Python floats become float32 and ints int32."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if not isinstance(value, (list, tuple, int, float, bool)):
        return np.asarray(value)
    array = np.asarray(value)
    if array.dtype == np.float64:
        return array.astype(np.float32)
    if array.dtype == np.int64:
        return array.astype(np.int32)
    return array


def _same_rank(x1: np.ndarray, x2: np.ndarray,
               expand_rank_1: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Squeeze or expand the last axis of one when the ranks differ by one (Keras's
    ``squeeze_or_expand_to_same_rank``)."""
    if x1.ndim == x2.ndim + 1 and x1.shape[-1] == 1:
        if x2.ndim == 1 and expand_rank_1:
            x2 = x2[..., None]
        else:
            x1 = x1.squeeze(-1)
    if x2.ndim == x1.ndim + 1 and x2.shape[-1] == 1:
        if x1.ndim == 1 and expand_rank_1:
            x1 = x1[..., None]
        else:
            x2 = x2.squeeze(-1)
    return x1, x2


def _broadcast(what: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return np.broadcast_to(value, shape)
    except ValueError:
        raise InvalidArgumentError(f"{what} of shape {list(value.shape)} cannot be broadcast "
                                   f"to the values' shape {list(shape)}") from None


def _scalar(value: Any, dtype: Any = np.float32) -> np.floating[Any]:
    """``value`` as a numpy scalar of ``dtype`` (what ``result()`` returns)."""
    return cast(np.floating[Any], np.asarray(value, dtype=dtype)[()])


def _divide_no_nan(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    safe = np.where(y == 0, np.ones_like(y), y)
    return np.where(y == 0, np.zeros_like(x), x / safe)


class Metric:
    """Base: state variables made by ``_state(name=shape, ...)``; subclasses define
    ``update_state`` and ``result``."""

    def __init__(self, name: str, dtype: Any = None) -> None:
        self.name = name
        self.dtype = np.dtype(dtype or np.float32)
        self._variables: list[Variable] = []
        self._names: list[str] = []

    def _state(self, **shapes: tuple[int, ...]) -> None:
        """Create the state variables (zeros of ``shapes``), on one parameter server under a
        strategy's scope, else in this process; each becomes an attribute."""
        initial = [(f"{self.name}/{key}", np.zeros(shape, self.dtype))
                   for key, shape in shapes.items()]
        strategy = _scope.current()
        if strategy is not None:
            variables = strategy._create_together(initial)
        else:
            variables = [Variable(value, name=name, trainable=False) for name, value in initial]
        for key, variable in zip(shapes, variables):
            setattr(self, key, variable)
        self._names, self._variables = list(shapes), variables

    @property
    def variables(self) -> list[Variable]:
        """The state variables."""
        return list(self._variables)

    def _read(self) -> list[np.ndarray]:
        return read_together(self._variables)

    def _add(self, deltas: Sequence[Any]) -> None:
        update_together([(v, _operations.AssignAdd, d) for v, d in zip(self._variables, deltas)])

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def result(self) -> np.floating[Any]:
        raise NotImplementedError

    def reset_state(self) -> None:
        """Zero the state (all variables in one call)."""
        update_together([(v, _operations.Assign, np.zeros(v.shape, v.dtype))
                         for v in self._variables])

    def __call__(self, *args: Any, **kwargs: Any) -> np.floating[Any]:
        """``update_state(...)``, then the ``result()``."""
        self.update_state(*args, **kwargs)
        return self.result()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The state variables' values by name, read together."""
        return dict(zip(self._names, self._read()))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Set the state from a ``state_dict()`` (all variables in one call)."""
        if set(state_dict) != set(self._names):
            raise InvalidArgumentError(f"the state of {type(self).__name__} {self.name!r} "
                                       f"has {sorted(self._names)}, got {sorted(state_dict)}")
        updates = []
        for key, variable in zip(self._names, self._variables):
            value = np.asarray(_array(state_dict[key]), dtype=variable.dtype)
            if value.shape != variable.shape:
                raise InvalidArgumentError(
                    f"{self.name}/{key} has shape {list(variable.shape)}, got "
                    f"{list(value.shape)}")
            updates.append((variable, _operations.Assign, value))
        update_together(updates)

    def __repr__(self) -> str:
        return f"<cv.metrics.{type(self).__name__} {self.name!r}>"


def _samplewise(values: Any, sample_weight: Any, reduce: Any,
                dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """Keras's ``reduce_to_samplewise_values``: weighted values reduced to one per sample
    (``reduce`` over the axes after the weights'), and the weights reduced alike."""
    values = _array(values).astype(dtype)
    weights = None
    if sample_weight is not None:
        weights = np.asarray(_array(sample_weight), dtype=dtype)
        values, weights = _same_rank(values, weights)
        weight_ndim = weights.ndim
        if values.ndim > weight_ndim:
            values = reduce(values, axis=tuple(range(weight_ndim, values.ndim)))
        weights = _broadcast("sample_weight", weights, values.shape)
        values = values * weights
        if weight_ndim > 1:
            weights = reduce(weights, axis=tuple(range(1, weight_ndim)))
    if values.ndim > 1:
        values = reduce(values, axis=tuple(range(1, values.ndim)))
    return values, weights


class Sum(Metric):
    """The (weighted) sum of the values."""

    def __init__(self, name: str = "sum", dtype: Any = None) -> None:
        super().__init__(name, dtype)
        self._state(total=())

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        values, _ = _samplewise(values, sample_weight, np.sum, self.dtype)
        self._add([np.sum(values)])

    def result(self) -> np.floating[Any]:
        (total,) = self._read()
        return _scalar(total, self.dtype)


class Mean(Metric):
    """The (weighted) mean of the values: ``total / count``."""

    def __init__(self, name: str = "mean", dtype: Any = None) -> None:
        super().__init__(name, dtype)
        self._state(total=(), count=())

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        values, weights = _samplewise(values, sample_weight, np.mean, self.dtype)
        if weights is not None:
            count: Any = np.sum(weights)
        else:
            count = values.shape[0] if values.ndim else 1
        self._add([np.sum(values), count])

    def result(self) -> np.floating[Any]:
        total, count = self._read()
        return _scalar(_divide_no_nan(total, count.astype(self.dtype)), self.dtype)


class _MeanOf(Mean):
    """The (weighted) mean of ``_values(y_true, y_pred)``, one per prediction."""

    def _values(self, y_true: Any, y_pred: Any) -> np.ndarray:
        raise NotImplementedError

    def update_state(self, y_true: Any, y_pred: Any,  # type: ignore[override]
                     sample_weight: Any = None) -> None:
        super().update_state(self._values(y_true, y_pred), sample_weight)


class Accuracy(_MeanOf):
    """How often predictions equal labels."""

    def __init__(self, name: str = "accuracy", dtype: Any = None) -> None:
        super().__init__(name, dtype)

    def _values(self, y_true: Any, y_pred: Any) -> np.ndarray:
        y_pred = _array(y_pred)
        y_true = _array(y_true).astype(y_pred.dtype)
        y_true, y_pred = _same_rank(y_true, y_pred)
        return np.equal(y_true, y_pred).astype(np.float32)


class BinaryAccuracy(_MeanOf):
    """How often predictions, as 1 above ``threshold`` and 0 else, equal binary labels."""

    def __init__(self, name: str = "binary_accuracy", dtype: Any = None,
                 threshold: float = 0.5) -> None:
        super().__init__(name, dtype)
        self.threshold = threshold

    def _values(self, y_true: Any, y_pred: Any) -> np.ndarray:
        y_pred, y_true = _array(y_pred), _array(y_true)
        y_true, y_pred = _same_rank(y_true, y_pred)
        predicted = np.greater(y_pred, _array(self.threshold)).astype(y_true.dtype)
        return np.equal(y_true, predicted).astype(np.float32)


_CURVES = {"roc": "ROC", "pr": "PR", "prgain": "PRGAIN"}
_SUMMATIONS = ("interpolation", "majoring", "minoring")


def _evenly_distributed(thresholds: np.ndarray) -> bool:
    """Keras's ``is_evenly_distributed_thresholds`` (on the thresholds with 0 and 1)."""
    count = len(thresholds)
    return count >= 3 and bool(np.allclose(
        thresholds, np.arange(count, dtype=np.float32) / (count - 1), atol=EPSILON))


class AUC(Metric):
    """The area under the ROC (or precision-recall) curve, from true/false positive and
    negative counts at ``num_thresholds`` thresholds, as Keras approximates it.

    ``thresholds``, if given, replaces the evenly spaced ones; either way the thresholds
    ``-1e-7`` and ``1 + 1e-7`` are added at the ends, so predictions of exactly 0 or 1 count.
    Only single-label AUC is supported (``multi_label=True`` is refused).
    """

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC",
                 summation_method: str = "interpolation", name: str | None = None,
                 dtype: Any = None, thresholds: Sequence[float] | None = None,
                 multi_label: bool = False, num_labels: int | None = None,
                 label_weights: Any = None, from_logits: bool = False) -> None:
        if multi_label:
            raise InvalidArgumentError(
                "AUC(multi_label=True) is not supported: convoy's AUC flattens multi-label "
                "data into one label, as multi_label=False does")
        if num_labels:
            raise InvalidArgumentError("`num_labels` is needed only when `multi_label` is True.")
        if str(curve).lower() not in _CURVES:
            raise InvalidArgumentError(f'Invalid AUC curve value: "{curve}". Expected values '
                                       f'are ["PR", "ROC", "PRGAIN"]')
        if str(summation_method).lower() not in _SUMMATIONS:
            raise InvalidArgumentError(
                f'Invalid AUC summation method value: "{summation_method}". Expected values '
                f'are ["interpolation", "majoring", "minoring"]')
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            self.num_thresholds = len(inner) + 2
            self._evenly = _evenly_distributed(np.array([0.0, *inner, 1.0]))
        else:
            if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) or \
                    num_thresholds <= 1:
                raise InvalidArgumentError("Argument `num_thresholds` must be an integer > 1. "
                                           f"Received: num_thresholds={num_thresholds}")
            self.num_thresholds = num_thresholds
            inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
            self._evenly = True
        self._thresholds = np.array([0.0 - EPSILON, *inner, 1.0 + EPSILON])
        self.curve = _CURVES[str(curve).lower()]
        self.summation_method = str(summation_method).lower()
        self.multi_label = False
        self.label_weights = None if label_weights is None else \
            np.asarray(_array(label_weights), np.float32)
        self._from_logits = bool(from_logits)
        super().__init__(name or "auc", dtype)
        shape = (self.num_thresholds,)
        self._state(true_positives=shape, false_positives=shape, true_negatives=shape,
                    false_negatives=shape)

    @property
    def thresholds(self) -> list[float]:
        """The thresholds, with the two end ones."""
        return list(self._thresholds)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Add the batch's weighted confusion counts at every threshold (one atomic call)."""
        y_true, y_pred = _array(y_true), _array(y_pred)
        if self._from_logits:
            y_pred = 1 / (1 + np.exp(-y_pred))
        f32 = np.float32
        y_pred, y_true = _same_rank(y_pred.astype(f32), y_true.astype(f32))
        weights = np.ones(y_pred.shape, f32)
        if sample_weight is not None:
            sample = np.asarray(_array(sample_weight), f32)[..., None]
            _, sample = _same_rank(y_true, sample, expand_rank_1=False)
            weights = weights * _broadcast("sample_weight", sample, y_pred.shape)
        if self.label_weights is not None:
            weights = weights * _broadcast("label_weights", self.label_weights[None],
                                           y_pred.shape)
        positive = (y_true != 0).reshape(-1)
        weights = weights.reshape(-1)
        if self._evenly:
            tp, fp = self._counts_evenly(y_pred.reshape(-1), positive, weights)
        else:
            tp, fp = self._counts(y_pred.reshape(-1), positive, weights)
        fn = np.sum(np.where(positive, weights, 0)) - tp
        tn = np.sum(np.where(positive, 0, weights)) - fp
        self._add([tp, fp, tn, fn])

    def _counts_evenly(self, y_pred: np.ndarray, positive: np.ndarray,
                       weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """True and false positives at evenly spaced thresholds, from each prediction's
        bucket (Keras's optimised update): O(thresholds + predictions)."""
        n = self.num_thresholds
        clipped = np.clip(y_pred, np.float32(0), np.float32(1))
        buckets = np.ceil(clipped * np.float32(n - 1)) - 1
        buckets = np.maximum(buckets, 0).astype(np.int64)  # the -epsilon threshold
        per_bucket = [np.bincount(buckets, weights=np.where(labels, weights, 0), minlength=n)
                      for labels in (positive, ~positive)]
        tp, fp = (np.cumsum(b[::-1])[::-1].astype(np.float32) for b in per_bucket)
        return tp, fp

    def _counts(self, y_pred: np.ndarray, positive: np.ndarray,
                weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """True and false positives at any thresholds: a prediction counts as positive
        above a threshold."""
        above = y_pred[None, :] > self._thresholds.astype(np.float32)[:, None]
        tp = np.where(above & positive, weights, 0).sum(axis=1, dtype=np.float32)
        fp = np.where(above & ~positive, weights, 0).sum(axis=1, dtype=np.float32)
        return tp, fp

    def result(self) -> np.floating[Any]:
        tp, fp, tn, fn = self._read()
        if self.curve == "PR" and self.summation_method == "interpolation":
            return self._interpolated_pr_auc(tp, fp, fn)
        recall = _divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _divide_no_nan(fp, fp + tn), recall
        elif self.curve == "PR":
            x, y = recall, _divide_no_nan(tp, tp + fp)
        else:  # PRGAIN, as Keras computes it
            scale = _divide_no_nan(tp + fn, tn + fp)
            recall_gain = np.where(tp == 0, 0.0, 1.0 - scale * _divide_no_nan(fn, tp))
            x = np.maximum(recall_gain, 0.0).astype(np.float32)
            y = np.where(tp == 0, 1.0, 1.0 - scale * _divide_no_nan(fp, tp)).astype(np.float32)
        if self.summation_method == "interpolation":
            heights = (y[:-1] + y[1:]) / np.float32(2)
        elif self.summation_method == "minoring":
            heights = np.minimum(y[:-1], y[1:])
        else:
            heights = np.maximum(y[:-1], y[1:])
        return _scalar(np.sum((x[:-1] - x[1:]) * heights, dtype=np.float32), self.dtype)

    @staticmethod
    def _interpolated_pr_auc(tp: np.ndarray, fp: np.ndarray,
                             fn: np.ndarray) -> np.floating[Any]:
        """Precision-recall AUC interpolating the positives linearly between thresholds
        (Davis & Goadrich 2006, in Keras's closed form)."""
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = _divide_no_nan(dtp, np.maximum(dp, 0))
        intercept = tp[1:] - slope * p[1:]
        both = (p[:-1] > 0) & (p[1:] > 0)
        ratio = np.where(both, _divide_no_nan(p[:-1], np.maximum(p[1:], 0)),
                         np.ones_like(p[1:]))
        increments = _divide_no_nan(slope * (dtp + intercept * np.log(ratio)),
                                    np.maximum(tp[1:] + fn[1:], 0))
        return _scalar(np.sum(increments, dtype=np.float32))

