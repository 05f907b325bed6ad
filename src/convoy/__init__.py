"""convoy: TensorFlow's distributed input and parameter-server training stack, in plain Python."""

from convoy import data, errors, nest

__version__ = "0.1.0"

__all__ = ["data", "errors", "nest", "__version__"]
