"""The worker's side of scheduled calls, against a real ``convoy server`` worker: a Run's calls
run at once, a failing call cancels the others of its Run, ``Cancel`` stops a call at its
next variable operation (or before it starts), and one-at-a-time Runs wait for each other (and
are withdrawn while they wait).
"""

from __future__ import annotations

import random
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

from convoy._transport import rpc as _rpc
from convoy._transport.rpc import Outcome
from convoy.distribute._coordinator_calls import call_message
from convoy.distribute._operations import Read, ScatterAdd
from convoy.distribute._wire import (
    WORKER_METHODS,
    WORKER_SERVICE,
    WithdrawnError,
    decode_one,
    encode,
    load_outcomes,
    run_request,
)
from convoy.errors import CancelledError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, WIDTH = 64, 4  # the shape of the ``table`` fixture's variable


def no_op():
    return "ran"


@pytest.mark.timeout(60)
def test_a_run_request_runs_its_calls_at_once(ps_and_worker):
    """Calls that share a Run wait for one another: they must run concurrently."""
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)

    def meet(barrier_key):
        import threading as _threading

        from convoy.distribute._worker_context import worker_context

        barrier = worker_context().resources.setdefault(barrier_key, _threading.Barrier(3))
        barrier.wait(timeout=10)  # breaks (an error) unless all three run at once
        return "met"

    key = f"barrier-{random.randrange(2**32)}"
    calls = [call_message(meet, (key,), {}) for _ in range(3)]
    outcomes = load_outcomes(client.stream("Run").call(run_request(calls)))
    assert outcomes == [Outcome("met")] * 3
    client.close()


def beat_until_cancelled(address, name):
    """A scheduled function that adds 1 to a variable's first row every 20 ms, for up to a
    minute."""
    from convoy.distribute._store_clients import remote_store as store_at

    store = store_at(address, 0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        store.execute([ScatterAdd(name, np.array([0]), np.ones((1, WIDTH)))])
        time.sleep(0.02)
    return "not cancelled"


def fail_after(seconds):
    time.sleep(seconds)
    raise ValueError("boom")


@pytest.mark.timeout(60)
def test_cancel_stops_a_call_at_its_next_variable_operation(ps_and_worker, table):
    store, name = table
    ps = ps_and_worker.cluster["ps"][0]
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    call_id = random.randrange(2**60)
    answer = {}
    running = threading.Thread(target=lambda: answer.update(outcomes=load_outcomes(
        client.stream("Run").call(run_request([
            call_message(beat_until_cancelled, (ps, name), {}, call_id)])))))
    running.start()
    deadline = time.monotonic() + 30
    while store.execute([Read(name)])[0][0, 0] == 0:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    started = time.monotonic()
    assert decode_one(client.call("Cancel", encode([call_id, call_id + 1]))) == 1
    running.join(timeout=10)
    assert time.monotonic() - started < 5
    [outcome] = answer["outcomes"]
    assert isinstance(outcome.error, CancelledError)
    # one cancelled before it starts never runs
    client.call("Cancel", encode([call_id + 2]))
    [outcome] = load_outcomes(client.stream("Run").call(run_request([
        call_message(no_op, (), {}, call_id + 2)])))
    assert isinstance(outcome.error, CancelledError) and "before it started" in str(outcome.error)
    # uncancellable calls and others run as before
    assert load_outcomes(client.stream("Run").call(run_request([
        call_message(no_op, (), {}), call_message(no_op, (), {}, call_id)]))) == [
        Outcome("ran")] * 2
    client.close()


@pytest.mark.timeout(60)
def test_a_failing_call_cancels_the_other_calls_of_its_run(ps_and_worker, table):
    _, name = table
    ps = ps_and_worker.cluster["ps"][0]
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    started = time.monotonic()
    outcomes = load_outcomes(client.stream("Run").call(run_request([
        call_message(beat_until_cancelled, (ps, name), {}, 1),
        call_message(fail_after, (0.3,), {}, 2),
        call_message(beat_until_cancelled, (ps, name), {}, 3)])))
    assert time.monotonic() - started < 10
    assert [type(outcome.error) for outcome in outcomes] == [
        CancelledError, ValueError, CancelledError]
    client.close()


def record_finish(key, fail):
    """A scheduled function that registers on_finish callbacks (one of them raising) and
    records, in its worker's context, what ran in which thread."""
    import threading as _threading

    from convoy.distribute._worker_calls import current_call
    from convoy.distribute._worker_context import worker_context

    record = worker_context().resources.setdefault(key, [])
    call = current_call()
    call.on_finish(lambda: record.append(("first", _threading.get_ident())))
    call.on_finish(lambda: 1 / 0)  # logged: neither the outcome nor the others change
    call.on_finish(lambda: record.append(("second", _threading.get_ident())))
    record.append(("body", _threading.get_ident()))
    if fail:
        raise ValueError("boom")
    return "ran"


def take_record(key):
    from convoy.distribute._worker_context import worker_context

    return worker_context().resources.pop(key)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", [False, True])
def test_on_finish_callbacks_run_in_order_in_the_call_s_thread_when_it_ends(
        ps_and_worker, fail):
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    key = f"finish-{random.randrange(2**32)}"

    def run(function, *args):
        [outcome] = load_outcomes(client.stream("Run").call(run_request([
            call_message(function, args, {})])))
        return outcome

    outcome = run(record_finish, key, fail)
    if fail:
        assert isinstance(outcome.error, ValueError) and "boom" in str(outcome.error)
    else:
        assert outcome == Outcome("ran")
    record = run(take_record, key).unwrap()
    assert [what for what, _ in record] == ["body", "first", "second"]
    assert len({thread for _, thread in record}) == 1
    client.close()


# ----- one-at-a-time Runs (pipelining 1: the next Run is sent while one runs) -------------------
def spans(seconds):
    """A scheduled function that sleeps: when it started and ended (this host's clock)."""
    began = time.monotonic()
    time.sleep(seconds)
    return began, time.monotonic()


class Answers:
    """Runs sent from threads of their own, their outcomes kept by name."""

    def __init__(self, client):
        self.client, self.outcomes, self.threads = client, {}, {}

    def send(self, name, calls, one_at_a_time=True):
        def run():
            self.outcomes[name] = load_outcomes(self.client.stream("Run").call(
                run_request(calls, one_at_a_time)))

        thread = self.threads[name] = threading.Thread(target=run, name=f"run-{name}")
        thread.start()

    def wait(self, name, timeout_s=20):
        self.threads[name].join(timeout=timeout_s)
        assert not self.threads[name].is_alive(), f"timed out waiting for Run {name}'s answer"
        return self.outcomes[name]


@pytest.mark.timeout(60)
def test_one_at_a_time_runs_start_once_the_one_running_has_ended(ps_and_worker):
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    answers = Answers(client)
    base = random.randrange(2**60)
    for i in range(3):
        answers.send(i, [call_message(spans, (0.3,), {}, base + i)])
    ran = sorted(answers.wait(i)[0].value for i in range(3))
    for (_, ended), (began, _) in zip(ran, ran[1:]):
        assert began >= ended
    # a Run that is not one at a time does not wait for them
    answers.send("first", [call_message(spans, (1.0,), {}, base + 3)])
    time.sleep(0.2)
    answers.send("free", [call_message(no_op, (), {})], one_at_a_time=False)
    assert answers.wait("free", 0.7) == [Outcome("ran")]
    answers.wait("first")
    client.close()


@pytest.mark.timeout(60)
def test_a_waiting_run_is_withdrawn_and_a_cancelled_one_gives_the_turn_up(ps_and_worker, table):
    _, name = table
    ps = ps_and_worker.cluster["ps"][0]
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    answers = Answers(client)
    base = random.randrange(2**60)
    answers.send("beating", [call_message(beat_until_cancelled, (ps, name), {}, base)])
    time.sleep(0.3)
    answers.send("waiting", [call_message(no_op, (), {}, base + 1)])
    time.sleep(0.3)
    assert "waiting" not in answers.outcomes  # behind the beating one
    assert decode_one(client.call("Withdraw", encode([base + 1]))) == 1
    [withdrawn] = answers.wait("waiting", 5)
    assert type(withdrawn.error) is WithdrawnError
    # one withdrawn before it arrives never runs; one running is not withdrawn
    assert decode_one(client.call("Withdraw", encode([base + 2, base]))) == 0
    answers.send("late", [call_message(no_op, (), {}, base + 2)])
    assert type(answers.wait("late", 5)[0].error) is WithdrawnError
    # cancelled, the beating one stops, and the next starts at once
    answers.send("next", [call_message(no_op, (), {}, base + 3)])
    client.call("Cancel", encode([base]))
    assert isinstance(answers.wait("beating", 10)[0].error, CancelledError)
    assert answers.wait("next", 10) == [Outcome("ran")]
    # one that never looks at its cancellation gives the turn up all the same
    answers.send("deaf", [call_message(spans, (5.0,), {}, base + 4)])
    time.sleep(0.3)
    answers.send("after", [call_message(no_op, (), {}, base + 5)])
    client.call("Cancel", encode([base + 4]))
    assert answers.wait("after", 3) == [Outcome("ran")]
    answers.wait("deaf")
    client.close()



def update_after(seconds, address, name):
    """A scheduled function that sleeps, then queues an update of a variable's first row."""
    from convoy.distribute._store_clients import remote_store as store_at
    from convoy.distribute._store_clients import send_updates

    time.sleep(seconds)
    send_updates([(store_at(address, 0), [ScatterAdd(name, np.array([0]), np.ones((1, WIDTH)))])])


def read_after(seconds, address, name):
    """A scheduled function that sleeps, then reads a variable's first row: when it began and
    when it read (this host's clock), and the row."""
    from convoy.distribute._store_clients import remote_store as store_at

    began = time.monotonic()
    time.sleep(seconds)
    read_at = time.monotonic()
    return began, read_at, store_at(address, 0).execute([Read(name)])[0][0].tolist()


def set_carry_s(seconds):
    """A scheduled function that sets how long the worker's queued updates wait to be carried;
    the value it had."""
    from convoy.distribute import _outbox

    before, _outbox.CARRY_S = _outbox.CARRY_S, seconds
    return before


@pytest.mark.timeout(60)
def test_the_next_one_at_a_time_run_starts_when_a_function_returns_and_carries_its_updates(
        ps_and_worker, table):
    """At pipelining=1 the next Run starts as soon as the running function has returned, before
    its updates land: its first operation on the ps carries them, so it reads them applied,
    and the first Run answers once they have landed. Updates that nothing carries within
    CARRY_S leave on their own."""
    _, name = table
    ps = ps_and_worker.cluster["ps"][0]
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    base = random.randrange(2**60)

    def rounds(carried, expected_row):
        answers = Answers(client)
        answers.send("update", [call_message(update_after, (0.2, ps, name), {}, base)])
        time.sleep(0.1)  # the read waits for the turn
        answers.send("read", [call_message(read_after, (0.5, ps, name), {}, base + 1)])
        [updated] = answers.wait("update")
        answered = time.monotonic()
        assert updated.ok
        began, read_at, row = answers.wait("read")[0].unwrap()
        assert row == [expected_row] * WIDTH  # its update, and every one before
        assert began < answered  # it started before the first had answered
        assert (read_at < answered) == carried

    def run(function, *args):
        [outcome] = load_outcomes(client.stream("Run").call(run_request(
            [call_message(function, args, {})])))
        return outcome.unwrap()

    default = run(set_carry_s, 30.0)
    try:
        rounds(carried=True, expected_row=1.0)
        base += 2
    finally:
        run(set_carry_s, default)
    rounds(carried=False, expected_row=2.0)
    client.close()
