"""PyTorch glue: convoy datasets as PyTorch datasets, and PyTorch on the workers.

:class:`IterableDataset` feeds a ``DataLoader`` from any convoy dataset, local or on the data
service. On the workers, modules whose parameters live on the parameter servers, or variables
pulled into tensors by hand; autograd computes the gradients, which go back as a push.

A module placed under ``strategy.scope()`` trains as in any PyTorch loop::

    with strategy.scope():
        model = cv.torch.place(Net())        # parameters -> variables on the ps
        optimizer = cv.optimizers.SGD(0.1)

    def step(iterator):                      # scheduled on the workers
        ids, labels = next(iterator)
        loss = F.binary_cross_entropy_with_logits(model(ids), labels)
        loss.backward()
        optimizer.apply_gradients(model.gradients())

Variables pulled by hand read the same way::

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

from convoy import errors as _errors
from convoy.distribute import coordinator as _coordinator
from convoy.torch._data import IterableDataset
from convoy.torch._dynamic import DynamicEmbedding, DynamicEmbeddingBag
from convoy.torch._place import place
from convoy.torch._pull import Pulled, pull


def _on_a_worker() -> bool:
    try:
        _coordinator.experimental_get_current_worker_index()
    except _errors.FailedPreconditionError:
        return False
    return True


if _on_a_worker():
    # A training worker shares its machine with other tasks and runs several steps at once:
    # PyTorch's intra-op threads would only contend (10x slower steps seen on 2 cores).
    torch.set_num_threads(1)

__all__ = ["DynamicEmbedding", "DynamicEmbeddingBag", "IterableDataset", "Pulled", "place",
           "pull"]
