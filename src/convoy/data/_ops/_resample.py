"""rejection_resample, composed from other transformations as TensorFlow composes it.

Two readings of the input are mixed: the input as it is (with its class), taken with the
probability ``m`` of keeping the original distribution, and a filtered reading that keeps
each element of class ``c`` with probability ``a[c]`` (``a`` and ``m`` from
``target / initial``, as in TensorFlow). Without ``initial_dist``, the initial distribution
is estimated on the fly from the classes seen (counts starting at 10 per class, updated in
batches of 32). Every random draw comes from ``Dataset.random`` with seeds derived from
``seed``, so the result is reproducible for a seed and checkpoints like any pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from convoy.data._core._op import draw_seed, face
from convoy.errors import InvalidArgumentError

_ESTIMATION_BATCH = 32
_SMOOTHING = 10
_UNIFORM_SCALE = np.float32(1.0 / (1 << 32))


def _distribution(value: Any, argument: str) -> np.ndarray:
    dist = np.asarray(value, dtype=np.float32)
    if dist.ndim != 1 or dist.size == 0:
        raise InvalidArgumentError(
            f"{argument} must be a non-empty vector of class probabilities, got shape "
            f"{list(dist.shape)}")
    return dist


def _ratio(initial: np.ndarray, target: np.ndarray) -> np.ndarray:
    return target / (initial + np.finfo(initial.dtype).tiny)


def _acceptance(initial: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """Per-class acceptance probabilities of the filtered reading, and the probability of
    taking the original reading."""
    ratio = _ratio(initial, target)
    high, low = ratio.max(), ratio.min()
    span = high - low
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = (ratio - low) / span
    return accept.astype(np.float32), np.float32(low)


def _estimated_initial(target: np.ndarray, classes: Any) -> Any:
    """The running estimate of the class distribution, one row per input element."""
    num_classes = target.shape[0]

    def update(seen: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seen = seen + np.bincount(np.asarray(batch, dtype=np.int64).ravel(),
                                  minlength=num_classes)[:num_classes]
        dist = (seen / seen.sum()).astype(np.float32)
        return seen, np.tile(dist[None, :], (_ESTIMATION_BATCH, 1))

    start = np.full(num_classes, _SMOOTHING, dtype=np.int64)
    return classes.batch(_ESTIMATION_BATCH).scan(start, update).unbatch()


def _uniforms(seed: int) -> Any:
    Dataset = face()
    return Dataset.random(seed=seed, rerandomize_each_iteration=True).map(
        lambda value: np.float32(value) * _UNIFORM_SCALE)


def rejection_resample(dataset: Any, class_func: Callable[..., Any], target_dist: Any,
                       initial_dist: Any = None, seed: int | None = None) -> Any:
    """``(class, element)`` pairs resampled towards ``target_dist``; see the module doc."""
    Dataset = face()
    target = _distribution(target_dist, "target_dist")
    seed = draw_seed() if seed is None else seed
    filter_seed, mix_seed = seed, seed ^ 0x5DEECE66D

    def with_class(*element: Any) -> tuple[Any, Any]:
        return (class_func(*element), element[0] if len(element) == 1 else element)

    original = dataset.map(with_class)
    prob_original: float | None = None
    if initial_dist is not None:
        initial = _distribution(initial_dist, "initial_dist")
        if initial.shape != target.shape:
            raise InvalidArgumentError(
                f"initial_dist and target_dist must have the same number of classes, got "
                f"{initial.shape[0]} and {target.shape[0]}")
        accept, m = _acceptance(initial, target)
        prob_original = float(_ratio(initial, target).min())
        acceptance = Dataset.from_tensors(accept).repeat()
        prob_of_original = Dataset.from_tensors(m).repeat()
    else:
        estimates = _estimated_initial(target, dataset.map(class_func))
        pairs = estimates.map(lambda initial: _acceptance(initial, target))
        acceptance = pairs.map(lambda accept, _: accept)
        prob_of_original = pairs.map(lambda _, m: m)

    def class_and_probability(accept: np.ndarray, element: Any) -> tuple[Any, Any, Any]:
        label = class_func(*element) if isinstance(element, tuple) else class_func(element)
        return label, accept[int(label)], element

    filtered = (Dataset.zip((Dataset.zip((acceptance, dataset)).map(class_and_probability),
                             _uniforms(filter_seed)))
                .filter(lambda candidate, u: u < candidate[1])
                .map(lambda candidate, _: (candidate[0], candidate[2])))
    if prob_original == 1:
        return original
    if prob_original == 0:
        return filtered
    choices = Dataset.zip((prob_of_original, _uniforms(mix_seed))).map(
        lambda m, u: np.int64(0 if u < m else 1))
    return Dataset.choose_from_datasets([original, filtered], choices,
                                        stop_on_empty_dataset=True)
