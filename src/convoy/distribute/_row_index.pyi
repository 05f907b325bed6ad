"""The compiled hash index of a dynamic embedding table's rows (``_row_index.cpp``)."""

import numpy as np

def probe(index: np.ndarray, keys: np.ndarray, ids: np.ndarray, found: np.ndarray,
          position: np.ndarray) -> None: ...
def insert(index: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> int: ...
