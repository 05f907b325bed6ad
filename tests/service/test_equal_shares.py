"""The dispatcher's equal shares (pure): grants bounded by what all ranks took so far, shares
settled at the end with the surplus handed over, and ranks that never come named."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from convoy.data.service._client_shares import Share
from convoy.data.service._dispatcher.shares import EqualShares, ShareReport, digest
from convoy.errors import FailedPreconditionError, InvalidArgumentError


def report(rank: int, *, world_size: int = 2, workers: int = 1, worker: int = 0,
           now: float = 0.0, **fields: Any) -> ShareReport:
    base = ShareReport(key="job 'j', repetition 0", world_size=world_size, rank=rank,
                       workers=workers, worker=worker, pad=False, fetched=0, yielded=0,
                       wants=False, exhausted=False, given=(), given_start=0, received=0,
                       done=False, first=True, full=False, error="", timeout_s=10.0, now=now)
    return dataclasses.replace(base, **fields)


def test_a_rank_hands_out_no_more_than_its_share_of_what_all_took():
    shares = EqualShares()
    shares.report(report(1, fetched=2))
    answer = shares.report(report(0, fetched=10, wants=True))
    assert answer.allowed == 6  # floor(12 / 2), nothing granted to rank 0 before
    assert shares.report(report(0, fetched=10, yielded=6, wants=True)).allowed == 6
    assert shares.report(report(1, fetched=4, wants=True)).allowed == 4  # floor(14 / 2) = 7
    assert shares.report(report(0, fetched=10, yielded=6, wants=True)).allowed == 7


@pytest.mark.parametrize(("pad", "share"), [(False, 3), (True, 4)])
def test_at_the_end_surplus_goes_to_the_ranks_that_lack(pad, share):
    """7 elements, 2 ranks: rank 0 took 6, rank 1 one; each gets 3 ("drop": one left over)
    or 4 ("pad": a copy of one of the first)."""
    shares = EqualShares()
    shares.report(report(1, fetched=1, pad=pad))
    shares.report(report(0, fetched=6, pad=pad, wants=True))
    shares.report(report(1, fetched=1, pad=pad, exhausted=True, first=False, wants=True))
    rich = shares.report(report(0, fetched=6, pad=pad, exhausted=True, first=False))
    assert not rich.settled  # not before a reader needs it: rank 1 may hand out its one
    shares.report(report(1, fetched=1, pad=pad, exhausted=True, first=False, wants=True,
                         yielded=1))
    rich = shares.report(report(0, fetched=6, pad=pad, exhausted=True, first=False))
    assert (rich.allowed, rich.settled, rich.give, rich.receive) == (share, True, 2, 0)
    poor = shares.report(report(1, fetched=1, pad=pad, exhausted=True, first=False,
                                yielded=1))
    assert (poor.allowed, poor.receive, poor.give, poor.elements) == (1, share - 1, 0, ())
    assert rich.pad + poor.pad == (1 if pad else 0)
    shares.report(report(0, fetched=6, pad=pad, given=(b"a", b"b"), first=False))
    shares.report(report(0, fetched=6, pad=pad, given=(b"a", b"b"), first=False))  # again
    if pad:
        shares.report(report(1, pad=pad, given=(b"first",), first=False))
    owed = (b"a", b"b", b"first")[:share - 1]
    assert shares.report(report(1, pad=pad, received=1, first=False)).elements == owed[1:]


def test_a_rank_that_never_comes_is_named_after_the_timeout():
    shares = EqualShares()
    shares.report(report(0, world_size=3, now=0.0))
    shares.report(report(2, world_size=3, now=5.0))
    with pytest.raises(FailedPreconditionError, match="rank 1 of 3 never came.*10.0 s"):
        shares.report(report(0, world_size=3, now=11.0, first=False))


def test_a_consumer_that_fails_or_goes_silent_is_named():
    shares = EqualShares()
    shares.report(report(0, workers=2, worker=0))
    shares.report(report(0, workers=2, worker=1))
    shares.report(report(0, workers=2, worker=0, now=5.0, first=False))
    shares.report(report(1, now=1.0))
    with pytest.raises(FailedPreconditionError, match="rank 0's loader worker 1 reading .* "
                                                      "silent for 12.0 s"):
        shares.report(report(1, now=12.0, first=False))
    shares.report(report(0, workers=2, worker=1, now=13.0, done=True, error="OSError: disk"))
    with pytest.raises(FailedPreconditionError, match=r"worker 1 failed \(OSError: disk\)"):
        shares.report(report(0, workers=2, worker=0, now=13.0, first=False))


def test_full_consumers_take_more_only_when_none_can_go_on_and_a_caller_waits():
    shares = EqualShares()
    shares.report(report(0, fetched=16, full=True))
    assert not shares.report(report(0, fetched=16, full=True)).more  # rank 1 not here yet
    assert not shares.report(report(1, fetched=3)).more
    assert shares.report(report(0, fetched=16, full=True)).more is False  # rank 1 may go on
    shares.report(report(1, fetched=3, exhausted=True))
    assert not shares.report(report(0, fetched=16, full=True)).more  # no caller waits
    rank1 = report(1, fetched=3, exhausted=True, wants=True, first=False)
    assert shares.report(rank1).allowed == 3  # all it took (floor(19 / 2) would allow 9)
    assert not shares.report(report(0, fetched=16, full=True)).more  # it has 3 to hand out
    shares.report(dataclasses.replace(rank1, yielded=3))  # handed out, its caller waits
    assert shares.report(report(0, fetched=16, full=True)).more


def test_a_restarted_dispatcher_rebuilds_the_shares_from_the_readers_counts():
    shares = EqualShares()  # a restarted dispatcher knows nothing
    answer = shares.report(report(0, first=False, reader=1, fetched=10, allowed=4, wants=True,
                                  yielded=4))
    assert answer.allowed == 5  # rank 1 not back yet: floor(10 / 2)
    shares.report(report(1, first=False, reader=2, fetched=6, allowed=4))
    assert shares.report(report(0, first=False, reader=1, fetched=10, allowed=5, wants=True,
                                yielded=5)).allowed == 8  # floor(16 / 2)
    with pytest.raises(FailedPreconditionError, match="settled.*restarted"):
        EqualShares().report(report(0, first=False, settled=True))


def test_a_slot_read_again_by_another_reader_is_refused_naming_set_epoch():
    shares = EqualShares()
    shares.report(report(0, reader=1, fetched=3))
    with pytest.raises(FailedPreconditionError, match="rank 0's loader worker 0 came to read "
                       ".* again, which is still being read.*set_epoch"):
        shares.report(report(0, reader=2))
    for rank, reader in ((0, 1), (1, 3)):
        shares.report(report(rank, reader=reader, fetched=3 * (1 - rank), exhausted=True,
                             first=False))
    for rank, reader in ((0, 1), (1, 3)):
        shares.report(report(rank, reader=reader, fetched=3 * (1 - rank), first=False,
                             yielded=1, received=1 - rank, done=True, settled=True,
                             given=(b"x",) if rank == 0 else ()))
    with pytest.raises(FailedPreconditionError, match="read to its end.*set_epoch"):
        shares.report(report(1, reader=4))  # the iteration is over: a second pass of it


def test_resumed_readers_start_the_shares_afresh_from_their_saved_counts():
    shares = EqualShares()
    shares.report(report(0, reader=1, fetched=20))
    shares.report(report(1, reader=2, fetched=2))
    assert shares.report(report(0, reader=1, fetched=20, wants=True)).allowed == 11
    # both ranks restart from states saved earlier: rank 0 had taken 8, handed out 3
    answer = shares.report(report(0, reader=5, generation=1, fetched=8, yielded=3, allowed=3,
                                  wants=True))
    assert (answer.allowed, answer.ready) == (3, False)  # nothing before rank 1 is back
    with pytest.raises(FailedPreconditionError, match="resumed from saved states"):
        shares.report(report(1, reader=2, fetched=2, first=False))  # the old reader
    shares.report(report(1, reader=6, generation=1, fetched=2))
    assert shares.report(report(0, reader=5, generation=1, fetched=8, yielded=4,
                                wants=True)).allowed == 5
    # resumed again from the same states (the first resume died): afresh again
    answer = shares.report(report(1, reader=7, generation=1, fetched=2, yielded=1, allowed=1,
                                  wants=True))
    assert (answer.allowed, answer.ready) == (1, False)  # rank 0 not back
    with pytest.raises(FailedPreconditionError, match="resumed from saved states"):
        shares.report(report(0, reader=5, generation=1, fetched=8, first=False))


def test_padding_fewer_elements_than_ranks_repeats_the_first():
    shares = EqualShares()
    for rank, fetched in ((0, 1), (1, 0), (2, 0)):
        shares.report(report(rank, world_size=3, pad=True, fetched=fetched, exhausted=True,
                             wants=True))
    answers = [shares.report(report(rank, world_size=3, pad=True, first=False))
               for rank in range(3)]
    assert [(a.allowed, a.pad, a.receive) for a in answers] == [(1, 2, 0), (0, 0, 1),
                                                                (0, 0, 1)]


def test_a_resume_takes_over_from_readers_of_the_same_state_that_read_on_to_the_end():
    """A loader resumed from a state and dropped (its workers read on ahead, and may reach
    the end, before their processes stop) leaves the pass to the next resume from that state."""
    shares = EqualShares()
    for worker, reader in ((0, 1), (1, 2)):  # the saved pass
        shares.report(report(0, world_size=1, workers=2, worker=worker, reader=reader,
                             fetched=5, yielded=2, allowed=2))

    def resumed(worker: int, reader: int, **fields: Any) -> ShareReport:
        return report(0, world_size=1, workers=2, worker=worker, reader=reader, generation=1,
                      **fields)

    for worker, reader in ((0, 3), (1, 4)):  # the first resume reads on to the end
        shares.report(resumed(worker, reader, fetched=5, yielded=2, allowed=2))
        shares.report(resumed(worker, reader, fetched=50, yielded=2, exhausted=True,
                              first=False))
    shares.report(resumed(1, 4, fetched=50, yielded=2, exhausted=True, done=True,
                          first=False))  # (and says so; worker 0 has not yet)
    # resumed again from the saved state: its readers take the pass over ...
    shares.report(resumed(0, 5, fetched=5, yielded=2, allowed=2, wants=True))
    with pytest.raises(FailedPreconditionError, match="worker 0 came to read .* again"):
        shares.report(resumed(0, 3, fetched=50, exhausted=True, done=True, first=False))
    shares.report(resumed(1, 6, fetched=5, yielded=2, allowed=2))
    answer = shares.report(resumed(0, 5, fetched=5, yielded=2, wants=True, first=False))
    assert answer.allowed == 5  # its 3 held of the 10 taken
    # ... and read it to its end between them alone
    for worker, reader in ((0, 5), (1, 6)):
        shares.report(resumed(worker, reader, fetched=50, yielded=2, exhausted=True,
                              first=False))
    assert shares.report(resumed(0, 5, fetched=50, yielded=5, exhausted=True, wants=True,
                                 first=False)).allowed == 50  # its own 50 of the 100
    for worker, reader in ((0, 5), (1, 6)):
        shares.report(resumed(worker, reader, fetched=50, yielded=50, exhausted=True,
                              done=True, first=False))
    # the pass is over, whatever the first resume did: a resume from the state still may be
    assert shares.report(resumed(0, 7, fetched=5, yielded=2, allowed=2, wants=True)).allowed == 2
    shares.report(resumed(1, 8, fetched=5, yielded=2, allowed=2))
    assert shares.report(resumed(0, 7, fetched=5, yielded=2, wants=True,
                                 first=False)).allowed == 5


def test_readers_have_ids_of_their_own_whatever_the_state_of_random():
    """torch seeds ``random`` in a loader worker from the loader's base seed, which
    torchdata's StatefulDataLoader restores from a saved state: the workers of two loaders
    resumed from one state must still be told apart by the dispatcher."""
    def reader() -> int:
        random.seed(7)
        return Share("job 'j', repetition 0", 0, 1, 1, 2, True, 10.0).request.reader

    assert reader() != reader()


def test_readers_resumed_from_before_and_after_the_settlement_share_afresh():
    """Rank 0's reader was saved after the settlement: it hands out 5 in all (the share),
    having received b"c" from rank 1's and handed b"x" over to rank 1's other reader; rank
    1's readers were saved before it. The elements rank 1's readers hold or take again are
    asked about: b"c" is discarded once (rank 0 has it), b"x" is handed over again."""
    shares = EqualShares()

    def rank1(worker: int, **fields: Any) -> ShareReport:
        return report(1, workers=2, worker=worker, reader=10 + worker, generation=1, **fields)

    frozen = report(0, reader=1, generation=1, frozen=True, exhausted=True, fetched=5,
                    allowed=5, yielded=5, total=5, share=5, claims=(digest(b"c"),),
                    gifts=(b"x",))
    answer = shares.report(rank1(0, fetched=1, yielded=1, allowed=1, wants=True))
    assert (answer.ready, answer.allowed) == (False, 1)  # not before every reader came
    shares.report(frozen)
    shares.report(rank1(1, discarded=()))
    answer = shares.report(rank1(0, fetched=1, yielded=1, wants=True, first=False))
    assert (answer.ready, answer.claims, answer.share) == (True, (digest(b"c"),), 5)
    # both hold an element b"c": the first to ask discards it, the other keeps its own
    assert shares.report(rank1(1, candidates=(digest(b"c"),), first=False)).discard == (True,)
    assert shares.report(rank1(0, fetched=2, candidates=(digest(b"c"),),
                               first=False)).discard == (False,)
    # rank 1 may hand out 4 more of the 5 (its reader 0 had handed out 1): 3 of its own
    assert shares.report(rank1(0, fetched=2, yielded=1, wants=True, first=False)).allowed == 2
    shares.report(rank1(1, fetched=2, exhausted=True, first=False))
    answer = shares.report(rank1(0, fetched=2, yielded=2, exhausted=True, wants=True,
                                 first=False))
    assert answer.settled and answer.allowed + answer.receive == 3
    other = shares.report(rank1(1, fetched=2, exhausted=True, first=False))
    assert other.allowed + other.receive == 2 and answer.give == other.give == 0
    assert sorted(answer.elements + other.elements) == [b"x"]  # handed over again
    assert shares.report(frozen).allowed == 5


def test_a_frozen_reader_names_a_share_of_another_epoch():
    shares = EqualShares()
    base = dict(generation=1, frozen=True, exhausted=True, first=True)
    shares.report(report(0, reader=1, share=5, total=5, **base))
    with pytest.raises(InvalidArgumentError, match="disagree on the ranks' share"):
        shares.report(report(1, reader=2, share=6, total=6, **base))


def test_a_claimed_element_found_nowhere_fails_the_settlement_naming_the_cause():
    """The pipeline after distribute made other elements when resumed: not once each."""
    shares = EqualShares()
    shares.report(report(0, reader=1, generation=1, frozen=True, exhausted=True, fetched=1,
                         allowed=1, total=1, share=1, claims=(digest(b"c"),)))
    shares.report(report(1, reader=2, generation=1, fetched=1, exhausted=True))
    with pytest.raises(FailedPreconditionError, match="1 elements .* not found again"):
        shares.report(report(1, reader=2, generation=1, fetched=1, exhausted=True, wants=True,
                             yielded=1, first=False))
