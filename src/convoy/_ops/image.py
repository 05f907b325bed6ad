"""Image ops, as ``tf.image`` names them, on numpy ``[height, width, channels]`` arrays
(or ``[batch, height, width, channels]``).

The docs are in :mod:`convoy.image`, the public face.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from convoy._ops.array import convert_to_tensor
from convoy.errors import InvalidArgumentError

__all__ = ["ResizeMethod", "adjust_brightness", "adjust_contrast", "central_crop",
           "convert_image_dtype", "flip_left_right", "flip_up_down", "per_image_standardization",
           "random_brightness", "random_contrast", "random_crop", "random_flip_left_right",
           "random_flip_up_down", "resize", "resize_with_pad", "stateless_random_brightness",
           "stateless_random_contrast", "stateless_random_crop",
           "stateless_random_flip_left_right", "stateless_random_flip_up_down"]


class ResizeMethod:
    """The names ``resize`` takes for ``method``."""

    BILINEAR = "bilinear"
    NEAREST_NEIGHBOR = "nearest"
    BICUBIC = "bicubic"
    AREA = "area"
    LANCZOS3 = "lanczos3"
    LANCZOS5 = "lanczos5"
    GAUSSIAN = "gaussian"
    MITCHELLCUBIC = "mitchellcubic"


def _image(image: Any, argument: str = "image") -> np.ndarray:
    array = convert_to_tensor(image, name=argument)
    if array.ndim not in (3, 4):
        raise InvalidArgumentError(f"{argument} must be 3-D [height, width, channels] or 4-D "
                                   f"[batch, height, width, channels], got shape "
                                   f"{list(array.shape)}")
    return array


# Resize: one weight matrix [out, in] per spatial axis, applied one axis after the other.

def _bilinear(in_size: int, out_size: int) -> np.ndarray:
    scale = np.float32(in_size / out_size)
    where = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(where)
    lower = np.maximum(floor, 0).astype(np.int64)
    upper = np.minimum(np.ceil(where), in_size - 1).astype(np.int64)
    lerp = (where - floor).astype(np.float64)
    weights = np.zeros((out_size, in_size))
    rows = np.arange(out_size)
    np.add.at(weights, (rows, lower), 1 - lerp)
    np.add.at(weights, (rows, upper), lerp)
    return weights


def _keys(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    """The Keys cubic kernel at ``|x|``."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _bicubic(in_size: int, out_size: int) -> np.ndarray:
    """TensorFlow's resize_bicubic: Keys' kernel at offsets quantized to 1/1024, samples
    outside the image dropped and the rest renormalized."""
    scale = np.float32(in_size / out_size)
    where = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    start = np.floor(where).astype(np.int64)
    delta = np.rint((where - start) * 1024).astype(np.float64) / 1024
    weights = np.zeros((out_size, in_size))
    for tap in range(-1, 3):
        index = start + tap
        weight = _keys(delta - tap)
        inside = (index >= 0) & (index < in_size)
        weights[np.arange(out_size)[inside], index[inside]] += weight[inside]
    return weights / weights.sum(axis=1, keepdims=True)


def _nearest(in_size: int, out_size: int) -> np.ndarray:
    scale = np.float32(in_size / out_size)
    where = np.floor((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale)
    return np.clip(where.astype(np.int64), 0, in_size - 1)


def _area(in_size: int, out_size: int) -> np.ndarray:
    scale = np.float32(in_size / out_size)
    weights = np.zeros((out_size, in_size))
    for out in range(out_size):
        low, high = float(np.float32(out * scale)), float(np.float32((out + 1) * scale))
        for i in range(math.floor(low), math.ceil(high)):
            if i < low:
                part = float(scale) if i + 1 > high else i + 1 - low
            else:
                part = high - i if i + 1 > high else 1.0
            weights[out, min(i, in_size - 1)] += part
    return weights / float(scale)


def _lanczos(radius: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.where(x < radius, np.sinc(x) * np.sinc(x / radius), 0.0)


def _mitchell(x: np.ndarray) -> np.ndarray:
    b = c = 1 / 3
    near = ((12 - 9 * b - 6 * c) * x ** 3 + (-18 + 12 * b + 6 * c) * x ** 2 + (6 - 2 * b)) / 6
    far = ((-b - 6 * c) * x ** 3 + (6 * b + 30 * c) * x ** 2 + (-12 * b - 48 * c) * x
           + (8 * b + 24 * c)) / 6
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


_KERNELS: dict[str, tuple[float, Callable[[np.ndarray], np.ndarray]]] = {
    "bilinear": (1.0, lambda x: np.maximum(0.0, 1 - x)),
    "bicubic": (2.0, _keys),
    "lanczos3": (3.0, _lanczos(3)),
    "lanczos5": (5.0, _lanczos(5)),
    "gaussian": (1.5, lambda x: np.where(x < 1.5, np.exp(-x * x * 2), 0.0)),
    "mitchellcubic": (2.0, _mitchell),
}


def _scale_and_translate(in_size: int, out_size: int, method: str,
                         antialias: bool) -> np.ndarray:
    """TensorFlow's scale_and_translate weights: the kernel centred on each output pixel's
    source position, widened by the shrink factor if ``antialias``, renormalized."""
    radius, kernel = _KERNELS[method]
    f32 = np.float32
    inv_scale = f32(1) / (f32(out_size) / f32(in_size))
    kernel_scale = max(inv_scale, f32(1)) if antialias else f32(1)
    reach = f32(radius) * kernel_scale
    weights = np.zeros((out_size, in_size))
    for out in range(out_size):
        sample = (f32(out) + f32(0.5)) * inv_scale
        first = min(max(math.ceil(sample - reach - f32(0.5)), 0), in_size - 1)
        last = min(max(math.floor(sample + reach - f32(0.5)), 0), in_size - 1) + 1
        where = np.arange(first, last, dtype=np.float32) + f32(0.5) - sample
        weight = kernel(np.abs(where * (f32(1) / kernel_scale)).astype(np.float64))
        total = weight.sum()
        weights[out, first:last] = weight / total if abs(total) > 1e-30 else weight
    return weights


def _weights(method: str, antialias: bool, in_size: int, out_size: int) -> np.ndarray:
    if method == "area":
        return _area(in_size, out_size)
    if method in ("bilinear", "bicubic") and not antialias:
        return (_bilinear if method == "bilinear" else _bicubic)(in_size, out_size)
    return _scale_and_translate(in_size, out_size, method, antialias)


def _target(size: Any, height: int, width: int, preserve_aspect_ratio: bool) -> tuple[int, int]:
    dims = [int(d) for d in np.asarray(size).reshape(-1)]
    if len(dims) != 2 or min(dims) <= 0:
        raise InvalidArgumentError(f"size must be [new_height, new_width] > 0, got {dims}")
    if not preserve_aspect_ratio:
        return dims[0], dims[1]
    factor = min(np.float32(dims[0]) / np.float32(height), np.float32(dims[1]) / np.float32(width))
    return (int(np.round(np.float32(factor) * np.float32(height))),
            int(np.round(np.float32(factor) * np.float32(width))))


def resize(images: Any, size: Any, method: str = "bilinear", preserve_aspect_ratio: bool = False,
           antialias: bool = False) -> np.ndarray:
    """``images`` resized to ``size = [new_height, new_width]`` by ``method`` (bilinear,
    nearest, bicubic, area, lanczos3, lanczos5, gaussian, mitchellcubic): float32, except
    nearest, which keeps the dtype. ``antialias`` smooths when shrinking (not for nearest or
    area); ``preserve_aspect_ratio`` fits the image inside ``size``."""
    array = _image(images, "images")
    batch = array if array.ndim == 4 else array[None]
    method = str(method).lower()
    if method not in _KERNELS and method not in ("nearest", "area"):
        raise InvalidArgumentError(f"method must be one of {sorted([*_KERNELS, 'area', 'nearest'])}"
                                   f", got {method!r}")
    height, width = batch.shape[1:3]
    new_height, new_width = _target(size, height, width, preserve_aspect_ratio)
    if method == "nearest":
        out = batch[:, _nearest(height, new_height)][:, :, _nearest(width, new_width)]
    else:
        rows = _weights(method, antialias, height, new_height)
        columns = _weights(method, antialias, width, new_width)
        values = batch.astype(np.float64)
        out = np.einsum("oh,bhwc,pw->bopc", rows, values, columns,
                        optimize=True).astype(np.float32)
    return out if array.ndim == 4 else out[0]


def resize_with_pad(image: Any, target_height: int, target_width: int,
                    method: str = "bilinear", antialias: bool = False) -> np.ndarray:
    """``image`` resized to fit ``[target_height, target_width]`` without distortion, then
    centred and padded with zeros to that size (float32, as ``resize`` gives)."""
    array = _image(image)
    batch = array if array.ndim == 4 else array[None]
    if target_height <= 0 or target_width <= 0:
        raise InvalidArgumentError(f"target_height and target_width must be > 0, got "
                                   f"{target_height}, {target_width}")
    f32 = np.float32
    height, width = f32(batch.shape[1]), f32(batch.shape[2])
    ratio = max(width / f32(target_width), height / f32(target_height))
    new_height, new_width = height / ratio, width / ratio
    top = max(0, int(np.floor((f32(target_height) - new_height) / f32(2))))
    left = max(0, int(np.floor((f32(target_width) - new_width) / f32(2))))
    resized = resize(batch, [int(np.floor(new_height)), int(np.floor(new_width))], method,
                     antialias=antialias)
    out = np.zeros((len(batch), target_height, target_width, batch.shape[3]), resized.dtype)
    out[:, top:top + resized.shape[1], left:left + resized.shape[2]] = resized
    return out if array.ndim == 4 else out[0]


def central_crop(image: Any, central_fraction: float) -> np.ndarray:
    """The centre ``central_fraction`` (in (0, 1]) of ``image``'s height and width."""
    array = _image(image)
    if not 0.0 < central_fraction <= 1.0:
        raise InvalidArgumentError(f"central_fraction must be within (0, 1], got "
                                   f"{central_fraction}")
    if central_fraction == 1.0:
        return array
    height, width = array.shape[-3:-1]
    top = int((float(height) - float(height) * central_fraction) / 2)
    left = int((float(width) - float(width) * central_fraction) / 2)
    return array[..., top:height - top, left:width - left, :]


def _max(dtype: np.dtype) -> int:
    return int(np.iinfo(dtype).max)


def _saturate_cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(array, max(info.min, -2.0 ** 62), min(info.max, 2.0 ** 62)).astype(dtype)


def convert_image_dtype(image: Any, dtype: Any, saturate: bool = False) -> np.ndarray:
    """``image`` in ``dtype``, rescaled: floats span [0, 1], integers [0, MAX] of their type.
    ``saturate`` clips before a cast that could overflow."""
    array = convert_to_tensor(image, name="image")
    target = np.dtype(dtype)
    if target.kind not in "fiu" or array.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"convert_image_dtype converts between integer and float "
                                   f"types, got {array.dtype} to {target}")
    if target == array.dtype:
        return array
    if array.dtype.kind in "iu" and target.kind in "iu":
        scale_in, scale_out = _max(array.dtype), _max(target)
        if scale_in > scale_out:
            scaled = array // ((scale_in + 1) // (scale_out + 1))
            return _saturate_cast(scaled, target) if saturate else scaled.astype(target)
        cast = _saturate_cast(array, target) if saturate else array.astype(target)
        return (cast * target.type((scale_out + 1) // (scale_in + 1))).astype(target)
    if target.kind == "f":
        if array.dtype.kind == "f":
            return array.astype(target)
        return array.astype(target) * target.type(1.0 / _max(array.dtype))
    scaled = array * array.dtype.type(_max(target) + 0.5)
    return _saturate_cast(scaled, target) if saturate else scaled.astype(target)


def per_image_standardization(image: Any) -> np.ndarray:
    """float32: each image minus its mean, divided by its standard deviation (at least
    ``1/sqrt(pixels)``, so a uniform image does not divide by zero)."""
    array = _image(image).astype(np.float32)
    axes = (-3, -2, -1)
    pixels = int(np.prod(array.shape[-3:]))
    mean = array.mean(axis=axes, keepdims=True, dtype=np.float64)
    std = array.std(axis=axes, keepdims=True, dtype=np.float64)
    adjusted = np.maximum(std, 1 / math.sqrt(pixels)) if pixels else std
    return ((array - mean) / adjusted).astype(np.float32)


def adjust_brightness(image: Any, delta: float) -> np.ndarray:
    """``image`` plus ``delta`` (in [0, 1] units for integer images), in its dtype."""
    array = convert_to_tensor(image, name="image")
    floats = array if array.dtype in (np.float16, np.float32) else \
        convert_image_dtype(array, np.float32)
    adjusted = floats + floats.dtype.type(delta)
    return convert_image_dtype(adjusted, array.dtype, saturate=True)


def adjust_contrast(images: Any, contrast_factor: float) -> np.ndarray:
    """Each channel of each image moved away from (factor > 1) or toward its mean:
    ``(x - mean) * contrast_factor + mean``, in the images' dtype."""
    array = _image(images, "images")
    floats = array if array.dtype in (np.float16, np.float32) else \
        convert_image_dtype(array, np.float32)
    mean = floats.mean(axis=(-3, -2), keepdims=True, dtype=np.float64)
    adjusted = ((floats - mean) * contrast_factor + mean).astype(floats.dtype)
    return convert_image_dtype(adjusted, array.dtype, saturate=True)


def flip_left_right(image: Any) -> np.ndarray:
    """``image`` mirrored left to right (each image of a batch)."""
    return _image(image)[..., ::-1, :].copy()


def flip_up_down(image: Any) -> np.ndarray:
    """``image`` mirrored top to bottom (each image of a batch)."""
    return _image(image)[..., ::-1, :, :].copy()


# Random forms: one numpy generator per call, from ``seed``.

def _rng(seed: Any) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF)


def _stateless(seed: Any) -> np.random.Generator:
    pair = np.asarray(seed)
    if pair.shape != (2,) or pair.dtype.kind not in "iu":
        raise InvalidArgumentError(f"seed must be a pair of ints, got {seed!r}")
    return np.random.default_rng([int(s) & 0xFFFFFFFFFFFFFFFF for s in pair])


def _crop(value: Any, size: Any, rng: np.random.Generator) -> np.ndarray:
    array = convert_to_tensor(value, name="value")
    dims = [int(d) for d in np.asarray(size).reshape(-1)]
    if len(dims) != array.ndim or any(d < 0 or d > s for d, s in zip(dims, array.shape)):
        raise InvalidArgumentError(f"size must have one entry per dimension of value (shape "
                                   f"{list(array.shape)}), none larger, got {dims}")
    starts = [int(rng.integers(0, s - d + 1)) for d, s in zip(dims, array.shape)]
    return array[tuple(slice(a, a + d) for a, d in zip(starts, dims))]


def _flip(image: Any, axis: int, rng: np.random.Generator) -> np.ndarray:
    array = _image(image)
    if array.ndim == 3:
        return np.flip(array, axis).copy() if rng.random() < 0.5 else array
    flips = rng.random(len(array)) < 0.5
    out = array.copy()
    out[flips] = np.flip(array[flips], axis + 1)
    return out


def _brightness(image: Any, max_delta: float, rng: np.random.Generator) -> np.ndarray:
    if max_delta < 0:
        raise InvalidArgumentError(f"max_delta must be non-negative, got {max_delta}")
    return adjust_brightness(image, float(np.float32(rng.uniform(-max_delta, max_delta))))


def _contrast(image: Any, lower: float, upper: float, rng: np.random.Generator) -> np.ndarray:
    if upper <= lower or lower < 0:
        raise InvalidArgumentError(f"need 0 <= lower < upper, got lower={lower}, upper={upper}")
    return adjust_contrast(image, float(np.float32(rng.uniform(lower, upper))))


def random_crop(value: Any, size: Any, seed: int | None = None) -> np.ndarray:
    """A slice of ``size`` at a random offset of ``value`` (``size`` has one entry a dim)."""
    return _crop(value, size, _rng(seed))


def random_flip_left_right(image: Any, seed: int | None = None) -> np.ndarray:
    """``image`` (each image of a batch) mirrored left to right with probability 1/2."""
    return _flip(image, 1, _rng(seed))


def random_flip_up_down(image: Any, seed: int | None = None) -> np.ndarray:
    """``image`` (each image of a batch) mirrored top to bottom with probability 1/2."""
    return _flip(image, 0, _rng(seed))


def random_brightness(image: Any, max_delta: float, seed: int | None = None) -> np.ndarray:
    """``adjust_brightness`` by a delta drawn from ``[-max_delta, max_delta)``."""
    return _brightness(image, max_delta, _rng(seed))


def random_contrast(image: Any, lower: float, upper: float,
                    seed: int | None = None) -> np.ndarray:
    """``adjust_contrast`` by a factor drawn from ``[lower, upper)``."""
    return _contrast(image, lower, upper, _rng(seed))


def stateless_random_crop(value: Any, size: Any, seed: Any) -> np.ndarray:
    """``random_crop``, the same for the same ``seed`` (a pair of ints)."""
    return _crop(value, size, _stateless(seed))


def stateless_random_flip_left_right(image: Any, seed: Any) -> np.ndarray:
    """``random_flip_left_right``, the same for the same ``seed`` (a pair of ints)."""
    return _flip(image, 1, _stateless(seed))


def stateless_random_flip_up_down(image: Any, seed: Any) -> np.ndarray:
    """``random_flip_up_down``, the same for the same ``seed`` (a pair of ints)."""
    return _flip(image, 0, _stateless(seed))


def stateless_random_brightness(image: Any, max_delta: float, seed: Any) -> np.ndarray:
    """``random_brightness``, the same for the same ``seed`` (a pair of ints)."""
    return _brightness(image, max_delta, _stateless(seed))


def stateless_random_contrast(image: Any, lower: float, upper: float, seed: Any) -> np.ndarray:
    """``random_contrast``, the same for the same ``seed`` (a pair of ints)."""
    return _contrast(image, lower, upper, _stateless(seed))
