"""One consumer's side of equal shares (see :mod:`._dispatcher.shares`): the elements of a
shared job, handed to the caller only as the dispatcher allows, so that every rank hands out
the same number.

A pump thread takes elements from the job ahead of the caller (a bounded few); a talk thread
reports to the dispatcher and learns how many of them the caller may have, and, at the end,
what to hand over to other ranks and what to receive from them.

A consumer's position (:func:`share_state`) is its counts, the elements it took but did not
hand out, and its job reader's position taken together; once the shares are settled, the
elements it has still to hand out and its part of the settlement (how many it hands out in
all, the rank's share, the digests of the elements it received, the elements it handed over).
A consumer resumed from it (:meth:`Share.resume`) reports the next ``generation``: the
dispatcher starts the shares afresh from the resumed consumers' counts, those resumed once
settled ("frozen") handing out what their states hold (:mod:`._dispatcher.shares`). A resumed
consumer takes nothing before every consumer has come; then it asks about each element it
holds whose digest the dispatcher claims, and discards those it is told to.
"""

from __future__ import annotations

import copy
import functools
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from convoy._base import threads as _threads
from convoy._transport import rpc as _rpc
from convoy._values.codec import Encoder, decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._dispatcher.shares import digest as _digest
from convoy.errors import DeadlineExceededError, InvalidArgumentError

#: Elements a consumer takes from the job beyond those its caller has.
AHEAD = 16
#: How often a consumer reports while nothing changes ...
IDLE_S = 0.2
#: ... and while its caller waits for the dispatcher's leave.
WAITING_S = 0.02


class Share:
    """Where a consumer stands; guarded by ``cond``."""

    def __init__(self, key: str, rank: int, world_size: int, worker: int, workers: int,
                 pad: bool, timeout_s: float) -> None:
        self.request = pb.ShareRequest(key=key, rank=rank, world_size=world_size,
                                       worker=worker, workers=workers, pad=pad,
                                       timeout_ms=int(timeout_s * 1000), first=True,
                                       reader=_reader_id())
        self.cond = threading.Condition()
        self.reading = threading.Lock()  # held while the pump takes an element from the job
        self.iterator: Any = None  # the job's reader, once open
        self.iterator_state: Any = None  # where it resumes
        self.remaining: list[Any] | None = None  # resumed once settled: all it hands out
        self.frozen: dict[str, Any] | None = None  # ... and its part of the settlement
        self.held: deque[Any] = deque()  # taken, not yet handed out
        self.unscreened: deque[Any] = deque()  # resumed: held before, not yet screened
        self.ready = False  # every consumer came: the claims are known
        self.mixed = False  # it reads beside frozen consumers
        self.claims: frozenset[bytes] = frozenset()  # digests to ask about
        self.pending: deque[Any] = deque()  # its elements asked about, not yet ruled on
        self.candidates: list[bytes] = []  # the digests asked about, in order
        self.discarded: list[bytes] = []  # of them, those it discarded
        self.firsts: list[Any] = []  # "pad": copies of its first elements
        self.keep_firsts = world_size - 1 if pad else 0
        self.fetched = self.yielded = 0
        self.allowed = 0
        self.exhausted = False
        self.wants = False
        self.ahead = AHEAD  # elements it may take ahead of its caller
        self.full = False  # it has taken as many
        self.settled: pb.ShareResponse | None = None
        self.handed_over = False
        self.gifts: list[bytes] = []  # the elements (not copies) it handed over
        self.claimed: list[bytes] = []  # digests of the elements (not copies) it received
        self.inbox: deque[Any] = deque()
        self.received = 0
        self.done = False  # the caller has had all it will
        self.stopped = False  # the caller left
        self.answered = False  # the dispatcher answered its first report
        self.reported = False  # the dispatcher heard its last report
        self.error: BaseException | None = None

    def resume(self, state: dict[str, Any]) -> None:
        """Start from ``state`` (from :func:`share_state`), as the next generation."""
        if not isinstance(state, dict) or not set(STATE_KEYS) <= set(state):
            raise InvalidArgumentError("the equal share's state must be a dict from "
                                       f"share_state(), got {state!r:.100}")
        self.request.key = state["key"]  # the saved reading's, whatever the job's name now
        self.request.generation = state["generation"] + 1
        self.iterator_state = state["iterator"]
        self.discarded = list(state.get("discarded", ()))
        self.request.discarded.extend(self.discarded)
        if state["remaining"] is not None:
            self.remaining = list(state["remaining"])
            self.frozen = state.get("settlement")
            return
        # its held elements are counted once screened against the claims
        self.fetched = self.yielded = self.allowed = state["yielded"]
        self.exhausted = state["exhausted"]
        self.unscreened.extend(state["held"])
        self.firsts = list(state["firsts"])

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()


def _reader_id() -> int:
    """A new consumer's id, unique to it: from the OS, not ``random``, which torch seeds in a
    loader worker from the loader's base seed and worker id, and which torchdata's
    ``StatefulDataLoader`` restores from a saved state: drawn from it, the workers of every
    loader resumed from one state had the same ids, so the dispatcher took a resumed reader
    for the one it replaces (a dropped loader's worker reading on), the two sharing one
    record."""
    return secrets.randbits(62) + 1


STATE_KEYS = ("key", "generation", "iterator", "remaining", "fetched", "yielded", "exhausted",
              "held", "firsts")  # and "discarded", "settlement"


def digest(element: Any) -> bytes:
    """``element``'s digest, as the dispatcher takes it from its codec message."""
    return _digest(Encoder(None).encode([element]))


def share_state(share: Share) -> dict[str, Any]:
    """``share``'s position: see the module's docstring. Once settled, it waits (up to the
    dispatcher timeout) for the elements handed over to it."""
    timeout_s = share.request.timeout_ms / 1000
    state: dict[str, Any] = dict.fromkeys(STATE_KEYS)
    state["key"], state["generation"] = share.request.key, share.request.generation
    state["discarded"] = list(share.discarded)
    if share.remaining is not None:  # resumed settled: what is left of it
        with share.cond:
            return {**state, "iterator": share.iterator_state,
                    "remaining": list(share.remaining), "settlement": share.frozen}
    if not share.reading.acquire(timeout=timeout_s):
        raise DeadlineExceededError(
            f"saving the equal share of {share.request.key}: its reader did not take its "
            f"element from the job within {timeout_s:.1f} s")
    try:
        with share.cond:
            iterator = share.iterator_state if share.iterator is None else (
                share.iterator.state_dict())
            state["iterator"] = iterator
            if share.settled is None:
                held = list(share.held) + list(share.pending) + list(share.unscreened)
                return {**state, "fetched": share.fetched, "yielded": share.yielded,
                        "exhausted": share.exhausted, "held": held,
                        "firsts": list(share.firsts)}
            if not share.cond.wait_for(functools.partial(_received_all, share), timeout_s):
                raise DeadlineExceededError(
                    f"saving the equal share of {share.request.key}: the elements other "
                    f"ranks hand over did not come within {timeout_s:.1f} s")
            return {**state, "remaining": list(share.held) + list(share.inbox),
                    "settlement": _settlement(share)}
    finally:
        share.reading.release()


def _settlement(share: Share) -> dict[str, Any]:
    """``share``'s part of the settled shares, for a resume beside readers saved before."""
    settled = share.settled
    assert settled is not None
    encoder = Encoder(None)
    return {"total": settled.allowed + settled.receive, "share": settled.share,
            "claims": list(share.claimed), "gifts": list(share.gifts),
            "firsts": [encoder.encode([first]) for first in share.firsts]}


def _received_all(share: Share) -> bool:
    settled = share.settled
    return share.error is not None or (settled is not None and share.handed_over
                                       and share.received >= settled.receive)


def equal_share(open_elements: Callable[[], AbstractContextManager[Any]],
                dispatcher: _rpc.Client, share: Share) -> Iterator[Any]:
    """This consumer's elements of the job ``open_elements`` reads, as the dispatcher
    allows; closes ``dispatcher`` at the end."""
    if share.remaining is not None:  # resumed once settled: it hands out what it holds
        yield from _frozen(open_elements, dispatcher, share)
        return
    _threads.start("convoy-share-pump", _pump, open_elements, share, on_error=share.fail)

    def talk_failed(error: BaseException) -> None:
        share.fail(error)
        dispatcher.close()

    talk = _threads.start("convoy-share-talk", _talk, dispatcher, share, on_error=talk_failed)
    ended = False
    try:
        while True:
            element = _next(share)
            if element is _END:
                ended = True
                return
            yield element
    finally:
        with share.cond:
            share.stopped = True
            share.cond.notify_all()
        if ended:  # the dispatcher hears of the end before the process may exit
            _wait_reported(share, talk)


def _frozen(open_elements: Callable[[], AbstractContextManager[Any]],
            dispatcher: _rpc.Client, share: Share) -> Iterator[Any]:
    """A consumer resumed once settled: what it holds, its part of the settlement said to
    the dispatcher first (for the consumers resumed beside it) and its end last."""
    try:
        if share.frozen is not None:
            _report_frozen(dispatcher, share, done=False)
        _join_at_end(open_elements, share)
        while share.remaining:
            yield share.remaining.pop(0)
        if share.frozen is not None:
            _report_frozen(dispatcher, share, done=True)
    finally:
        dispatcher.close()


def _report_frozen(dispatcher: _rpc.Client, share: Share, done: bool) -> None:
    frozen = share.frozen
    assert frozen is not None
    request = pb.ShareRequest()
    request.CopyFrom(share.request)
    share.request.first = False
    request.frozen, request.exhausted, request.done = True, True, done
    request.fetched = request.allowed = request.yielded = frozen["total"]
    request.total, request.share = frozen["total"], frozen["share"]
    request.claims.extend(frozen["claims"])
    request.gifts.extend(frozen["gifts"])
    request.firsts.extend(frozen["firsts"])
    timeout_s = share.request.timeout_ms / 1000
    _rpc.retry(functools.partial(dispatcher.call, "Share", request), timeout_s,
               f"equal shares at dispatcher {dispatcher.address}")


def _wait_reported(share: Share, talk: threading.Thread) -> None:
    timeout_s = share.request.timeout_ms / 1000
    talk.join(timeout_s)
    if not share.reported and share.error is None:
        raise DeadlineExceededError(
            f"the dispatcher did not hear the end of this reader's equal share of "
            f"{share.request.key} within {timeout_s:.1f} s")


_END = object()


def _next(share: Share) -> Any:
    with share.cond:
        while True:
            if share.error is not None:
                raise share.error
            if share.yielded < share.allowed:
                share.yielded += 1
                share.wants = False
                share.cond.notify_all()
                return share.held.popleft()
            settled = share.settled
            if settled is not None and share.handed_over:
                if share.inbox:
                    return share.inbox.popleft()
                if share.received >= settled.receive:
                    share.done = True
                    share.cond.notify_all()
                    return _END
            if not share.wants:
                share.wants = True
                share.cond.notify_all()
            share.cond.wait(IDLE_S)


def _pump(open_elements: Callable[[], AbstractContextManager[Any]],
          share: Share) -> None:
    """Take elements from the job, a few ahead of the caller."""
    try:
        with share.cond:  # (a reading the dispatcher refuses does not open the job)
            share.cond.wait_for(lambda: share.ready or share.error is not None
                                or share.stopped)
            if share.error is not None or share.stopped:
                return
        while share.unscreened:  # resumed: its held elements, screened now
            _take(share, share.unscreened[0], share.unscreened.popleft)
        if share.exhausted:  # resumed after the end
            _join_at_end(open_elements, share)
            return
        with open_elements() as elements:
            with share.cond:
                share.iterator = elements
            while _room(share):
                with share.reading:
                    element = next(elements, _END)
                    if element is _END:
                        with share.cond:
                            share.iterator_state = elements.state_dict()
                            share.iterator = None
                            share.exhausted = True
                            share.cond.notify_all()
                        return
                    _take(share, element)
    except BaseException as error:
        share.fail(error)


def _take(share: Share, element: Any, taken: Callable[[], Any] | None = None) -> None:
    """Hold ``element``, or ask about it first if the dispatcher claims its digest;
    ``taken`` (if given) is called as it is."""
    found = digest(element) if share.claims else None
    with share.cond:
        if taken is not None:
            taken()
        if found is not None and found in share.claims:
            share.pending.append(element)
            share.candidates.append(found)
        else:
            _keep(share, element)
        share.cond.notify_all()


def _keep(share: Share, element: Any) -> None:
    share.held.append(element)
    share.fetched += 1
    if len(share.firsts) < share.keep_firsts:
        share.firsts.append(copy.deepcopy(element))


def _join_at_end(open_elements: Callable[[], AbstractContextManager[Any]],
                 share: Share) -> None:
    """Read the job from a position saved at its end: a resumed shared job waits for all the
    consumers that saved it, so this one joins it (and reads nothing)."""
    with open_elements() as elements:
        if next(elements, _END) is not _END:
            raise InvalidArgumentError(
                f"the equal share of {share.request.key} was saved at the end of the job, "
                "but its reader resumed from that position yields more")
        with share.cond:  # its position in the resumed job, for a state saved again
            share.iterator_state = elements.state_dict()


def _room(share: Share) -> bool:
    """Wait until the pump may take another element; whether it goes on."""
    with share.cond:
        while not (share.stopped or share.error is not None
                   or len(share.held) - (share.allowed - share.yielded) < share.ahead):
            share.full = True
            share.cond.wait()
        share.full = False
        return not (share.stopped or share.error is not None)


def _talk(dispatcher: _rpc.Client, share: Share) -> None:
    """Report to the dispatcher until the caller has had all its share (or left)."""
    encoder = Encoder(None)
    timeout_s = share.request.timeout_ms / 1000
    try:
        while True:
            with share.cond:
                request = _request(share, encoder)
                if share.error is not None:  # the others fail at once, told why
                    request.done = True
                    request.error = f"{type(share.error).__name__}: {share.error}"
            answer = _rpc.retry(functools.partial(dispatcher.call, "Share", request),
                                timeout_s, f"equal shares at dispatcher {dispatcher.address}")
            if request.done:
                with share.cond:
                    share.reported = True
                return
            with share.cond:
                share.answered = True
                _apply(share, answer)
                share.cond.notify_all()
                # report again soon, and at once (but no more often) when there is news
                share.cond.wait(WAITING_S)
                if not _waiting(share):
                    share.cond.wait_for(functools.partial(_changed, share, request), IDLE_S)
    except BaseException as error:
        share.fail(error)
    finally:
        dispatcher.close()


def _waiting(share: Share) -> bool:
    """Whether someone waits on the dispatcher: the caller for leave, the pump for rulings,
    or the settled shares for elements to hand over or receive."""
    if share.pending:
        return True
    settled = share.settled
    if settled is not None:
        return not share.handed_over or share.received < settled.receive
    return share.wants and share.yielded >= share.allowed


def _changed(share: Share, reported: pb.ShareRequest) -> bool:
    """Whether there is news since the report ``reported``."""
    return (_waiting(share) or share.error is not None or share.done or share.stopped
            or (share.fetched, _exhausted(share), share.full)
            != (reported.fetched, reported.exhausted, reported.full))


def _exhausted(share: Share) -> bool:
    """Whether it has seen the job's end and counted all it took (its counts are final)."""
    return share.exhausted and not share.unscreened and not share.pending


def _request(share: Share, encoder: Encoder) -> pb.ShareRequest:
    request = pb.ShareRequest()
    request.CopyFrom(share.request)
    share.request.first = False
    request.fetched, request.yielded = share.fetched, share.yielded
    request.wants, request.exhausted = share.wants, _exhausted(share)
    request.full, request.mixed = share.full, share.mixed
    request.candidates.extend(share.candidates)
    request.received = share.received
    request.done = share.done or share.stopped
    request.allowed, request.settled = share.allowed, share.settled is not None
    settled = share.settled
    if settled is not None and not share.handed_over:
        # own elements after those allowed, then copies of its first ones
        extra = list(share.held)[share.allowed - share.yielded:]
        firsts = share.firsts
        given = extra[:settled.give] + [firsts[i % len(firsts)] for i in range(settled.pad)]
        request.given.extend(encoder.encode([element]) for element in given)
        share.gifts = list(request.given[:settled.give])
        for _ in extra:
            share.held.pop()  # dropped, or handed over
        share.handed_over = True
    return request


def _apply(share: Share, answer: pb.ShareResponse) -> None:
    if answer.ready and not share.ready:
        share.ready, share.mixed = True, answer.share > 0 and not answer.settled
    if answer.ready:
        share.claims = frozenset(answer.claims)
    for index in range(len(share.candidates) - len(share.pending), len(answer.discard)):
        element = share.pending.popleft()  # ruled on: discarded, or its own after all
        if answer.discard[index]:
            share.discarded.append(share.candidates[index])
        else:
            _keep(share, element)
    share.allowed = max(share.allowed, answer.allowed)
    if answer.more and share.full:
        share.ahead += AHEAD
    if answer.settled and share.settled is None:
        share.settled = answer
    for message, padded in zip(answer.elements, answer.padded):
        share.inbox.extend(decode(message))
        share.received += 1
        if not padded:
            share.claimed.append(_digest(message))
