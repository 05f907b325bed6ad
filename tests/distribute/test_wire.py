"""The parameter-server and worker RPCs on real ``convoy server`` processes: operation lists
from many threads share calls yet each gets its own results or error, and malformed or hostile
requests are refused with a status while the servers keep serving and lose nothing.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

import cloudpickle
import grpc
import numpy as np
import pytest

from convoy import _rpc
from convoy._rpc import Outcome
from convoy.codec import Encoder
from convoy.distribute._coordinator_calls import call_message
from convoy.distribute._store_clients import remote_store
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
    UnavailableError,
    UnknownError,
)
from convoy.testing import TrainingCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, WIDTH = 64, 4


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=1, num_ps=1) as training_cluster:
        yield training_cluster


@pytest.fixture
def table(cluster, request):
    """A fresh (ROWS, WIDTH) float64 variable of zeros on the ps: (store, name)."""
    store = remote_store(cluster.cluster["ps"][0], 0)
    name = f"{request.node.name}-{random.randrange(2**32)}"
    store.execute([("create", name, np.zeros((ROWS, WIDTH)))])
    return store, name


def counting_calls(store):
    """Wrap the store's Execute stream so the number of messages sent can be read."""
    counted = {"calls": 0}
    call = store._stream.call

    def counting(*args, **kwargs):
        counted["calls"] += 1
        return call(*args, **kwargs)

    store._stream.call = counting
    return counted, lambda: delattr(store._stream, "call")


@pytest.mark.timeout(60)
def test_operation_lists_from_many_threads_each_get_their_results(table):
    store, name = table
    threads, per_thread = 8, 40
    failures = []

    def work(thread):
        try:
            for i in range(per_thread):
                row = (thread * per_thread + i) % ROWS
                gathered, _ = store.execute([
                    ("gather", name, np.array([row])),
                    ("scatter_add", name, np.array([row]), np.ones((1, WIDTH))),
                ])
                assert gathered.shape == (1, WIDTH)
        except Exception as error:  # reported below, not lost in the thread
            failures.append(error)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures
    expected = np.bincount(np.arange(threads * per_thread) % ROWS, minlength=ROWS)
    np.testing.assert_array_equal(store.execute([("read", name)])[0],
                                  np.repeat(expected[:, None], WIDTH, axis=1))


@pytest.mark.timeout(60)
def test_queued_operation_lists_share_calls(table):
    store, name = table
    counted, restore = counting_calls(store)
    try:
        futures = [store.execute_async([("scatter_add", name, np.array([i % ROWS]),
                                         np.ones((1, WIDTH)))]) for i in range(200)]
        assert [f.result(timeout=30) for f in futures] == [[None]] * 200
    finally:
        restore()
    assert 0 < counted["calls"] < 100, "queued operation lists were not sent together"
    assert store.execute([("read", name)])[0].sum() == 200 * WIDTH


@pytest.mark.timeout(60)
def test_a_failing_operation_list_fails_only_its_caller(table):
    store, name = table
    one = np.ones((1, WIDTH))
    futures = [
        store.execute_async([("scatter_add", name, np.array([0]), one)]),
        store.execute_async([("scatter_add", "no-such-variable", np.array([0]), one)]),
        store.execute_async([("scatter_add", name, np.array([ROWS]), one)]),
        store.execute_async([("gather", name, lambda: 0)]),  # does not pickle
        store.execute_async([("frobnicate", name)]),
        store.execute_async([("scatter_add", name, np.array([1]), one)]),
    ]
    assert futures[0].result(timeout=30) == [None]
    with pytest.raises(NotFoundError, match="no-such-variable"):
        futures[1].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match=rf"\[0, {ROWS}\)"):
        futures[2].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match="cannot be sent to its parameter server"):
        futures[3].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match="unknown variable operation 'frobnicate'"):
        futures[4].result(timeout=30)
    assert futures[5].result(timeout=30) == [None]
    value = store.execute([("read", name)])[0]
    assert value[:2].tolist() == [[1.0] * WIDTH] * 2 and value[2:].sum() == 0


def request(*operation_lists):
    return encode(list(operation_lists))


def hostile_payloads(seed: int, x: str) -> list[bytes]:
    """Requests that must be refused; ``x`` names a variable that exists."""
    rng = random.Random(seed)
    valid = request([("read", x)])
    payloads = [b"", b"\x00", rng.randbytes(7), rng.randbytes(4096), valid[:-1], valid + b"\x00",
                encode(5), encode(None), encode([5]), request([5]), request(["read"]),
                request([("read",)]), request([("create", 7, None)]),
                request([("gather", x, np.zeros((2, 2), np.float32))]),
                request([("apply", None, [])]), request([("apply", {}, 5)]),
                request([("apply", {"name": "SGD"}, [(x, None)])]),
                request([("apply", {"name": "SGD", "learning_rate": 1.0}, [(x, None)])]),
                request([("apply", {"name": "Adam", "learning_rate": 1.0}, [(x, np.ones(3))])]),
                request([("scatter_update", x, np.array([0]), np.array(["a"]))]),
                request([("assign", x, "text")]), request([("gather", x, [[[]]])]),
                request([("read", x, "extra")]), request([("set_slot", x, "m", None)]),
                Encoder(None).encode([1, 2])]
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
def test_ps_refuses_hostile_requests_and_loses_nothing(cluster, table):
    store, name = table
    store.execute([("scatter_add", name, np.array([3]), np.full((1, WIDTH), 2.0))])
    before = store.execute([("read", name)])[0]
    client = _rpc.Client(cluster.cluster["ps"][0], PS_SERVICE, PS_METHODS)
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
    assert decode_one(stream.call(request([("read", name)])))[0].ok
    client.close()
    np.testing.assert_array_equal(store.execute([("read", name)])[0], before)


def no_op():
    return "ran"


@pytest.mark.timeout(120)
def test_worker_refuses_hostile_requests_and_keeps_serving(cluster):
    client = _rpc.Client(cluster.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
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


@pytest.mark.timeout(60)
def test_a_run_request_runs_its_calls_at_once(cluster):
    """Calls that share a Run wait for one another: they must run concurrently."""
    client = _rpc.Client(cluster.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)

    def meet(barrier_key):
        import threading as _threading

        from convoy.distribute.server import worker_context

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
        store.execute([("scatter_add", name, np.array([0]), np.ones((1, WIDTH)))])
        time.sleep(0.02)
    return "not cancelled"


def fail_after(seconds):
    time.sleep(seconds)
    raise ValueError("boom")


@pytest.mark.timeout(60)
def test_cancel_stops_a_call_at_its_next_variable_operation(cluster, table):
    store, name = table
    ps = cluster.cluster["ps"][0]
    client = _rpc.Client(cluster.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    call_id = random.randrange(2**60)
    answer = {}
    running = threading.Thread(target=lambda: answer.update(outcomes=load_outcomes(
        client.stream("Run").call(run_request([
            call_message(beat_until_cancelled, (ps, name), {}, call_id)])))))
    running.start()
    deadline = time.monotonic() + 30
    while store.execute([("read", name)])[0][0, 0] == 0:
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
def test_a_failing_call_cancels_the_other_calls_of_its_run(cluster, table):
    _, name = table
    ps = cluster.cluster["ps"][0]
    client = _rpc.Client(cluster.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)
    started = time.monotonic()
    outcomes = load_outcomes(client.stream("Run").call(run_request([
        call_message(beat_until_cancelled, (ps, name), {}, 1),
        call_message(fail_after, (0.3,), {}, 2),
        call_message(beat_until_cancelled, (ps, name), {}, 3)])))
    assert time.monotonic() - started < 10
    assert [type(outcome.error) for outcome in outcomes] == [
        CancelledError, ValueError, CancelledError]
    client.close()


@pytest.mark.timeout(60)
def test_free_deletes_resources_and_cancel_and_free_refuse_bad_requests(cluster):
    client = _rpc.Client(cluster.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)

    def hold(resource_id):
        from convoy.distribute.server import worker_context

        worker_context().resources[resource_id] = [resource_id]
        return len(worker_context().resources)

    ids = [random.randrange(2**60) for _ in range(3)]
    held = [outcome.value for outcome in load_outcomes(client.stream("Run").call(
        run_request([call_message(hold, (i,), {}) for i in ids])))]
    remaining = decode_one(client.call("Free", encode([])))
    assert remaining >= 3 and max(held) <= remaining
    assert decode_one(client.call("Free", encode(ids[:2] + [12345]))) == remaining - 2
    assert decode_one(client.call("Free", encode(ids))) == remaining - 3
    for method in ("Cancel", "Free"):
        for payload in [b"", encode(5), encode(["a"]), encode([1.5]), encode(None)]:
            with pytest.raises((InvalidArgumentError, DataLossError)):
                client.call(method, payload)
    client.close()


def test_transport_failures_reach_every_queued_caller():
    store = remote_store(f"localhost:{_unused_port()}", 0)
    futures = [store.execute_async([("read", "x")]) for _ in range(5)]
    for future in futures:
        with pytest.raises(Exception) as raised:
            future.result(timeout=90)
        assert "Execute at" in str(raised.value)


def _unused_port() -> int:
    from convoy.testing import free_port

    return free_port()


del grpc


@pytest.mark.timeout(120)
def test_a_stopped_ps_fails_calls_instead_of_hanging():
    # SIGSTOP: the process is there but never answers. Its stream has no deadline; keepalive
    # pings unanswered for about 2 x KEEPALIVE_MS fail it, and it serves again after SIGCONT.
    with TrainingCluster(num_workers=1, num_ps=1) as stopped_cluster:
        store = remote_store(stopped_cluster.cluster["ps"][0], 0)
        store.execute([("create", "v", np.arange(3.0))])
        pid = stopped_cluster.servers[("ps", 0)].process.pid
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(UnavailableError, match="Execute at"):
                store.execute([("read", "v")])
            assert time.monotonic() - started < 4 * _rpc.KEEPALIVE_MS / 1000
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_array_equal(store.execute([("read", "v")])[0], np.arange(3.0))
