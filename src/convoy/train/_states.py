"""An object's ``state_dict()`` in a checkpoint: its structure and plain values as JSON (for
the file's metadata), its arrays and torch tensors as named tensors; and the state of a placed
module read back for the module unplaced.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import numpy as np

from convoy.errors import DataLossError, InvalidArgumentError


def contiguous(value: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns a scalar (e.g. a step counter) into shape (1,).
    return np.asarray(value, order="C")


class StateEncoder:
    """An object's ``state_dict()`` as JSON (its structure and plain values, with the types
    JSON lacks tagged: tuples, bytes, dicts with keys of any type) plus tensors (its arrays
    and torch tensors, named under ``path``)."""

    def __init__(self, path: str, tensors: dict[str, np.ndarray]) -> None:
        self._path, self._tensors = path, tensors

    def encode(self, value: Any, at: str = "") -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, f"{at}/{i}") for i, v in enumerate(value)]
            return items if isinstance(value, list) else {"tuple": items}
        if isinstance(value, dict):
            return {"dict": [[self.encode(k, f"{at}/key"), self.encode(v, f"{at}/{k}")]
                             for k, v in value.items()]}
        if isinstance(value, bytes):
            return {"bytes": base64.b64encode(value).decode()}
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
            dtype = str(tensor.dtype).removeprefix("torch.")
            if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
                tensor = tensor.view(torch.int16)
            return {"tensor": self._name(at, tensor.contiguous().numpy()), "torch": dtype}
        if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
            return {"tensor": self._name(at, np.asarray(value))}
        raise InvalidArgumentError(
            f"the state_dict() of {self._path!r} holds a {type(value).__name__} at "
            f"{at or '/'}; a checkpoint saves None, bool, int, float, str, bytes, lists, "
            f"tuples, dicts, numeric numpy arrays and torch tensors")

    def _name(self, at: str, array: np.ndarray) -> str:
        name = f"{self._path}{at}"
        while name in self._tensors:  # keys that contain "/" may collide
            name += "'"
        self._tensors[name] = contiguous(array)
        return name


def decode_state(value: Any, tensors: dict[str, np.ndarray], used: set[str]) -> Any:
    """The inverse of :class:`StateEncoder`; adds the tensor names it takes to ``used``."""
    if isinstance(value, list):
        return [decode_state(v, tensors, used) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(decode_state(v, tensors, used) for v in value["tuple"])
    if "dict" in value:
        return {decode_state(k, tensors, used): decode_state(v, tensors, used)
                for k, v in value["dict"]}
    if "bytes" in value:
        return base64.b64decode(value["bytes"])
    name = value["tensor"]
    if name not in tensors:
        raise DataLossError(f"the checkpoint has no tensor {name!r}, which its metadata names")
    used.add(name)
    array = tensors[name]
    if "torch" not in value:
        return array
    import torch

    tensor = torch.from_numpy(array)
    if value["torch"] == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def placed_state(path: str, tensors: dict[str, np.ndarray], states: dict[str, Any],
                  used: set[str]) -> dict[str, Any] | None:
    """The ``state_dict`` of the module a placed module saved at ``path`` was (its variables
    by key, its buffers and dynamic tables), to restore it unplaced (for serving); None if
    nothing was saved there. Optimizer slots are left out."""
    prefix = f"{path}/"
    taken: set[str] = set()
    state: dict[str, Any] = {}
    for name, array in tensors.items():
        rest = name.removeprefix(prefix)
        if rest != name and "/" not in rest and name not in states:  # a variable
            import torch

            state[rest] = torch.from_numpy(array)
            taken.add(name)
    for name, encoded in states.items():
        child = name.removeprefix(prefix)
        if child != name and "/" not in child:  # "buffers", or a dynamic table's module
            decoded = decode_state(encoded, tensors, taken)
            state.update(decoded if child == "buffers" else
                         {f"{child}.{key}": value for key, value in decoded.items()})
            taken.add(name)
    if not state:
        return None
    used |= taken
    return state
