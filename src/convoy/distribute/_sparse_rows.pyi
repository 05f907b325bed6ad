"""A parameter server's row reads and row updates, compiled (``_sparse_rows.cpp``)."""

import numpy as np

def scatter_add(target: np.ndarray, rows: np.ndarray, values: np.ndarray,
                scale: float) -> None: ...
def gather(source: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None: ...
