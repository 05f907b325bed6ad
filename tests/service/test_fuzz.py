"""Malformed, truncated and absurd requests to every RPC of real dispatchers and workers.

Each call must end with a gRPC status or a valid response within its deadline; the servers must
keep serving (a DYNAMIC read afterwards sees every element exactly once) and requests the
dispatcher rejects must leave its state as it was.

Random requests come from ``random.Random(seed)``; the seed is printed (pytest shows it on a
failure) and ``CONVOY_FUZZ_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from convoy._transport import rpc as _rpc
from convoy.data import Dataset
from convoy.data.service import distribute, from_dataset_id
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import (
    DISPATCHER,
    DISPATCHER_METHODS,
    ELEMENTS,
    END_OF_SEQUENCE,
    NOT_READY,
    WORKER,
    WORKER_METHODS,
)
from convoy.data.service._distribute import _Registration
from convoy.errors import InvalidArgumentError
from convoy.testing import InProcessCluster, ProcessCluster

CALL_TIMEOUT_S = 5.0
I64 = (-(2**63), 2**63 - 1)

#: What a rejected call may end with. INTERNAL only for bytes that are no message at all
#: (gRPC's "Exception deserializing request!"); UNKNOWN (a handler's unexpected exception)
#: and DEADLINE_EXCEEDED (a hang) are failures.
REJECTIONS = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
}


def fuzz_seed() -> int:
    seed = int(os.environ.get("CONVOY_FUZZ_SEED", random.randrange(2**32)))
    print(f"fuzz seed: {seed} (replay with CONVOY_FUZZ_SEED={seed})")
    return seed


def _identity(data: bytes) -> bytes:
    return data


# ----- raw calls ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    method: str
    payload: bytes
    code: grpc.StatusCode | None  # None: a response
    details: str = ""
    response: bytes = b""

    def __str__(self) -> str:
        result = "OK" if self.code is None else f"{self.code.name}: {self.details[:300]}"
        return f"{self.method}({self.payload[:120]!r}) -> {result}"


@dataclass
class RawClient:
    """Stubs sending raw bytes to every method of a dispatcher and a worker."""

    dispatcher: str
    worker: str
    #: The dispatcher's state, when it runs in this process (ids for requests to aim at).
    state: Callable[[], dict[str, Any]] | None = None
    channels: list[grpc.Channel] = field(default_factory=list)
    stubs: dict[str, tuple[_rpc.Method, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for address, service, methods in ((self.dispatcher, DISPATCHER, DISPATCHER_METHODS),
                                          (self.worker, WORKER, WORKER_METHODS)):
            channel = grpc.insecure_channel(address, options=_rpc.OPTIONS)
            self.channels.append(channel)
            for method in methods:
                self.stubs[method.name] = (method, channel.unary_unary(
                    f"/{service}/{method.name}", request_serializer=_identity,
                    response_deserializer=_identity))

    def call(self, name: str, payload: bytes) -> Outcome:
        method, stub = self.stubs[name]
        try:
            response = stub(payload, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            outcome = Outcome(name, payload, error.code(), error.details() or "")
        else:
            outcome = Outcome(name, payload, None, response=response)
        check(method, outcome)
        return outcome

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def parses(method: _rpc.Method, payload: bytes) -> bool:
    try:
        method.request.FromString(payload)
    except DecodeError:
        return False
    return True


def check(method: _rpc.Method, outcome: Outcome) -> None:
    """A call ended with a valid response or a proper rejection, never a hang or a crash."""
    if outcome.code is None:
        if method.response is None:
            assert outcome.response[:1] in (ELEMENTS, END_OF_SEQUENCE, NOT_READY), outcome
        else:
            method.response.FromString(outcome.response)
        return
    assert outcome.code in REJECTIONS, f"unexpected status: {outcome}"
    if outcome.code is grpc.StatusCode.INTERNAL:
        assert "deserializ" in outcome.details, outcome
        assert not parses(method, outcome.payload), f"a valid message was refused: {outcome}"
    else:
        assert outcome.details, f"a rejection without a message: {outcome}"


# ----- request generators ------------------------------------------------------------------------

NASTY = [
    b"", b"\x00", b"\x08", b"\x0a", b"\x0a\x05ab", b"\xff" * 11, b"\x08" + b"\xff" * 10 + b"\x01",
    b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x0a\x02\xff\xfe", b"\x12\x02\xc3\x28", b"\x07", b"\x0f\x00", b"\x1b\x1c",
    b"\xf8\xff\xff\xff\x0f\x01", b"\x0b" * 64, b"\x1a\x03\x08\x01",
]


@dataclass
class Generator:
    """Random payloads for one method: garbage, truncated and mutated messages, and valid
    messages with absurd values (negative, huge or unknown ids, empty or odd strings)."""

    rng: random.Random
    ints: list[int]
    strings: list[str]

    def value(self, descriptor: FieldDescriptor) -> Any:
        kind = descriptor.type
        if kind == FieldDescriptor.TYPE_STRING:
            return self.rng.choice(self.strings)
        if kind == FieldDescriptor.TYPE_BYTES:
            return self.rng.randbytes(self.rng.choice([0, 1, 8, 100]))
        if kind == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if kind == FieldDescriptor.TYPE_MESSAGE:
            return self.message(descriptor.message_type._concrete_class)
        if kind in (FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_UINT64):
            return self.rng.choice([0, 1, 2**63, 2**64 - 1, self.rng.getrandbits(64)])
        if self.rng.random() < 0.3:
            return self.rng.randint(*I64)
        return self.rng.choice(self.ints)

    def message(self, message_type: Any) -> Any:
        message = message_type()
        for descriptor in message_type.DESCRIPTOR.fields:
            if self.rng.random() < 0.25:
                continue
            if descriptor.is_repeated:
                values = [self.value(descriptor) for _ in range(self.rng.randint(0, 4))]
                if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(message, descriptor.name).extend(values)
                else:
                    getattr(message, descriptor.name)[:] = values
            elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(message, descriptor.name).CopyFrom(self.value(descriptor))
            else:
                setattr(message, descriptor.name, self.value(descriptor))
        return message

    def garbage(self) -> bytes:
        return self.rng.randbytes(self.rng.choice([1, 2, 3, 5, 8, 16, 64, 500]))

    def truncated(self, message_type: Any) -> bytes:
        data = self.message(message_type).SerializeToString()
        return data[:self.rng.randrange(len(data))] if data else self.garbage()

    def mutated(self, message_type: Any) -> bytes:
        data = bytearray(self.message(message_type).SerializeToString() or self.garbage())
        for _ in range(self.rng.randint(1, 4)):
            data[self.rng.randrange(len(data))] = self.rng.randrange(256)
        return bytes(data)

    def payload(self, message_type: Any) -> bytes:
        kind = self.rng.randrange(5)
        if kind == 0:
            return self.garbage()
        if kind == 1:
            return self.rng.choice(NASTY)
        if kind == 2:
            return self.truncated(message_type)
        if kind == 3:
            return self.mutated(message_type)
        return self.message(message_type).SerializeToString()


def absurd_values(snapshot: dict[str, Any]) -> tuple[list[int], list[str]]:
    """Integers and strings to fill fields with: absurd ones and some the dispatcher knows."""
    known_ids = [*snapshot["jobs"], *snapshot["iterations"], *snapshot["tasks"],
                 *snapshot["clients"]]
    ints = [0, 1, -1, -2, 7, 1024, 1025, 2**31, -(2**31), *I64, 10**12, *known_ids]
    strings = ["", " ", "x", "nope", "\x00", "é" * 3, "a" * 5000, "OFF", "DYNAMIC", "FILE",
               "AUTO", "LZ4", "foo", "localhost", "localhost:0", "localhost:99999", ":1",
               "[::1]", "grpc://x:1", "a b:1", "%port%", *snapshot["datasets"]]
    return ints, strings


def registers_a_worker(method: _rpc.Method, payload: bytes) -> bool:
    """Whether ``payload`` is a heartbeat the dispatcher takes from a worker it does not know.

    That is no malformed request but a worker joining (or restarting, at the real worker's
    address). As in TensorFlow, tasks are not taken back from a worker that then goes silent,
    so an impostor would stall every later iteration: the barrage leaves those out.
    """
    if method.name != "WorkerHeartbeat" or not parses(method, payload):
        return False
    request = method.request.FromString(payload)
    try:
        _rpc.check_address(request.worker_address, "worker_address")
    except InvalidArgumentError:
        return False
    return bool(request.worker_uid)


def barrage(raw: RawClient, seed: int, calls: int) -> list[Outcome]:
    """``calls`` random requests spread over every method."""
    rng = random.Random(seed)
    ints, strings = absurd_values(_snapshot(raw))
    generator = Generator(rng, ints, strings)
    names = sorted(raw.stubs)
    outcomes = []
    while len(outcomes) < calls:
        method, _ = raw.stubs[names[len(outcomes) % len(names)]]
        payload = generator.payload(method.request)
        if not registers_a_worker(method, payload):
            outcomes.append(raw.call(method.name, payload))
    return outcomes


def _snapshot(raw: RawClient) -> dict[str, Any]:
    if raw.state is not None:
        return raw.state()
    return {"jobs": {}, "iterations": {}, "tasks": {}, "clients": {}, "datasets": {}}


# ----- clusters and reads ------------------------------------------------------------------------


def state_of(cluster: InProcessCluster) -> dict[str, Any]:
    """The dispatcher's state without the heartbeat clocks (they tick on their own)."""
    handlers = cluster.dispatcher._handlers
    with handlers.lock:
        snapshot = handlers.state.snapshot()
    for name in ("workers", "clients"):
        for record in snapshot[name].values():
            record.pop("last_seen")
    return snapshot


@pytest.fixture
def cluster() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=1, heartbeat_interval_ms=50) as local:
        yield local


@pytest.fixture
def raw(cluster: InProcessCluster) -> Iterator[RawClient]:
    client = RawClient(cluster.address, cluster.workers[0]._address,
                       lambda: state_of(cluster))
    yield client
    client.close()


def read_exactly_once(target: str, n: int = 100) -> None:
    dataset = Dataset.range(n).apply(distribute("distributed_epoch", target))
    counts = collections.Counter(int(x) for x in dataset)
    assert counts == collections.Counter(range(n))


def valid(method: str, **fields: Any) -> bytes:
    request = {m.name: m.request for m in [*DISPATCHER_METHODS, *WORKER_METHODS]}[method]
    return request(**fields).SerializeToString()


def populate(raw: RawClient) -> dict[str, Any]:
    """Datasets, jobs, an iteration and a client made with valid raw calls, so that absurd
    requests meet real ids. Returns the ids."""
    registration = _Registration.of(Dataset.range(50), "AUTO", with_spec=False)
    ok = pb.RegisterDatasetResponse.FromString
    dataset_id = ok(raw.call("RegisterDataset", valid(
        "RegisterDataset", dataset=registration.payload, fingerprint=registration.fingerprint,
        compression="AUTO", cardinality=50, num_split_units=50)).response).dataset_id
    job = pb.GetOrCreateJobResponse.FromString(raw.call("GetOrCreateJob", valid(
        "GetOrCreateJob", dataset_id=dataset_id, job_name="named",
        options=pb.JobOptions(processing_mode="OFF", target_workers="AUTO"))).response)
    iteration = pb.GetOrCreateIterationResponse.FromString(raw.call(
        "GetOrCreateIteration", valid("GetOrCreateIteration", job_id=job.job_id)).response)
    return {"dataset_id": dataset_id, "job_id": job.job_id,
            "iteration_id": iteration.iteration_id, "client_id": iteration.client_id}


# ----- tests -------------------------------------------------------------------------------------


#: Seeds whose barrages once found a bug, replayed every run beside a new random one.
FOUND = {
    "random": None,
    "give_back_of_no_elements_to_a_running_task": 4275526853,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("found", FOUND.values(), ids=FOUND.keys())
def test_every_method_survives_a_random_barrage(cluster: InProcessCluster, raw: RawClient,
                                                found: int | None) -> None:
    seed = fuzz_seed() if found is None else found
    populate(raw)
    outcomes = barrage(raw, seed, calls=600)
    by_method = collections.Counter(o.method for o in outcomes)
    assert set(by_method) == set(raw.stubs), by_method
    print(collections.Counter((o.method, o.code.name if o.code else "OK") for o in outcomes))
    assert all(worker.error is None for worker in cluster.workers)
    read_exactly_once(cluster.target)


def rejected(raw: RawClient, ids: dict[str, Any], seed: int) -> Iterator[tuple[str, bytes]]:
    """Requests the dispatcher must refuse: every method, random ids it does not know, bad
    values, and bytes that are no message."""
    rng = random.Random(seed)
    state = _snapshot(raw)
    known = {*state["jobs"], *state["iterations"], *state["tasks"], *state["clients"]}

    def unknown_id() -> int:
        while True:
            candidate = rng.choice([rng.randint(*I64), rng.randint(-5, 5000), I64[0], I64[1]])
            if candidate not in known:
                return candidate

    def unknown_name() -> str:
        return rng.choice(["", "nope", "\x00", "x" * 300, str(rng.randint(-10**6, 10**6))])

    worker = raw.worker
    for _ in range(20):
        yield "RegisterDataset", valid("RegisterDataset", dataset=rng.randbytes(8))
        yield "RegisterDataset", valid("RegisterDataset", fingerprint="fp")
        yield "RegisterDataset", valid("RegisterDataset", dataset=b"d", fingerprint="other",
                                       dataset_id=ids["dataset_id"])
        yield "RegisterDataset", valid("RegisterDataset", dataset=b"d", fingerprint="f",
                                       compression=rng.choice(["foo", "SNAPPY", "auto "]))
        yield "GetDatasetInfo", valid("GetDatasetInfo", dataset_id=unknown_name())
        yield "GetOrCreateJob", valid("GetOrCreateJob", dataset_id=unknown_name(),
                                      options=pb.JobOptions(processing_mode="OFF"))
        yield "GetOrCreateJob", valid("GetOrCreateJob", dataset_id=ids["dataset_id"],
                                      options=pb.JobOptions(processing_mode=rng.choice(
                                          ["", "off", "BOGUS", "DYNAMIC "])))
        yield "GetOrCreateJob", valid("GetOrCreateJob", dataset_id=ids["dataset_id"],
                                      job_name="named",
                                      options=pb.JobOptions(processing_mode="DYNAMIC"))
        yield "GetOrCreateJob", valid("GetOrCreateJob", dataset_id=ids["dataset_id"],
                                      options=pb.JobOptions(processing_mode="OFF",
                                                            num_consumers=-rng.randint(1, 9)))
        yield "GetOrCreateJob", valid("GetOrCreateJob", dataset_id=ids["dataset_id"],
                                      options=pb.JobOptions(processing_mode="OFF",
                                                            target_workers="nope"))
        yield "GetOrCreateIteration", valid("GetOrCreateIteration", job_id=unknown_id())
        yield "GetOrCreateIteration", valid("GetOrCreateIteration", job_id=ids["job_id"],
                                            repetition=-rng.randint(1, 2**62))
        yield "ClientHeartbeat", valid("ClientHeartbeat", client_id=unknown_id())
        yield "WorkerHeartbeat", valid("WorkerHeartbeat", worker_uid="u",
                                       worker_address=rng.choice(
                                           ["", "localhost", "localhost:0", "localhost:99999",
                                            "a b:1", "grpc://localhost:1"]))
        yield "WorkerHeartbeat", valid("WorkerHeartbeat", worker_address=worker,
                                       current_tasks=[unknown_id()])
        yield "WorkerHeartbeat", valid("WorkerHeartbeat", worker_address=worker,
                                       finished_tasks=[rng.choice(sorted(state["tasks"]))])
        asker = {"task_id": rng.choice(sorted(state["tasks"])), "worker_uid": "u",
                 "request_number": 1}
        yield "GetSplits", valid("GetSplits", iteration_id=unknown_id(), max_splits=1, **asker)
        yield "GetSplits", valid("GetSplits", iteration_id=ids["iteration_id"], max_splits=4,
                                 **asker)
        yield "GetSplits", valid("GetSplits", iteration_id=ids["iteration_id"],
                                 max_splits=rng.choice([0, -1, 1025, I64[1], I64[0]]), **asker)
        yield "GetSplits", valid("GetSplits", iteration_id=ids["iteration_id"], max_splits=1,
                                 repetition=-1, **asker)
        yield "GetSplits", valid("GetSplits", iteration_id=ids["iteration_id"], max_splits=1,
                                 **{**asker, **rng.choice([{"task_id": 0}, {"worker_uid": ""},
                                                           {"request_number": -3}])})
        yield "GetSplits", valid("GetSplits", iteration_id=ids["iteration_id"], max_splits=1,
                                 **{**asker, "task_id": unknown_id()})
        yield "GetElements", valid("GetElements", task_id=unknown_id(), max_elements=1,
                                   max_bytes=1)
        yield "GetElements", valid("GetElements", task_id=rng.choice(sorted(state["tasks"])),
                                   max_elements=rng.choice([0, -1, I64[0]]), max_bytes=10)
        for name, (method, _) in sorted(raw.stubs.items()):
            payload = rng.choice(NASTY) if rng.random() < 0.3 else rng.randbytes(
                rng.choice([1, 3, 9, 40]))
            if not parses(method, payload):
                yield name, payload


@pytest.mark.timeout(60)
def test_rejected_calls_leave_the_dispatcher_state_unchanged(cluster: InProcessCluster,
                                                             raw: RawClient) -> None:
    seed = fuzz_seed()
    ids = populate(raw)
    before = state_of(cluster)
    outcomes = [raw.call(name, payload) for name, payload in rejected(raw, ids, seed)]
    accepted = [str(o) for o in outcomes if o.code is None]
    assert not accepted, f"invalid requests were accepted (seed {seed}):\n" + "\n".join(accepted)
    assert {o.method for o in outcomes} == set(raw.stubs)
    assert state_of(cluster) == before, f"rejected calls changed the state (seed {seed})"
    read_exactly_once(cluster.target)


@pytest.mark.timeout(60)
def test_absurd_valid_requests(cluster: InProcessCluster, raw: RawClient) -> None:
    """Well-formed requests with extreme values get an answer (or a refusal) and change
    nothing they should not."""
    ids = populate(raw)
    worker = cluster.workers[0]
    answer = raw.call("WorkerHeartbeat", valid(
        "WorkerHeartbeat", worker_address=worker._address, worker_uid=worker._uid,
        current_tasks=[-1, I64[0], I64[1], 0]))
    orders = pb.WorkerHeartbeatResponse.FromString(answer.response)
    assert sorted(orders.tasks_to_delete) == sorted([-1, I64[0], I64[1], 0])
    raw.call("ReleaseClient", valid("ReleaseClient", client_id=I64[0]))
    raw.call("ReleaseClient", valid("ReleaseClient", client_id=-1))
    info = raw.call("GetDatasetInfo", valid("GetDatasetInfo", dataset_id=ids["dataset_id"]))
    assert pb.GetDatasetInfoResponse.FromString(info.response).cardinality == 50
    job = raw.call("GetOrCreateJob", valid(
        "GetOrCreateJob", dataset_id=ids["dataset_id"], job_name="d" * 10_000,
        options=pb.JobOptions(processing_mode="DYNAMIC")))
    job_id = pb.GetOrCreateJobResponse.FromString(job.response).job_id
    # a far repetition of a DYNAMIC job: splits from the start, then the older ones have ended
    far = raw.call("GetOrCreateIteration", valid("GetOrCreateIteration", job_id=job_id,
                                                 repetition=I64[1]))
    iteration_id = pb.GetOrCreateIterationResponse.FromString(far.response).iteration_id
    task_id = _snapshot(raw)["iterations"][iteration_id]["tasks"][worker._address]
    for number, (repetition, expected) in enumerate(((I64[1], [(0, 1)]), (0, [])), 1):
        got = pb.GetSplitsResponse.FromString(raw.call("GetSplits", valid(
            "GetSplits", iteration_id=iteration_id, repetition=repetition, max_splits=1,
            task_id=task_id, worker_uid="absurd", request_number=number)).response)
        assert [(s.start, s.stop) for s in got.splits] == expected
    elements = raw.call("GetElements", valid("GetElements", task_id=I64[1], max_elements=I64[1],
                                             max_bytes=I64[1], consumer_index=I64[0]))
    assert elements.code is grpc.StatusCode.UNAVAILABLE
    read_exactly_once(cluster.target)


@pytest.mark.timeout(60)
def test_a_dataset_that_cannot_be_loaded_fails_only_its_own_job(cluster: InProcessCluster,
                                                                raw: RawClient) -> None:
    """A registered payload that is no pickle reaches the worker as a task: the worker must
    keep running other tasks, and a reader of that job must get an error, not hang."""
    dataset_id = pb.RegisterDatasetResponse.FromString(raw.call("RegisterDataset", valid(
        "RegisterDataset", dataset=b"not a pickle", fingerprint="garbage", compression="AUTO",
        cardinality=-2, num_split_units=10)).response).dataset_id
    for mode in ("OFF", "DYNAMIC"):
        job = pb.GetOrCreateJobResponse.FromString(raw.call("GetOrCreateJob", valid(
            "GetOrCreateJob", dataset_id=dataset_id,
            options=pb.JobOptions(processing_mode=mode))).response)
        raw.call("GetOrCreateIteration", valid("GetOrCreateIteration", job_id=job.job_id))
    read_exactly_once(cluster.target)
    with pytest.raises(InvalidArgumentError, match=r"task \d+ cannot load its dataset: "
                                                   r"UnpicklingError"):
        list(from_dataset_id("parallel_epochs", cluster.target, dataset_id,
                             dispatcher_timeout_ms=5_000))
    assert cluster.workers[0].error is None


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_process_servers_survive_a_random_barrage() -> None:
    seed = fuzz_seed()
    with ProcessCluster(num_workers=1, heartbeat_interval_ms=100) as cluster:
        raw = RawClient(cluster.dispatcher.address, cluster.workers[0].address)
        try:
            populate(raw)
            barrage(raw, seed, calls=300)
        finally:
            raw.close()
        for server in (cluster.dispatcher, *cluster.workers):
            assert server.process is not None and server.process.poll() is None, server.log
        read_exactly_once(cluster.target)
