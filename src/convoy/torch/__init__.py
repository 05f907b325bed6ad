"""PyTorch on the workers: pull variables into tensors, run autograd, push the gradients.

A training step reads as ordinary PyTorch::

    def step(ids, labels):
        with cv.torch.pull(dense=[w, b], rows={embedding: ids}) as pulled:
            logits = model(pulled[embedding], *pulled)   # gathered rows; then w, b
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            loss.backward()
        optimizer.apply_gradients(pulled.gradients())
        return float(loss)

:func:`pull` reads every dense variable and every gathered row block in one call per
parameter server; the gradients of gathered rows come back as :class:`IndexedSlices`, so
the push (``apply_gradients``) is one sparse update per server.
"""

import torch

from convoy.distribute.server import worker_context
from convoy.torch._pull import Pulled, pull

if worker_context() is not None:
    # A training worker shares its machine with other tasks and runs several steps at once:
    # PyTorch's intra-op threads would only contend (10x slower steps seen on 2 cores).
    torch.set_num_threads(1)

__all__ = ["Pulled", "pull"]
