"""The training cluster's messages: each layout is checked where it is read, and malformed or
hostile requests to a real ``convoy server`` ps or worker are refused with a status while the
server keeps serving and loses nothing.
"""

from __future__ import annotations

import random
import sys

import cloudpickle
import numpy as np
import pytest

from convoy._transport import rpc as _rpc
from convoy._transport.rpc import Outcome
from convoy.codec import Encoder
from convoy.distribute import _wire
from convoy.distribute._coordinator_calls import call_message
from convoy.distribute._operations import (
    Apply,
    Assign,
    Create,
    Gather,
    Read,
    ScatterAdd,
    ScatterUpdate,
    SetSlot,
)
from convoy.distribute._wire import (
    PS_METHODS,
    PS_SERVICE,
    WORKER_METHODS,
    WORKER_SERVICE,
    decode_one,
    encode,
    load_outcomes,
    run_request,
)
from convoy.errors import (
    CancelledError,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    UnknownError,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, WIDTH = 64, 4  # the shape of the ``table`` fixture's variable


def request(*operation_lists):
    return encode(list(operation_lists))


class _WrongArity:
    """Unpickles as a Read of two fields (a read takes one)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __reduce__(self):
        return (Read, (self.key, "extra"))


def hostile_payloads(seed: int, x: str) -> list[bytes]:
    """Requests that must be refused; ``x`` names a variable that exists."""
    rng = random.Random(seed)
    valid = request([Read(x)])
    payloads = [b"", b"\x00", rng.randbytes(7), rng.randbytes(4096), valid[:-1], valid + b"\x00",
                encode(5), encode(None), encode([5]), request([5]), request(["read"]),
                request([("read", x)]), request([("read",)]), request([Create(7, None)]),
                request([Read(None)]), request([_WrongArity(x)]),
                request([Gather(x, np.zeros((2, 2), np.float32))]),
                request([Apply(None, [])]), request([Apply({}, 5)]),
                request([Apply({"name": "SGD"}, [(x, None)])]),
                request([Apply({"name": "SGD", "learning_rate": 1.0}, [(x, None)])]),
                request([Apply({"name": "Adam", "learning_rate": 1.0}, [(x, np.ones(3))])]),
                request([ScatterUpdate(x, np.array([0]), np.array(["a"]))]),
                request([Assign(x, "text")]), request([Gather(x, [[[]]])]),
                request([SetSlot(x, "m", None)]), Encoder(None).encode([1, 2])]
    for _ in range(30):
        flipped = bytearray(valid)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        payloads.append(bytes(flipped))
    return payloads


def fuzz_seed() -> int:
    seed = random.randrange(2**32)
    print(f"seed: {seed}")
    return seed


@pytest.mark.timeout(120)
def test_ps_refuses_hostile_requests_and_loses_nothing(ps_and_worker, table):
    store, name = table
    store.execute([ScatterAdd(name, np.array([3]), np.full((1, WIDTH), 2.0))])
    before = store.execute([Read(name)])[0]
    client = _rpc.Client(ps_and_worker.cluster["ps"][0], PS_SERVICE, PS_METHODS)
    stream = client.stream("Execute")
    refused = answered = 0
    for payload in hostile_payloads(fuzz_seed(), name):
        try:
            outcomes = decode_one(stream.call(payload))
        except (InvalidArgumentError, DataLossError):
            refused += 1  # refused as a whole, with a status that says why; the stream is
            continue      # reopened by the next call
        answered += 1
        for outcome in outcomes:  # or each operation list refused on its own
            assert isinstance(outcome.error, InvalidArgumentError | NotFoundError
                              | DataLossError), outcome
    assert refused > 10 and answered > 10  # both kinds of refusal were exercised
    assert decode_one(stream.call(request([Read(name)])))[0].ok
    client.close()
    np.testing.assert_array_equal(store.execute([Read(name)])[0], before)


def no_op():
    return "ran"


@pytest.mark.timeout(120)
def test_worker_refuses_hostile_requests_and_keeps_serving(ps_and_worker):
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    run = client.stream("Run")
    rng = random.Random(fuzz_seed())
    good = run_request([call_message(no_op, (), {})])
    for payload in [b"", rng.randbytes(64), good[:-3], encode([]), encode("calls"), encode(5)]:
        with pytest.raises((InvalidArgumentError, DataLossError)):
            run.call(payload)
    bad_calls = [(b"a", b"b"), (b"digest", b"not a pickle", b"nor this"), ("a", "b", "c"), 7]
    outcomes = load_outcomes(run.call(encode([*bad_calls, call_message(no_op, (), {})])))
    assert [outcome.ok for outcome in outcomes[:-1]] == [False] * len(bad_calls)
    assert all(isinstance(outcome.error, InvalidArgumentError | UnknownError | Exception)
               for outcome in outcomes[:-1])
    # a failing call cancels the others of its Run: the good one ran, or never started
    assert outcomes[-1] == Outcome("ran") or isinstance(outcomes[-1].error, CancelledError)
    assert load_outcomes(run.call(good)) == [Outcome("ran")]
    client.close()


class Unpicklable:
    def __reduce__(self):
        raise TypeError("not today")


def test_a_run_request_and_its_answer_round_trip():
    call = call_message(no_op, (1,), {"k": 2}, 7)
    assert _wire.is_call(call) and call[3] == 7
    assert _wire.load_run_request(run_request([call])) == ([call], False, None, False)
    assert _wire.load_run_request(run_request([call], one_at_a_time=True)) == \
        ([call], True, None, False)
    assert _wire.load_run_request(run_request([call], True, "abc")) == ([call], True, "abc", False)
    assert _wire.load_run_request(run_request([call], False, "abc")) == \
        ([call], False, "abc", False)
    assert _wire.load_run_request(run_request([call], followed=True)) == \
        ([call], False, None, True)
    answer = _wire.run_answer([_wire.pickle_outcome(Outcome("ran")),
                               _wire.pickle_outcome(Outcome(error=ValueError("boom")))])
    ran, failed = load_outcomes(answer)
    assert ran == Outcome("ran") and isinstance(failed.error, ValueError)


@pytest.mark.parametrize("value", [None, True, 7, 2.5, "text", b"bytes", [1, (2, "x")],
                                   np.arange(3)], ids=repr)
def test_every_result_comes_back_as_it_was(value):
    # plain values take plain pickle, the rest cloudpickle: the same outcome either way
    [outcome] = load_outcomes(_wire.run_answer([_wire.pickle_outcome(Outcome(value))]))
    assert outcome.error is None and type(outcome.value) is type(value)
    np.testing.assert_equal(outcome.value, value)


def test_an_outcome_that_does_not_pickle_comes_back_as_an_unknown_error():
    [outcome] = load_outcomes(_wire.run_answer([_wire.pickle_outcome(Outcome(Unpicklable()))]))
    assert isinstance(outcome.error, UnknownError)
    assert "Unpicklable from a scheduled function could not be sent back" in str(outcome.error)


@pytest.mark.parametrize("call", [(b"a", b"b", b"c"), (b"a", b"b", b"c", 1.5),
                                  ("a", b"b", b"c", None), [b"a", b"b", b"c", None]])
def test_a_call_of_another_layout_is_not_a_call(call):
    assert not _wire.is_call(call)


def test_requests_of_the_wrong_layout_are_refused_naming_the_method():
    with pytest.raises(InvalidArgumentError, match="Run takes a non-empty list of calls"):
        _wire.load_run_request(encode([]))
    with pytest.raises(InvalidArgumentError, match="Execute takes a list of operation lists"):
        _wire.load_operation_lists(encode(Read("x")))
    with pytest.raises(InvalidArgumentError, match="Free takes a list of resource ids"):
        _wire.load_ids(encode([1, "2"]), "Free", "resource")
    assert _wire.load_ids(encode([1, 2]), "Cancel", "call") == [1, 2]
    with pytest.raises(DataLossError, match="one element"):
        decode_one(Encoder(None).encode([1, 2]))


def test_an_execute_answer_must_hold_one_outcome_per_list():
    good = encode([Outcome([1]), Outcome(error=NotFoundError("x"))])
    assert len(_wire.load_execute_answer(good, 2, "ps:1")) == 2
    for answer in (good, encode([Outcome(), "not an outcome"]), encode(None)):
        with pytest.raises(DataLossError, match="Execute at ps:1: 3 operation lists"):
            _wire.load_execute_answer(answer, 3, "ps:1")
