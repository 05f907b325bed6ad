"""IndexedSlices: a sparse update to some rows of a tensor (as TensorFlow names it)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from convoy.errors import InvalidArgumentError


class IndexedSlices(NamedTuple):
    """Rows ``values[i]`` meant for rows ``indices[i]`` of a tensor of ``dense_shape``."""

    values: Any
    indices: Any
    dense_shape: Any = None

    def checked(self, argument: str = "sparse_delta") -> IndexedSlices:
        """A copy with numpy values and integer indices whose shapes agree."""
        values, indices = np.asarray(self.values), np.asarray(self.indices)
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{argument}.indices must be integers, got {indices.dtype}")
        if values.shape[:indices.ndim] != indices.shape:
            raise InvalidArgumentError(
                f"{argument}: values of shape {list(values.shape)} do not start with the "
                f"indices' shape {list(indices.shape)}"
            )
        return IndexedSlices(values, indices, self.dense_shape)
