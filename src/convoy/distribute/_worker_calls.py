"""The worker's side of scheduled calls: running a ``Run`` request's calls, and cancelling them.

A scheduled function running on a worker is a :class:`RunningCall` of its thread: its
variable updates may be queued without waiting, its whole-variable reads are read ahead (see
:mod:`convoy.distribute._readahead`), and once the coordinator cancels it, its next variable
operation raises CancelledError (:func:`raise_if_cancelled`); modules that keep state per
call free it with :meth:`RunningCall.on_finish`. A worker server's
:class:`CallRunner` answers its ``Run``, ``Cancel`` and ``Withdraw``; a function is unpickled
once per worker, by digest.

A one-at-a-time Run (a coordinator's at ``pipelining=1``) starts once no other such Run holds
the worker's turn: the coordinator sends the next while one runs, and the worker starts it as
soon as that one's function has returned. Its updates are queued by then, and every operation
the next sends to a ps leaves after them (one store's messages leave in order; its first read
carries them in the same message), so a step reads parameters as fresh as TensorFlow's. The
finished call answers once they have landed. A Run whose calls are cancelled gives the turn up
(it stops at its next variable operation, or is abandoned); one still waiting for the turn can
be withdrawn, and answers WithdrawnError.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from typing import Any

import cloudpickle

from convoy._base.bounded import BoundedDict
from convoy._transport.rpc import Outcome
from convoy.distribute import _readahead, _wire
from convoy.distribute._limits import oversize_function
from convoy.distribute._readahead import ReadAhead
from convoy.errors import CancelledError, InvalidArgumentError

#: Functions kept unpickled (by digest), and ids of calls cancelled before they started.
_UNPICKLED_KEPT = 1024
_CANCELLED_KEPT = 4096

log = logging.getLogger(__name__)


class RunningCall:
    """A scheduled function running in a thread of a worker: the variable updates it queued
    (it counts as done once they have landed), its read-ahead, whether the coordinator
    cancelled it, and what to run when it ends (:meth:`on_finish`)."""

    __slots__ = ("updates", "held", "reads", "cancelled", "body_ended", "_on_finish")

    def __init__(self, reads: ReadAhead | None = None) -> None:
        self.updates: list[Future[list[Any]]] = []
        #: the stores that hold some of the updates until their next message (or a flush())
        self.held: list[Any] = []
        self.body_ended = False
        self.reads = ReadAhead() if reads is None else reads
        self.cancelled = False
        self._on_finish: list[Callable[[], object]] = []

    def on_finish(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` when the scheduled function ends, whether it returned or raised, in
        its worker thread: for state kept per call (it must not outlive the call). Callbacks
        run in the order they were added, before the call's outcome is sent; one that raises
        is logged and does not change the outcome."""
        self._on_finish.append(fn)

    def finish(self) -> None:
        """Run the :meth:`on_finish` callbacks (once: they are cleared)."""
        callbacks, self._on_finish = self._on_finish, []
        for fn in callbacks:
            try:
                fn()
            except Exception:
                log.exception("an on_finish callback of a scheduled function failed")


class _ThisThread(threading.local):
    call: RunningCall | None = None  # the scheduled function this thread runs


_this_thread = _ThisThread()


def enter_call(call: RunningCall | None) -> None:
    """Mark this thread as running ``call`` (None: no scheduled function)."""
    _this_thread.call = call


def current_call() -> RunningCall | None:
    """The scheduled function this thread runs, or None."""
    return _this_thread.call


def raise_if_cancelled() -> None:
    """In a scheduled function the coordinator cancelled, raise CancelledError. Checked before
    every parameter-server call and every ``next`` of a per-worker iterator, so a cancelled
    function stops at its next variable operation."""
    call = _this_thread.call
    if call is not None and call.cancelled:
        raise CancelledError("the scheduled function was cancelled: another scheduled "
                             "function failed, or the coordinator shut down")


class CallRunner:
    """Runs the calls of a worker's ``Run`` requests (the first of a request in the serving
    thread, the others on ``pool``) and marks them cancelled on ``Cancel``. A function that
    pickles to more than ``max_function_bytes`` is refused."""

    def __init__(self, pool: Executor, max_function_bytes: int | None = None,
                 incarnation: str | None = None) -> None:
        self._pool = pool
        self._incarnation = incarnation
        self._max_function_bytes = max_function_bytes
        self._lock = threading.Lock()
        self._running: dict[int, RunningCall] = {}  # call id -> the call running under it
        #: ids of calls cancelled before they started
        self._cancelled_early: BoundedDict[int, None] = BoundedDict(_CANCELLED_KEPT)
        self._functions: BoundedDict[bytes, Callable[..., Any]] = BoundedDict(
            _UNPICKLED_KEPT)  # by digest
        self._turn = threading.Condition(self._lock)  # one-at-a-time Runs wait on it
        self._turn_holder: list[RunningCall] | None = None  # the calls of the Run holding it
        self._waiting: set[int] = set()  # ids of calls waiting for the turn
        #: ids of calls withdrawn while waiting, or before they arrived
        self._withdrawn: BoundedDict[int, None] = BoundedDict(_CANCELLED_KEPT)
        self.running = 0  # calls running now (for Status)
        self.done = 0  # calls that ended, with a result or an error

    def run(self, request: bytes | memoryview) -> bytes:
        """A worker's ``Run``: the request's calls, all at once; answers each one's pickled
        :class:`Outcome`. A call that fails cancels the others (as the coordinator would once
        it hears, which is when they end)."""
        calls, one_at_a_time, meant_for, followed = _wire.load_run_request(request)
        if meant_for is not None and meant_for != self._incarnation:
            replaced = _wire.WorkerReplacedError(
                f"this worker process ({self._incarnation}) is not the one the coordinator "
                f"last saw ({meant_for}): it restarted, and runs nothing until the coordinator "
                f"rebuilds its resources")
            return _wire.run_answer([_wire.pickle_outcome(Outcome(error=replaced))] * len(calls))
        mates = [RunningCall() for _ in calls]
        if one_at_a_time:
            withdrawn = self._take_turn(calls, mates)
            if withdrawn is not None:
                return withdrawn
        try:
            others = [self._pool.submit(self._pickled_outcome, call, running, mates, followed)
                      for call, running in zip(calls[1:], mates[1:], strict=True)]
            return _wire.run_answer([self._pickled_outcome(calls[0], mates[0], mates, followed),
                                     *(future.result() for future in others)])
        finally:
            if one_at_a_time:
                self._give_turn(mates)

    def _take_turn(self, calls: list[Any], mates: list[RunningCall]) -> bytes | None:
        """Wait for the turn of one-at-a-time Runs; the answer if the calls were withdrawn
        meanwhile. Calls cancelled meanwhile start at once (to answer CancelledError)."""
        ids = [call[3] for call in calls if _wire.is_call(call) and call[3] is not None]
        with self._turn:
            self._waiting.update(ids)
            try:
                while True:
                    if any(self._withdrawn.pop(i, 0) is None for i in ids):
                        outcome = _wire.pickle_outcome(Outcome(error=_wire.WithdrawnError(
                            "withdrawn before it started, to run on another worker")))
                        return _wire.run_answer([outcome] * len(calls))
                    if any(i in self._cancelled_early for i in ids):
                        return None
                    if self._turn_holder is None:
                        self._turn_holder = mates
                        return None
                    self._turn.wait()
            finally:
                self._waiting.difference_update(ids)

    def _give_turn(self, mates: list[RunningCall]) -> None:
        with self._turn:
            if self._turn_holder is mates:
                self._turn_holder = None
                self._turn.notify_all()

    def withdraw(self, request: bytes) -> bytes:
        """A worker's ``Withdraw``: calls of these ids that wait for the turn (or have not
        arrived yet) answer WithdrawnError instead of running; answers how many were
        waiting."""
        found = 0
        with self._turn:
            for call_id in _wire.load_ids(request, "Withdraw", "call"):
                found += call_id in self._waiting
                if call_id in self._waiting or call_id not in self._running:
                    self._withdrawn[call_id] = None
            self._turn.notify_all()
        return _wire.encode(found)

    def cancel(self, request: bytes) -> bytes:
        """A worker's ``Cancel``: mark the calls of these ids cancelled (one not started yet
        is cancelled as it starts); answers how many of them were running."""
        found = 0
        with self._turn:
            for call_id in _wire.load_ids(request, "Cancel", "call"):
                running = self._running.get(call_id)
                if running is not None:
                    running.cancelled = True
                    found += 1
                    # it stops at its next variable operation, or is abandoned: the next
                    # one-at-a-time Run need not wait for it
                    if self._turn_holder is not None and running in self._turn_holder:
                        self._turn_holder = None
                    continue
                self._cancelled_early[call_id] = None
            self._turn.notify_all()
        return _wire.encode(found)

    def _pickled_outcome(self, call: Any, running: RunningCall, mates: list[RunningCall],
                         followed: bool) -> bytes:
        with self._lock:
            self.running += 1
        try:
            outcome = oversize_function(call, self._max_function_bytes)
            if outcome is None:
                outcome = self._run_call(call, running)
                carrier = self._body_ended(running, mates) or followed
                outcome = self._landed(outcome, running, carrier)
        finally:
            with self._lock:
                self.running -= 1
                self.done += 1
        if outcome.error is not None and not isinstance(outcome.error, CancelledError):
            for mate in mates:
                mate.cancelled = True
        return _wire.pickle_outcome(outcome)

    def _body_ended(self, running: RunningCall, mates: list[RunningCall]) -> bool:
        """``running``'s function has returned: once all its Run's have, the Run's turn goes
        to the next one-at-a-time Run (its operations leave after the updates queued here);
        whether another call may carry the updates (it waits for the turn, or runs)."""
        with self._turn:
            running.body_ended = True
            if self._turn_holder is mates and all(mate.body_ended for mate in mates):
                self._turn_holder = None
                self._turn.notify_all()
            return bool(self._waiting) or self.running > 1

    def _landed(self, outcome: Outcome, running: RunningCall, carrier: bool) -> Outcome:
        """``outcome`` once the updates the call queued have landed (its error if one
        failed). Unless another call may carry those still queued (one runs or waits, or the
        coordinator said more are coming), they leave from this thread now."""
        updates = running.updates
        if not updates:
            return outcome
        if not carrier and not all(future.done() for future in updates):
            for store in running.held:
                store.flush()
        if len(updates) > 1:  # woken once, by the last answer, not once per answer due
            wait(updates)
        for future in updates:  # all of them, even after an error: nothing is left
            try:
                future.result()
            except Exception as error:
                if outcome.ok:
                    outcome = Outcome(error=error)
        return outcome

    def _run_call(self, call: Any, running: RunningCall) -> Outcome:
        """The outcome of one call's function (its updates may not have landed yet)."""
        well_formed = _wire.is_call(call)
        call_id = call[3] if well_formed else None
        digest = call[0] if well_formed else None
        if digest is not None:
            running.reads = ReadAhead(_readahead.plan_of(digest))
        if call_id is not None:
            with self._lock:
                self._running[call_id] = running
                if self._cancelled_early.pop(call_id, 0) is None:
                    running.cancelled = True
        enter_call(running)
        try:
            outcome = (Outcome(error=CancelledError("the scheduled function was cancelled "
                                                    "before it started"))
                       if running.cancelled else Outcome.of(self._call, call))
        finally:
            running.finish()
            enter_call(None)
            if digest is not None:
                _readahead.remember(digest, running.reads.reads)
            if call_id is not None:
                with self._lock:
                    if self._running.get(call_id) is running:
                        del self._running[call_id]
        return outcome

    def _call(self, call: Any) -> Any:
        if not _wire.is_call(call):
            raise InvalidArgumentError("a call must be a (digest, function, arguments, call "
                                       "id) tuple: three bytes and an int or None")
        digest, pickled, arguments, _ = call
        function = self._function(digest, pickled)
        args, kwargs = cloudpickle.loads(arguments)
        return function(*args, **kwargs)

    def _function(self, digest: bytes, pickled: bytes) -> Callable[..., Any]:
        """The function of ``digest``, unpickled on its first call only."""
        with self._lock:
            function = self._functions.get(digest)
        if function is None:
            function = cloudpickle.loads(pickled)
            with self._lock:
                self._functions[digest] = function
        return function
