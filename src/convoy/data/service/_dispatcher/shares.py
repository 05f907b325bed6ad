"""Equal shares of a shared iteration among ranks: how many of its elements each consumer may
hand to its caller, so that every rank hands out the same number.

The ranks' consumers (a rank's DataLoader workers) read one job first come, first served, and
report how many elements they took. A rank may hand out no more than ``floor(L / R)`` of
them, ``L`` being the elements taken by all so far and ``R`` the ranks: never more than its
final share, whatever the total turns out to be. Once every consumer has seen the end, the
total ``T`` is known and the shares are settled: each rank hands out ``T // R`` (``"drop"``:
the tail goes to no one) or ``ceil(T / R)`` (``"pad"``: copies of early elements fill the
gap); a rank that took more than its share hands its surplus over to those that took less.

Each consumer has an id (``reader``); its record is made from its own counts when it first
reports, so that the shares are rebuilt from the consumers' reports: by a dispatcher that
restarted (they are kept in memory only; a restart during the hand-over at the end fails the
readers rather than share wrongly), and by the consumers of a resumed reading, which report
a higher ``generation`` (each resume one more): the first report of a resumed consumer that
finds a lower generation, or another reader in its slot (an earlier resume from the same
states), starts the iteration's shares afresh from the counts the consumers saved. Another
reader coming to a slot (rank, loader worker), or to an iteration read to its end, reads an
epoch a second time: refused, naming the cause. No I/O: the server carries elements as opaque bytes.

A resumed consumer saved once the shares were settled is *frozen*: it hands out what its state
holds and reports its part of the settlement (how many it hands out in all, the rank's share,
the elements it received and handed over). Beside consumers saved before (their states older
than the settlement), the shares start afresh with those counts fixed and the rank's share
known: elements a frozen consumer handed over to a consumer saved before (which never had
them) are handed over again (*orphans*), and the elements a frozen consumer received from a
consumer saved before (which has them still, or will take them again from the resumed job)
are *claimed*: a live consumer holding one (told by its digest, see ``_client_shares``) asks,
and the dispatcher rules which of them discard it, one per claim.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter, deque

from convoy.errors import FailedPreconditionError, InvalidArgumentError

#: Shares no consumer has spoken of for this long are forgotten.
FORGET_AFTER_S = 600.0
#: How long the others wait for a new reader to take the place of one that stopped reading
#: before the end (such as a loader's workers for an iterator it discards), before failing.
TAKEOVER_S = 5.0


@dataclasses.dataclass(frozen=True)
class ShareReport:
    """What one consumer says of its reading (its counts are totals so far, so a report
    repeated after a lost answer changes nothing)."""

    key: str  # the iteration the ranks share
    world_size: int
    rank: int
    workers: int  # the rank's consumers
    worker: int
    pad: bool
    fetched: int  # elements it took from the job
    yielded: int  # of them, handed to its caller
    wants: bool  # its caller waits for one more
    exhausted: bool  # it has seen the job's end
    given: tuple[bytes, ...]  # elements it hands over (as the plan asked) ...
    given_start: int  # ... from this one on
    received: int  # elements received so far
    done: bool  # it has handed out all it will
    first: bool  # its first report
    full: bool  # it has taken as many as it may ahead of its caller
    error: str  # it failed so (and leaves)
    timeout_s: float  # how long a rank (or consumer) may be missing or silent
    now: float
    reader: int = 0  # the consumer's id
    generation: int = 0  # resumes of the iteration so far
    allowed: int = 0  # of its elements, those the dispatcher allowed (a total)
    settled: bool = False  # it has the settled shares
    mixed: bool = False  # it reads beside frozen consumers (it needs this record)
    discarded: tuple[bytes, ...] = ()  # digests of claimed elements its state discarded
    candidates: tuple[bytes, ...] = ()  # digests of its elements that match a claim, in order
    frozen: bool = False  # resumed once settled: the fields below are its part of that
    total: int = 0  # elements it hands out in the epoch in all
    share: int = 0  # each rank's
    claims: tuple[bytes, ...] = ()  # digests of the elements (not copies) it received
    gifts: tuple[bytes, ...] = ()  # the elements (not copies) it handed over
    firsts: tuple[bytes, ...] = ()  # its first elements, to pad with


@dataclasses.dataclass(frozen=True)
class ShareAnswer:
    """How many of its own elements the consumer may hand out (a total); once settled, what
    it hands over and receives."""

    allowed: int
    settled: bool = False
    give: int = 0  # its own elements after ``allowed`` to hand over (the rest are dropped)
    pad: int = 0  # copies of its first elements to hand over
    receive: int = 0  # elements it receives in all
    elements: tuple[bytes, ...] = ()  # received, from ``received`` on
    more: bool = False  # take more ahead: no consumer can go on otherwise
    share: int = 0  # settled: each rank's
    padded: tuple[bool, ...] = ()  # which of ``elements`` are copies ("pad")
    ready: bool = True  # every consumer has come (resumed: take nothing before)
    claims: tuple[bytes, ...] = ()  # ready: digests of elements to ask about when held
    discard: tuple[bool, ...] = ()  # the rulings on its candidates so far, in order


@dataclasses.dataclass
class _Consumer:
    rank: int
    worker: int
    reader: int = 0
    fetched: int = 0
    allowed: int = 0
    exhausted: bool = False
    done: bool = False
    left: bool = False  # done before the end
    error: str = ""  # why it left
    full: bool = False
    wanting: bool = False  # its caller waits for more than it may hand out
    seen: float = 0.0
    give: int = 0
    pad: int = 0
    receive: int = 0
    given: int = 0  # elements handed over so far
    inbox: list[bytes] = dataclasses.field(default_factory=list)
    padded: list[bool] = dataclasses.field(default_factory=list)  # of the inbox, the copies
    frozen: bool = False  # hands out what its state holds, alone
    rulings: list[bool] = dataclasses.field(default_factory=list)  # discard its candidates?


@dataclasses.dataclass
class _Iteration:
    world_size: int
    pad: bool
    started: float
    generation: int = 0
    resumed: bool = False  # made by a resumed reader (else new, or rebuilt after a restart)
    workers: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> consumers
    consumers: dict[tuple[int, int], _Consumer] = dataclasses.field(default_factory=dict)
    settled: bool = False
    #: settled: consumers still to receive, in order, and how many each
    owed: deque[tuple[_Consumer, int]] = dataclasses.field(default_factory=deque)
    seen: float = 0.0
    share: int | None = None  # each rank's: as frozen consumers said, or once settled
    #: frozen consumers' latest reports, by slot
    frozen: dict[tuple[int, int], ShareReport] = dataclasses.field(default_factory=dict)
    discarded: Counter[bytes] = dataclasses.field(default_factory=Counter)  # by the states
    #: once every consumer came: the elements to discard (digests), to hand over again
    claims: Counter[bytes] | None = None
    orphans: list[bytes] = dataclasses.field(default_factory=list)
    firsts: list[bytes] = dataclasses.field(default_factory=list)  # a frozen one's, to pad


class EqualShares:
    """The shares of every iteration read with equal shares, by key."""

    def __init__(self) -> None:
        self._iterations: dict[str, _Iteration] = {}
        #: iterations read to their end: their generation, and when
        self._finished: dict[str, tuple[int, float]] = {}

    def report(self, r: ShareReport) -> ShareAnswer:
        """Apply ``r``; the consumer's answer. FailedPreconditionError if a rank (or one of
        a rank's consumers) never came or went silent for ``timeout_s``, naming it."""
        self._forget(r.now)
        it = self._iteration(r)
        it.seen = r.now
        c = self._consumer(it, r)
        c.seen = r.now
        self._check_missing(it, r)
        if r.frozen:
            self._freeze(it, r)
        self._reconcile(it)
        self._rule(it, c, r)
        if it.settled:
            self._take(it, c, r)
        elif not c.frozen:
            c.fetched = max(c.fetched, r.fetched)
            c.exhausted = c.exhausted or r.exhausted
            c.left = r.done and not c.exhausted
            c.error = r.error
            c.full = r.full
            if r.wants and r.yielded >= c.allowed and self._ready(it):
                self._grant(it, c)
            c.wanting = r.wants and r.yielded >= c.allowed
            # settled only once needed: a reader saved before resumes beside the others
            if self._complete(it) and any(o.wanting for o in it.consumers.values()):
                self._settle(it)
        if r.done:
            c.done = True
            if self._present(it) and all(other.done for other in it.consumers.values()):
                del self._iterations[r.key]
                if not c.left:
                    self._finished[r.key] = (it.generation, r.now)
        return self._answer(c, r)

    # ----- before the end: grants bounded by the elements taken so far ---------------------------
    def _iteration(self, r: ShareReport) -> _Iteration:
        it = self._iterations.get(r.key)
        resumed = r.first and r.generation > 0
        if it is not None and resumed:
            c = it.consumers.get((r.rank, r.worker))
            if r.generation > it.generation or (c is not None and c.reader != r.reader):
                it = None  # a new resume: the others come too
        elif it is not None and r.generation < it.generation:
            raise FailedPreconditionError(
                f"{r.key} was resumed from saved states since this reader started (rank "
                f"{r.rank}'s loader worker {r.worker}): it cannot go on beside them")
        if it is None:
            if r.settled or r.mixed:
                raise FailedPreconditionError(
                    f"the dispatcher no longer knows the settled equal shares of {r.key} (it "
                    "restarted while the ranks handed elements over, or while readers "
                    "resumed beside readers saved once settled): their readers cannot go on")
            if r.key in self._finished and not resumed:
                raise FailedPreconditionError(_again(r, "was read to its end"))
            it = self._iterations[r.key] = _Iteration(r.world_size, r.pad, r.now,
                                                      r.generation, resumed)
        if (r.world_size, r.pad) != (it.world_size, it.pad):
            raise InvalidArgumentError(
                f"the readers of {r.key} disagree: world_size {r.world_size} and "
                f"equal_shares={'pad' if r.pad else 'drop'!r} here, {it.world_size} and "
                f"{'pad' if it.pad else 'drop'!r} elsewhere")
        return it

    def _consumer(self, it: _Iteration, r: ShareReport) -> _Consumer:
        if not 0 <= r.rank < it.world_size or not 0 <= r.worker < r.workers:
            raise InvalidArgumentError(
                f"rank {r.rank} of {it.world_size}, loader worker {r.worker} of {r.workers}: "
                "out of range")
        workers = it.workers.setdefault(r.rank, r.workers)
        if workers != r.workers:
            raise InvalidArgumentError(
                f"rank {r.rank}'s readers of {r.key} disagree on its number of loader "
                f"workers ({workers} and {r.workers})")
        c = it.consumers.get((r.rank, r.worker))
        if c is not None and c.reader != r.reader and r.first and _replaceable(c):
            c = None  # its reader left (say, a loader's discarded worker), or took nothing
            del it.consumers[r.rank, r.worker]
        if c is not None and c.reader != r.reader:
            raise FailedPreconditionError(_again(r, "was read to its end" if c.done or c.exhausted
                                                 else "is still being read"))
        if c is None and it.resumed and not r.first:  # (its record went with the resume)
            raise FailedPreconditionError(
                f"{r.key} was resumed from saved states since this reader started (rank "
                f"{r.rank}'s loader worker {r.worker}): it cannot go on beside them")
        if c is None:
            if it.settled:
                raise FailedPreconditionError(
                    f"rank {r.rank}'s loader worker {r.worker} came to {r.key} after its "
                    "shares were settled")
            # its own counts: 0 if new, else saved (resumed) or kept (a restarted dispatcher)
            c = it.consumers[r.rank, r.worker] = _Consumer(
                r.rank, r.worker, r.reader, r.fetched, min(r.allowed, r.fetched), r.exhausted,
                frozen=r.frozen)
            it.discarded.update(r.discarded)
        return c

    # ----- consumers saved once settled, beside others saved before ------------------------------
    def _freeze(self, it: _Iteration, r: ShareReport) -> None:
        if it.share is not None and it.share != r.share:
            raise InvalidArgumentError(
                f"the readers of {r.key} saved once settled disagree on the ranks' share "
                f"({it.share} and {r.share}): their states are of different epochs")
        it.share = r.share
        it.frozen[r.rank, r.worker] = r

    def _ready(self, it: _Iteration) -> bool:
        """Whether consumers may take and hand out: resumed, or beside frozen consumers, once
        every consumer came (so the claims are known)."""
        return not (it.resumed or it.frozen) or self._present(it)

    def _reconcile(self, it: _Iteration) -> None:
        """Once ready, the claims and orphans the frozen consumers leave (see the module)."""
        if it.claims is not None or not self._ready(it):
            return
        received = Counter(d for f in it.frozen.values() for d in f.claims)
        for gift in (g for f in it.frozen.values() for g in f.gifts):
            if received[digest(gift)]:
                received[digest(gift)] -= 1  # handed from frozen to frozen
            else:
                it.orphans.append(gift)  # to a consumer saved before: it never had it
        it.claims = +(received - it.discarded)
        it.firsts = next((list(f.firsts) for f in it.frozen.values() if f.firsts), [])

    def _rule(self, it: _Iteration, c: _Consumer, r: ShareReport) -> None:
        """Rule on ``c``'s new candidates: each claim is discarded by the first to ask."""
        if it.claims is None:
            return
        for d in r.candidates[len(c.rulings):]:
            hit = it.claims[d] > 0
            if hit:
                it.claims[d] -= 1
            c.rulings.append(hit)

    def _granted(self, it: _Iteration, rank: int) -> int:
        return sum(c.allowed for c in it.consumers.values() if c.rank == rank)

    def _grant(self, it: _Iteration, c: _Consumer) -> None:
        if it.share is not None:  # known: no rank hands out more
            room = it.share - self._granted(it, c.rank)
        else:
            taken = sum(other.fetched for other in it.consumers.values())
            room = taken // it.world_size - self._granted(it, c.rank)
        held = c.fetched - c.allowed
        grant = min(held, room, max(1, room // it.workers[c.rank]))
        if grant > 0:
            c.allowed += grant

    def _check_missing(self, it: _Iteration, r: ShareReport) -> None:
        """Fail if a consumer left before the end, or a rank or consumer is missing or
        silent beyond ``timeout_s``."""
        for gone in it.consumers.values():
            if gone.left and not gone.error and r.now - gone.seen < TAKEOVER_S:
                continue  # another reader may take its place
            if gone.left and (gone.rank, gone.worker) != (r.rank, r.worker):
                why = f"failed ({gone.error})" if gone.error else "stopped reading"
                raise FailedPreconditionError(
                    f"rank {gone.rank}'s loader worker {gone.worker} {why} before the end of "
                    f"{r.key}: the ranks cannot finish the epoch together")
        if r.now - it.started < r.timeout_s:
            return
        for rank in range(it.world_size):
            if rank not in it.workers:  # (settled shares have every rank)
                raise FailedPreconditionError(
                    f"rank {rank} of {it.world_size} never came to read its equal share of "
                    f"{r.key} within {r.timeout_s:.1f} s (dispatcher_timeout_ms): the other "
                    "ranks cannot finish the epoch together without it")
            for worker in range(it.workers[rank]):
                c = it.consumers.get((rank, worker))
                if c is None and not it.settled:
                    raise FailedPreconditionError(
                        f"rank {rank}'s loader worker {worker} never came to read {r.key} "
                        f"within {r.timeout_s:.1f} s (dispatcher_timeout_ms)")
                if (c is not None and not c.done and not c.frozen
                        and r.now - c.seen > r.timeout_s):
                    raise FailedPreconditionError(
                        f"rank {rank}'s loader worker {worker} reading {r.key} has been silent "
                        f"for {r.now - c.seen:.1f} s (dispatcher_timeout_ms): it stopped?")

    # ----- the end: the shares settled, surplus handed over -------------------------------------
    def _stuck(self, it: _Iteration, c: _Consumer) -> bool:
        """Whether ``c`` must take more ahead of its caller: a caller waits for more than it
        may hand out, every consumer has come, and each has either seen the end or taken all
        it may, so only more taken ahead lets the end be seen (the elements ``c`` takes may
        be another rank's share, handed over once settled)."""
        return (c.full and self._present(it)
                and any(o.wanting for o in it.consumers.values())
                and all(o.exhausted or o.full for o in it.consumers.values()))

    def _present(self, it: _Iteration) -> bool:
        return (len(it.workers) == it.world_size
                and len(it.consumers) == sum(it.workers.values()))

    def _complete(self, it: _Iteration) -> bool:
        return self._present(it) and all(c.exhausted for c in it.consumers.values())

    def _settle(self, it: _Iteration) -> None:
        unfound = sum(it.claims.values()) if it.claims else 0
        if unfound:
            raise FailedPreconditionError(
                f"{unfound} elements that readers saved once the shares were settled had "
                "received were not found again among those the readers saved before hold or "
                "took again: the pipeline after distribute makes other elements when resumed "
                "(a batch after distribute, or randomness without a seed), so the epoch "
                "cannot be resumed from these states with each element once")
        total = sum(c.fetched for c in it.consumers.values())
        share = it.share
        if share is None:
            share = -(-total // it.world_size) if it.pad else total // it.world_size
        surplus: list[_Consumer] = []
        wanting: list[tuple[_Consumer, int]] = []
        for rank in range(it.world_size):
            mine = [it.consumers[rank, w] for w in range(it.workers[rank])]
            live = [c for c in mine if not c.frozen]
            need = max(0, share - self._granted(it, rank))
            for c in live:
                keep = min(c.fetched - c.allowed, need)
                c.allowed += keep
                need -= keep
                if c.fetched > c.allowed:
                    surplus.append(c)
            for index, c in enumerate(live):  # the rank's lack, spread over its consumers
                c.receive = need // len(live) + (index < need % len(live))
                if c.receive:
                    wanting.append((c, c.receive))
        it.share, it.owed, it.settled = share, deque(wanting), True
        lacking = sum(n for _, n in wanting)
        for orphan in it.orphans[:lacking]:  # in "drop", the rest go to no one
            self._deliver(it, orphan, False)
        lacking = max(0, lacking - len(it.orphans))
        for c in surplus:
            c.give = min(c.fetched - c.allowed, lacking)
            lacking -= c.give
        if lacking:  # "pad" (fewer than world_size): copies of one consumer's first ones
            first = next((c for c in it.consumers.values() if c.fetched and not c.frozen),
                         None)
            if first is not None:
                first.pad = lacking
            elif not it.firsts:
                raise FailedPreconditionError(
                    f"the ranks lack {lacking} elements of {it.share} each, but no reader of "
                    "the epoch has an element to pad with")
            for index in range(lacking if first is None else 0):
                self._deliver(it, it.firsts[index % len(it.firsts)], True)

    def _take(self, it: _Iteration, c: _Consumer, r: ShareReport) -> None:
        """Put the elements ``c`` hands over into the inboxes of those owed them."""
        fresh = r.given[max(0, c.given - r.given_start):]
        for element in fresh:
            c.given += 1
            self._deliver(it, element, c.given > c.give, r.key)

    def _deliver(self, it: _Iteration, element: bytes, padded: bool, key: str = "") -> None:
        if not it.owed:
            raise InvalidArgumentError(f"more elements handed over for {key} than owed")
        owed, count = it.owed[0]
        owed.inbox.append(element)
        owed.padded.append(padded)
        if count == 1:
            it.owed.popleft()
        else:
            it.owed[0] = (owed, count - 1)

    def _answer(self, c: _Consumer, r: ShareReport) -> ShareAnswer:
        it = self._iterations.get(r.key)
        if it is None:
            return ShareAnswer(c.allowed, settled=True, discard=tuple(c.rulings))
        ready = self._ready(it)
        claims = tuple(+it.claims) if ready and it.claims else ()
        if not it.settled:
            return ShareAnswer(c.allowed, more=self._stuck(it, c), share=it.share or 0,
                               ready=ready, claims=claims, discard=tuple(c.rulings))
        return ShareAnswer(c.allowed, True, c.give, c.pad, c.receive,
                           tuple(c.inbox[r.received:]), share=it.share or 0,
                           padded=tuple(c.padded[r.received:]), claims=claims,
                           discard=tuple(c.rulings))

    def _forget(self, now: float) -> None:
        for key in [k for k, it in self._iterations.items() if now - it.seen > FORGET_AFTER_S]:
            del self._iterations[key]
        for key in [k for k, (_, at) in self._finished.items() if now - at > FORGET_AFTER_S]:
            del self._finished[key]


def digest(message: bytes) -> bytes:
    """An element's digest, from its codec message: equal elements have equal ones."""
    return hashlib.blake2b(message, digest_size=16).digest()


def _replaceable(c: _Consumer) -> bool:
    """Whether another reader may take ``c``'s place: its reader stopped before the end (not
    failing), or had taken nothing so far as it said."""
    return (c.left and not c.error) or (c.fetched == 0 and not c.exhausted)


def _again(r: ShareReport, how: str) -> str:
    """Why a reader coming to an iteration another reader of its slot had is refused."""
    return (f"rank {r.rank}'s loader worker {r.worker} came to read {r.key} again, which "
            f"{how} by another reader: each epoch is read once. Call set_epoch(epoch) with "
            "a new epoch before each pass (or resume the pass from a saved state)")
