"""Image ops, as ``tf.image`` names them, on numpy ``[height, width, channels]`` arrays
(or ``[batch, height, width, channels]``).

``resize`` follows TensorFlow 2's kernels (half-pixel centres; ``antialias`` widens the kernel
when shrinking, as ``scale_and_translate`` does), and gives float32 except for
``"nearest"``, which keeps the dtype. The ``random_*`` ops draw from numpy's generator
(seeded by ``seed``); the ``stateless_random_*`` ops give the same result for the same
``seed`` (a pair of ints) every time. Neither reproduces TensorFlow's random streams bit for
bit: the same seed gives the same result as itself, not as TensorFlow.
"""

from convoy._ops.image import (
    ResizeMethod,
    adjust_brightness,
    adjust_contrast,
    central_crop,
    convert_image_dtype,
    flip_left_right,
    flip_up_down,
    per_image_standardization,
    random_brightness,
    random_contrast,
    random_crop,
    random_flip_left_right,
    random_flip_up_down,
    resize,
    resize_with_pad,
    stateless_random_brightness,
    stateless_random_contrast,
    stateless_random_crop,
    stateless_random_flip_left_right,
    stateless_random_flip_up_down,
)

__all__ = [
    "ResizeMethod",
    "adjust_brightness",
    "adjust_contrast",
    "central_crop",
    "convert_image_dtype",
    "flip_left_right",
    "flip_up_down",
    "per_image_standardization",
    "random_brightness",
    "random_contrast",
    "random_crop",
    "random_flip_left_right",
    "random_flip_up_down",
    "resize",
    "resize_with_pad",
    "stateless_random_brightness",
    "stateless_random_contrast",
    "stateless_random_crop",
    "stateless_random_flip_left_right",
    "stateless_random_flip_up_down",
]
