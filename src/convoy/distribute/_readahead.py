"""Read-ahead of a scheduled function's whole-variable reads on parameter servers.

A training step written the TensorFlow way reads its variables one at a time
(``table.sparse_read(ids)``, then ``weights.read_value()``, then ``bias.read_value()``), and each
read would wait for its own round trip. A function tends to read the same variables each time
it runs, so when it makes its first read, the whole-variable reads its previous run made
before its first update are sent along with it; its later reads of those variables take the
answers already on their way.

This keeps what the function sees: TensorFlow orders a function's operations on one variable,
not its reads of different variables. A prefetched read leaves after every operation this
process queued before it (one store's messages leave in order); it is used only while the
function has sent no update since, and is dropped at its first update, so it never hides one
of the function's own writes. Writes from other threads, including threads the function starts
itself, are concurrent with it: a read made after one may answer from before it. A guess the
function does not use costs one read, answered and dropped; the next run's plan leaves that
variable out.

:class:`ReadAhead` decides, per running call, without sockets or threads; the store's shell
(:class:`convoy.distribute._store_clients.RemoteStore`) sends what it says.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from convoy._base.bounded import BoundedDict
from convoy.distribute import _operations as ops

#: A whole-variable read: (the store, the variable's key in it).
WholeRead = tuple[Any, str]

_PLANS_KEPT = 1024
_plans: BoundedDict[bytes, tuple[WholeRead, ...]] = BoundedDict(_PLANS_KEPT)
_plans_lock = threading.Lock()


def whole_read(operations: list[ops.Operation]) -> str | None:
    """The variable's key if ``operations`` is one read of a whole variable, else None."""
    if len(operations) != 1:
        return None
    operation = operations[0]
    if type(operation) is ops.Read and type(operation.key) is str:
        return operation.key
    return None


def _changes_nothing(operations: list[ops.Operation]) -> bool:
    return all(type(operation) in ops.READ_ONLY for operation in operations)


class ReadAhead:
    """One running call's read-ahead: what to prefetch and which prefetched answer a read
    takes. ``plan`` is the whole-variable reads the function's previous run made before its
    first update (sent along with its first read, then spent)."""

    __slots__ = ("_plan", "_waiting", "_updated", "reads", "_seen")

    def __init__(self, plan: tuple[WholeRead, ...] = ()) -> None:
        self._plan = plan
        #: prefetched reads not taken yet -> their answers
        self._waiting: dict[WholeRead, Future[list[Any]]] = {}
        self._updated = False  # the call has sent an update
        #: whole-variable reads made before the first update: the next run's plan
        self.reads: list[WholeRead] = []
        self._seen: set[WholeRead] = set()

    def on_operations(self, store: Any, operations: list[ops.Operation]
                      ) -> tuple[Future[list[Any]] | None, list[WholeRead]]:
        """The call is about to send ``operations`` to ``store``: the prefetched answer that
        stands for them (then send nothing), or None; and the reads to prefetch now (after
        sending them)."""
        if self._updated:  # nothing is read ahead past the first update
            return None, []
        if not _changes_nothing(operations):
            self._updated = True
            self._waiting.clear()  # sent before this update: they may not see it
            return None, []
        key = whole_read(operations)
        if key is not None:
            read = (store, key)
            if read not in self._seen:
                self._seen.add(read)
                self.reads.append(read)
            answer = self._waiting.pop(read, None)
            if answer is not None:
                return answer, []
        plan, self._plan = self._plan, ()
        this = (store, key) if key is not None else None
        return None, [read for read in plan if read != this]

    def prefetched(self, read: WholeRead, answer: Future[list[Any]]) -> None:
        """``read`` was sent ahead; ``answer`` is its pending result."""
        self._waiting[read] = answer


def plan_of(function: bytes) -> tuple[WholeRead, ...]:
    """The reads to prefetch for a run of the function whose digest is ``function``."""
    with _plans_lock:
        return _plans.get(function, ())


def remember(function: bytes, reads: list[WholeRead]) -> None:
    """Keep a run's ``reads`` as the plan of the function's next run."""
    with _plans_lock:
        _plans[function] = tuple(reads)
