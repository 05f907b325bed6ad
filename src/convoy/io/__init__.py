"""tf.io without TensorFlow: tensors serialized as TensorFlow serializes them."""

from convoy.io._tensor import parse_tensor, serialize_tensor

__all__ = ["parse_tensor", "serialize_tensor"]
