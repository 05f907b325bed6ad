"""convoy: TensorFlow's distributed input and parameter-server training stack, in plain Python.

``convoy.data`` (pipelines and the data service), ``convoy.distribute`` (parameter-server
training), ``convoy.train`` (optimizers, checkpoints, Example messages), ``convoy.io``
(Example parsing, TensorFlow's serialized forms), ``convoy.metrics`` (Keras's metrics,
aggregated on the parameter servers), ``convoy.monitoring`` (Prometheus metrics and health
probes); ``convoy.torch`` (PyTorch glue) is imported on first use.
"""

import os as _os
import sys as _sys
from typing import Any


def _convoy_command_debug() -> bool:
    """Whether this process is the ``convoy`` command (or ``python -m convoy``) run with
    ``--debug``; a user's script with a ``--debug`` of its own is not."""
    command = _os.path.splitext(_os.path.basename(_sys.argv[0]))[0] == "convoy"
    original = list(getattr(_sys, "orig_argv", []))
    if "-m" in original:
        module = original[original.index("-m") + 1:original.index("-m") + 2]
        command = command or module in (["convoy"], ["convoy.cli"])
    return command and "--debug" in _sys.argv[1:]


# gRPC reads its log level once, as it is imported, and by default logs lines of its own at
# INFO (a peer's "Got goaway", say) that convoy's errors already explain: they are off unless
# GRPC_VERBOSITY asks for them (a value the user set is kept), or the convoy command runs
# with --debug.
if not _convoy_command_debug():
    _os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from convoy import (  # noqa: E402
    data,
    distribute,
    errors,
    image,
    io,
    metrics,
    monitoring,
    nest,
    nn,
    ragged,
    sparse,
    strings,
    train,
)
from convoy._values.slices import IndexedSlices  # noqa: E402
from convoy._values.tensors import RaggedTensor, SparseTensor  # noqa: E402
from convoy._version import __version__  # noqa: E402
from convoy.distribute.variables import Variable  # noqa: E402
from convoy.nest import RaggedTensorSpec, SparseTensorSpec  # noqa: E402
from convoy.ops import (  # noqa: E402
    cast,
    clip_by_value,
    concat,
    gather,
    one_hot,
    pad,
    reshape,
    sequence_mask,
    stack,
    unique,
    where,
)
from convoy.train import optimizers  # noqa: E402

__all__ = [
    "IndexedSlices",
    "RaggedTensor",
    "RaggedTensorSpec",
    "SparseTensor",
    "SparseTensorSpec",
    "Variable",
    "__version__",
    "data",
    "distribute",
    "errors",
    "io",
    "metrics",
    "monitoring",
    "nest",
    "nn",
    "optimizers",
    "train",
    # The ops map functions call (convoy.ops), and tf.image/tf.strings/tf.sparse/tf.ragged
    "cast",
    "clip_by_value",
    "concat",
    "gather",
    "image",
    "one_hot",
    "pad",
    "ragged",
    "reshape",
    "sequence_mask",
    "sparse",
    "stack",
    "strings",
    "unique",
    "where",
]


def __getattr__(name: str) -> Any:
    if name == "torch":  # PyTorch is an optional dependency
        import importlib

        return importlib.import_module("convoy.torch")
    raise AttributeError(f"module 'convoy' has no attribute {name!r}")
