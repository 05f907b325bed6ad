"""The benchmark workloads; each function runs one workload once and returns its throughput.

TensorFlow's side of each workload is in tf_workloads.py, under the same name."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
from autoscale import report, run_autoscale
from readers import run_readers
from s3_reads import tfrecord_s3, tfrecord_s3_raw
from torch import nn

import convoy as cv

# Workers cannot import this module (bench/ is not installed): send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class Workload:
    name: str
    unit: str
    convoy: Callable[[], float]
    #: at most this many runs whatever --repeats asks (a long workload)
    repeats: int | None = None


#: Lines a workload prints after the table (its figures other than the one it returns).
NOTES: list[str] = []


def _rate(iterable: object, measure: Callable[[object], float] = lambda _: 1.0) -> float:
    started = time.perf_counter()
    total = 0.0
    for element in iterable:  # type: ignore[attr-defined]
        total += measure(element)
    return total / (time.perf_counter() - started)


def local_batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(ds)


def _numpy_work(x: np.ndarray) -> np.ndarray:
    return np.sort(np.fft.rfft(x).real)


def _parallel_map(parallel: int | None) -> float:
    rows = np.random.default_rng(0).standard_normal((64, 65_536)).astype(np.float32)
    ds = cv.data.Dataset.from_tensor_slices(rows).repeat(4).map(_numpy_work,
                                                                num_parallel_calls=parallel)
    return _rate(ds)


def local_parallel_map() -> float:
    return _parallel_map(cv.data.AUTOTUNE)


def local_sequential_map() -> float:
    return _parallel_map(None)


_SLICE_BATCHES = 50_000


def _slice_rows() -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(1)
    return data.integers(0, 100_000, (16_384, 8)), data.random(16_384).astype(np.float32)


def _slice_batches(repeat_first: bool) -> float:
    ds = cv.data.Dataset.from_tensor_slices(_slice_rows())
    ds = ds.repeat().batch(256) if repeat_first else ds.batch(256).repeat()
    return _rate(ds.take(_SLICE_BATCHES))


def repeat_then_batch() -> float:
    return _slice_batches(repeat_first=True)


def batch_then_repeat() -> float:
    return _slice_batches(repeat_first=False)


def repeat_then_batch_ratio() -> float:
    """repeat_then_batch's rate over batch_then_repeat's, measured back to back."""
    return repeat_then_batch() / batch_then_repeat()


# ----- data service: servers in their own processes, the consumer here -----------------------
_clusters: dict[int, object] = {}


def _cluster(num_workers: int) -> str:
    """The target of a cluster with ``num_workers`` worker processes (started once)."""
    from convoy.testing import ProcessCluster

    if num_workers not in _clusters:
        _clusters[num_workers] = ProcessCluster(num_workers)
    return _clusters[num_workers].target  # type: ignore[attr-defined]


def stop_clusters() -> None:
    for cluster in _clusters.values():
        cluster.stop()  # type: ignore[attr-defined]
    _clusters.clear()


def _through_service(ds: cv.data.Dataset, mode: str, num_workers: int = 1,
                     compression: str | None = "AUTO", **options: Any) -> cv.data.Dataset:
    return ds.apply(cv.data.service.distribute(mode, _cluster(num_workers),
                                               compression=compression, **options))


def _megabytes(element: np.ndarray) -> float:
    return element.nbytes / 1e6


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def abandoned_reads(reads: int = 4, settle_s: float = 10.0) -> float:
    """Worker RSS growth (MB) 10 s after 4 reads that take 5 batches of 16 float32[4096] rows
    and close their iterators (a fresh cluster: the figure is this workload's alone)."""
    from convoy.testing import ProcessCluster

    with ProcessCluster(1) as cluster:
        (worker,) = cluster.workers
        assert worker.process is not None
        baseline = _rss_mb(worker.process.pid)
        for _ in range(reads):
            ds = (cv.data.Dataset.range(100_000).map(lambda _: np.zeros(4096, np.float32))
                  .batch(16).apply(cv.data.service.distribute("parallel_epochs",
                                                              cluster.target)))
            iterator = iter(ds)
            for _ in range(5):
                next(iterator)
            iterator.close()
        time.sleep(settle_s)
        return _rss_mb(worker.process.pid) - baseline


def autoscale() -> float:
    """Seconds until the trainer gets 90% of its demand through an adaptive LocalCluster;
    the other figures go to NOTES (bench/autoscale.py)."""
    figures = run_autoscale()
    NOTES.extend(report(figures))
    return float("inf") if figures["met_s"] is None else figures["met_s"]


def scalar_map() -> float:
    ds = cv.data.Dataset.range(200_000).map(lambda x: x * 2)
    return _rate(_through_service(ds, "parallel_epochs"))


def batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(_through_service(ds, "parallel_epochs"))


def tensor4mib(**options: Any) -> float:
    ds = cv.data.Dataset.from_tensors(np.ones((1024, 1024), np.float32)).repeat(500)
    return _rate(_through_service(ds, "parallel_epochs", compression=None, **options),
                 _megabytes)


def tensor4mib_tcp() -> float:
    """tensor4MiB over gRPC, as to a worker on another host."""
    return tensor4mib(data_transfer_protocol="grpc")


def tensor4mib_local() -> float:
    """tensor4MiB through shared memory, from a worker on the consumer's host."""
    return tensor4mib(target_workers="LOCAL")


def images_auto() -> float:
    images = np.random.default_rng(0).integers(0, 256, (32, 224, 224, 3), dtype=np.uint8)
    ds = cv.data.Dataset.from_tensors(images).repeat(300)
    # over gRPC, where compression applies (shared memory never compresses)
    return _rate(_through_service(ds, "parallel_epochs", compression="AUTO",
                                  data_transfer_protocol="grpc"), _megabytes)


def dynamic_batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(_through_service(ds, "distributed_epoch"))


def two_workers() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    seen = np.zeros(2_000_000, np.int64)
    started = time.perf_counter()
    batches = 0
    for batch in _through_service(ds, "distributed_epoch", num_workers=2):
        np.add.at(seen, batch // 2, 1)
        batches += 1
    rate = batches / (time.perf_counter() - started)
    if not (seen == 1).all():
        raise AssertionError("two_workers: some element did not arrive exactly once")
    return rate


# ----- the cross-trainer cache: two trainers (different ids) read one job -------------------
#: A workload's reader threads that have not finished by then are hung.
READERS_TIMEOUT_S = 600.0

_CACHE_ELEMENTS = 20_000  # each trainer reads this many elements of 1 KiB
_CACHE_COUNT_EVERY = 100  # the worker notes every 100th element it produces
_cache_runs = iter(range(1_000_000))


def _two_trainers_on_one_cache() -> tuple[int, int, float]:
    """Elements the worker produced, elements both trainers consumed, and the seconds it
    took: two trainers read the same job at once, each through its own reader."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as directory:
        notes = Path(directory) / "produced"

        def note(x: Any) -> Any:  # runs on the worker
            if x % _CACHE_COUNT_EVERY == 0:
                with open(notes, "a") as file:
                    file.write(f"{x}\n")
            return np.full(256, x, np.float32)

        ds = cv.data.Dataset.range(10**12).repeat().map(note)
        job = f"cache-{next(_cache_runs)}"
        consumed = [0, 0]

        def trainer(index: int) -> None:
            distributed = ds.apply(cv.data.service.distribute(
                "parallel_epochs", _cluster(1), job_name=job, compression=None,
                cross_trainer_cache=cv.data.service.CrossTrainerCache(f"trainer-{index}")))
            for _ in distributed.take(_CACHE_ELEMENTS):
                consumed[index] += 1

        started = time.perf_counter()
        run_readers(trainer, 2, "cache_two_trainers", READERS_TIMEOUT_S)
        seconds = time.perf_counter() - started
        highest = max((int(line) for line in notes.read_text().split()), default=0)
    return highest + _CACHE_COUNT_EVERY, sum(consumed), seconds


def cache_produced_per_consumed() -> float:
    produced, consumed, _ = _two_trainers_on_one_cache()
    return produced / consumed


def cache_two_trainers() -> float:
    _, consumed, seconds = _two_trainers_on_one_cache()
    return consumed / seconds


_coordinated_jobs = iter(range(1 << 30))  # a job name per read: a job's rounds go on


def _coordinated_rounds(num_consumers: int, rounds: int = 60_000) -> float:
    """Rounds/s of a coordinated read of ``range(10**6).repeat()`` on 2 workers, each consumer
    (a replica of synchronous training) reading ``rounds`` elements on a thread of its own."""
    ds = cv.data.Dataset.range(10**6).repeat()
    job_name = f"coordinated-{num_consumers}-{next(_coordinated_jobs)}"
    iterators = [iter(ds.apply(cv.data.service.distribute(
        "parallel_epochs", _cluster(2), job_name=job_name, consumer_index=index,
        num_consumers=num_consumers))) for index in range(num_consumers)]

    def consume(iterator: Any) -> None:
        for _ in range(rounds):
            next(iterator)

    started = time.perf_counter()
    run_readers(lambda index: consume(iterators[index]), num_consumers,
                f"coordinated_{num_consumers}x2", READERS_TIMEOUT_S)
    rate = rounds / (time.perf_counter() - started)
    for iterator in iterators:
        iterator.close()  # type: ignore[attr-defined]
    return rate


def coordinated_2x2() -> float:
    return _coordinated_rounds(2)


def coordinated_1x2() -> float:
    return _coordinated_rounds(1)


# ----- the dispatcher as history grows --------------------------------------------------------
#: 1,000 workers have read 1,000 iterations; the last 10 still have readers.
_SCALE_WORKERS, _SCALE_ITERATIONS, _SCALE_LIVE = 1000, 1000, 10
_collected: dict[str, object] = {}  # the state after dispatcher_scale_gc, for the heartbeats
# The state machine runs on one thread: its workloads count CPU time, which on a shared machine
# measures the code rather than the neighbours.


def _scaled_state() -> object:
    """The dispatcher's state machine after that history (no network, no journal)."""
    from convoy.data.service._common.config import ShardingPolicy
    from convoy.data.service._dispatcher import events as ev
    from convoy.data.service._dispatcher.state import DispatcherState

    state = DispatcherState()
    dataset = state.apply(ev.RegisterDataset("fp", b"pipeline", "", b"", 10, 10))
    for w in range(_SCALE_WORKERS):
        state.apply(ev.WorkerHeartbeat(f"worker-{w}:5000", "uid", (), 0.0))
    job = state.apply(ev.GetOrCreateJob(dataset, "train", ev.JobOptions(ShardingPolicy.OFF)))
    iterations = [state.apply(ev.GetOrCreateIteration(job, epoch, 0.0))
                  for epoch in range(_SCALE_ITERATIONS)]
    for _, client_id in iterations[:-_SCALE_LIVE]:  # left unfinished: idle, to collect
        state.apply(ev.ReleaseClient(client_id))
    return state


def dispatcher_scale_gc() -> float:
    """CPU milliseconds to forget the 990 idle iterations (their 990,000 tasks); target
    below 1,000. (A finished iteration drops its tasks as it finishes.)"""
    from convoy.data.service._dispatcher import events as ev

    state = _scaled_state()
    started = time.process_time()
    for now in (1.0, 20.0):  # first seen idle, then idle for longer than the timeout
        state.apply(ev.CollectGarbage(now, 1e9, 1e9, (), (), iteration_timeout=10.0))
    elapsed = time.process_time() - started
    if len(state.iterations) != _SCALE_LIVE:  # type: ignore[attr-defined]
        raise AssertionError("dispatcher_scale_gc: the idle iterations were not forgotten")
    _collected["state"] = state
    return elapsed * 1e3


def dispatcher_scale_heartbeat(heartbeats: int = 20_000) -> float:
    """CPU microseconds per worker heartbeat, each worker reporting its 10 live tasks, after
    dispatcher_scale_gc; target below 50."""
    from convoy.data.service._dispatcher import events as ev

    if "state" not in _collected:
        dispatcher_scale_gc()
    state: Any = _collected["state"]
    current = {address: tuple(iteration.tasks[address] for iteration in state.iterations.values())
               for address in state.workers}
    events = [ev.WorkerHeartbeat(address, "uid", tasks, 30.0) for address, tasks in current.items()]
    started = time.process_time()
    for i in range(heartbeats):
        orders = state.apply(events[i % len(events)])
    elapsed = time.process_time() - started
    if orders.new_tasks or orders.tasks_to_delete:
        raise AssertionError("dispatcher_scale_heartbeat: a steady heartbeat changed tasks")
    return elapsed / heartbeats * 1e6


def _journaled_dispatcher(measure: Callable[[Any], float]) -> float:
    """``measure(client)`` for a client of a dispatcher process journaling in a temporary
    work_dir (fault_tolerant_mode)."""
    import tempfile

    from convoy._transport import rpc as _rpc
    from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
    from convoy.testing import ServerProcess

    with tempfile.TemporaryDirectory() as work_dir:
        server = ServerProcess("dispatcher", ["--port", "0", "--work-dir", work_dir,
                                              "--fault-tolerant"]).start()
        client = _rpc.Client(server.address, DISPATCHER, DISPATCHER_METHODS)
        try:
            return measure(client)
        finally:
            client.close()
            server.kill()


def dispatcher_grpc_heartbeats(workers: int = 100, live: int = 10,
                               seconds: float = 3.0) -> float:
    """Worker heartbeats per second a dispatcher process answers over gRPC with its journal
    on, each of ``workers`` reporting its ``live`` tasks; target at least 2,000 (compare
    dispatcher_grpc_info: the same calls can go no faster than a tiny one)."""
    from convoy.data.service import service_pb2 as pb

    def measure(client: Any) -> float:
        dataset = client.call("RegisterDataset", pb.RegisterDatasetRequest(
            dataset=b"pipeline", fingerprint="fp", cardinality=10,
            num_split_units=10)).dataset_id
        job = client.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
            dataset_id=dataset, options=pb.JobOptions(processing_mode="OFF"))).job_id
        for epoch in range(live):
            client.call("GetOrCreateIteration",
                        pb.GetOrCreateIterationRequest(job_id=job, repetition=epoch))
        requests = []
        for w in range(workers):  # each registers (journaled) and is given its tasks
            request = pb.WorkerHeartbeatRequest(worker_address=f"worker-{w}:5000",
                                                worker_uid="uid")
            tasks = client.call("WorkerHeartbeat", request).new_tasks
            request.current_tasks.extend(t.task_id for t in tasks)
            requests.append(request)
        return _calls_per_second(client, "WorkerHeartbeat", requests, seconds)

    return _journaled_dispatcher(measure)


def dispatcher_grpc_info(seconds: float = 3.0) -> float:
    """Tiny read-only calls (GetDatasetInfo) per second, the ceiling for any unary call to a
    dispatcher process."""
    from convoy.data.service import service_pb2 as pb

    def measure(client: Any) -> float:
        dataset = client.call("RegisterDataset", pb.RegisterDatasetRequest(
            dataset=b"pipeline", fingerprint="fp")).dataset_id
        request = pb.GetDatasetInfoRequest(dataset_id=dataset)
        return _calls_per_second(client, "GetDatasetInfo", [request], seconds)

    return _journaled_dispatcher(measure)


def _calls_per_second(client: Any, method: str, requests: list[Any], seconds: float,
                      in_flight: int = 8) -> float:
    """How many calls of ``method`` complete per second with ``in_flight`` outstanding."""
    pending: list[Any] = []
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        while len(pending) < in_flight:
            pending.append(client.future(method, requests[(done + len(pending)) % len(requests)]))
        pending.pop(0).result()
        done += 1
    for future in pending:
        future.result()
    return (done + len(pending)) / (time.perf_counter() - started)


# ----- parameter-server training: chief here, 2 ps + 2 workers as processes --------------------
LEARNING_RATE = 0.1


def _embedding_step(iterator, table, weights, bias, optimizer):  # runs on a worker
    import torch

    ids, labels = next(iterator)
    with cv.torch.pull(dense=[weights, bias], rows={table: ids}) as pulled:
        bags = pulled[table].mean(dim=1)
        logits = bags @ pulled[0] + pulled[1]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(np.array(labels)))
        loss.backward()
    optimizer.apply_gradients(pulled.gradients())


class EmbeddingModel(nn.Module):
    """ps_embedding's model as a PyTorch user writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(100_000, 64, mode="mean")
        self.head = nn.Linear(64, 1)
        nn.init.normal_(self.bag.weight, 0, 0.05)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: Any) -> Any:
        return self.head(self.bag(ids)).squeeze(-1)


def _module_step(iterator, model, optimizer):  # runs on a worker
    import torch

    ids, labels = next(iterator)
    logits = model(torch.from_numpy(np.asarray(ids)))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, torch.from_numpy(np.array(labels)))
    loss.backward()
    optimizer.apply_gradients(model.gradients())


def _embedding_step_tfstyle(iterator, table, weights, bias):  # runs on a worker
    """The same step as a TensorFlow program ports it: a read per variable, gradients by hand,
    then a sparse update of the table and dense updates of the head."""
    ids, labels = next(iterator)
    rows = table.sparse_read(ids)
    w, b = weights.read_value(), bias.read_value()
    bags = rows.mean(axis=1)
    logits = bags @ w + b
    dlogits = (1 / (1 + np.exp(-logits)) - labels) / len(labels)
    row_grads = np.broadcast_to((dlogits[:, None] * w)[:, None, :] / ids.shape[1], rows.shape)
    table.scatter_sub(cv.IndexedSlices(LEARNING_RATE * row_grads, ids))
    weights.assign_sub(LEARNING_RATE * (bags.T @ dlogits))
    bias.assign_sub(LEARNING_RATE * dlogits.sum())


def _embedding_dataset():
    data = np.random.default_rng(1)
    ids = data.integers(0, 100_000, (64 * 256, 8))
    labels = (data.random(64 * 256) < 0.5).astype(np.float32)
    return cv.data.Dataset.from_tensor_slices((ids, labels)).batch(256).repeat()


def _embedding_variables(with_optimizer: bool) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    table = cv.Variable(rng.normal(0, 0.05, (100_000, 64)).astype(np.float32), name="table")
    weights = cv.Variable(np.zeros(64, np.float32), name="weights")
    bias = cv.Variable(np.zeros((), np.float32), name="bias")
    return (table, weights, bias, cv.optimizers.SGD(LEARNING_RATE)) if with_optimizer else \
        (table, weights, bias)


def _embedding_module() -> tuple[Any, ...]:
    import torch

    torch.manual_seed(0)
    return cv.torch.place(EmbeddingModel()), cv.optimizers.SGD(LEARNING_RATE)


def _embedding_rate(step: Callable[..., None], make: Callable[[], tuple[Any, ...]],
                    steps: int, dataset_fn: Callable[[], Any] = _embedding_dataset,
                    on_cluster: Callable[[Any], None] | None = None) -> float:
    """Steps/s of ``step(iterator, *make())`` scheduled ``steps`` times on 2 workers, with
    the embedding model (made under the strategy's scope) sharded over 2 ps, reading
    ``dataset_fn``'s dataset; ``on_cluster(cluster)`` first, if given."""
    from convoy.testing import TrainingCluster

    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        if on_cluster is not None:
            on_cluster(cluster)
        strategy = cv.distribute.ParameterServerStrategy(
            cluster.resolver(),
            variable_partitioner=cv.distribute.partitioners.FixedShardsPartitioner(2))
        with strategy.scope():
            made = make()
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
            args = (iterator, *made)
            for _ in range(20):  # warm up: imports and connections on the workers
                coordinator.schedule(step, args)
            coordinator.join()
            started = time.perf_counter()
            for _ in range(steps):
                coordinator.schedule(step, args)
            coordinator.join()
            return steps / (time.perf_counter() - started)
        finally:
            coordinator.shutdown()


def ps_embedding(steps: int = 2000) -> float:
    return _embedding_rate(_embedding_step, lambda: _embedding_variables(True), steps)


def ps_embedding_module(steps: int = 2000) -> float:
    return _embedding_rate(_module_step, _embedding_module, steps)


def ps_embedding_tfstyle(steps: int = 2000) -> float:
    return _embedding_rate(_embedding_step_tfstyle, lambda: _embedding_variables(False), steps)


DYNAMIC_IDS = 10_000_000
WARM_ROWS = 1_000_000


class DynamicEmbeddingModel(nn.Module):
    """ps_embedding's model with its table dynamic: rows made on first lookup of any id."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = cv.torch.DynamicEmbeddingBag(
            64, mode="mean", initializer=cv.distribute.RowInitializer("normal", 0.0, 0.05))
        self.head = nn.Linear(64, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: Any) -> Any:
        return self.head(self.bag(ids)).squeeze(-1)


def _zipf_dataset():
    """Bags of 8 ids drawn Zipf (exponent 1.1) from 10 million (rank 1 is id 0)."""
    data = np.random.default_rng(1)
    wanted, drawn = 256 * 512 * 8, []
    while wanted > 0:
        ranks = data.zipf(1.1, wanted * 2)
        ranks = ranks[ranks <= DYNAMIC_IDS][:wanted]
        drawn.append(ranks - 1)
        wanted -= ranks.size
    ids = np.concatenate(drawn).reshape(-1, 8)
    labels = (data.random(len(ids)) < 0.5).astype(np.float32)
    return cv.data.Dataset.from_tensor_slices((ids, labels)).batch(256).repeat()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def ps_dynamic_embedding(steps: int = 2000) -> float:
    """Steps/s of ps_embedding_module's step on the dynamic model, ids Zipf from 10 million,
    after a warm-up making 1 million rows (ids 0..999,999 once); the ps's RSS growth over
    that warm-up against the bytes of their ids, rows and slots goes to NOTES."""
    ps_pids: list[int] = []

    def note_ps(cluster: Any) -> None:
        ps_pids.extend(cluster.servers[("ps", i)].process.pid for i in range(2))

    def make() -> tuple[Any, ...]:
        import torch

        before = [_rss(pid) for pid in ps_pids]
        torch.manual_seed(0)
        model = cv.torch.place(DynamicEmbeddingModel())
        for first in range(0, WARM_ROWS, 50_000):
            model.bag.table.lookup(np.arange(first, first + 50_000))
        grown = [_rss(pid) - rss for pid, rss in zip(ps_pids, before, strict=True)]
        held = [stats["bytes"] for stats in model.bag.table.stats()]
        NOTES.append("ps_dynamic_embedding: RSS growth / bytes of ids, rows and slots after "
                     f"{WARM_ROWS:,} rows: " + ", ".join(
                         f"ps{i} {g / 2**20:.0f} MiB / {h / 2**20:.0f} MiB = {g / h:.2f}x"
                         for i, (g, h) in enumerate(zip(grown, held, strict=True))))
        return model, cv.optimizers.SGD(LEARNING_RATE)

    return _embedding_rate(_module_step, make, steps, _zipf_dataset, note_ps)


# ----- tf.train.Example parsing ----------------------------------------------------------------
PARSE_RECORDS = 100_000


def parse_example_file() -> str:
    """A TFRecord file of 100,000 Examples of 10 features (4 int64 scalars, 3 float32[4],
    2 bytes, 1 variable-length int64), written once with convoy's message classes; both
    sides of the workload read it."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.gettempdir()) / "convoy-bench" / "parse_example.tfrecord"
    if path.exists():
        return str(path)
    path.parent.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    ints = rng.integers(-(10**9), 10**9, size=(PARSE_RECORDS, 4))
    floats = rng.standard_normal((PARSE_RECORDS, 3, 4)).astype(np.float32)
    lengths = rng.integers(0, 20, size=PARSE_RECORDS)
    io = cv.io
    partial = path.with_suffix(".partial")
    with cv.data.TFRecordWriter(partial) as writer:
        for i in range(PARSE_RECORDS):
            feature = {f"int{j}": io.Feature(int64_list=io.Int64List(value=[ints[i, j]]))
                       for j in range(4)}
            feature.update({f"float{j}": io.Feature(float_list=io.FloatList(value=floats[i, j]))
                            for j in range(3)})
            feature["name"] = io.Feature(bytes_list=io.BytesList(value=[b"record-%d" % i]))
            feature["tag"] = io.Feature(bytes_list=io.BytesList(value=[b"tag%d" % (i % 7)]))
            feature["ids"] = io.Feature(int64_list=io.Int64List(
                value=rng.integers(0, 100_000, size=lengths[i])))
            writer.write(io.Example(features=io.Features(feature=feature)).SerializeToString())
    partial.rename(path)
    return str(path)


def parse_example_features() -> dict[str, Any]:
    io = cv.io
    features: dict[str, Any] = {f"int{j}": io.FixedLenFeature([], np.int64) for j in range(4)}
    features.update({f"float{j}": io.FixedLenFeature([4], np.float32) for j in range(3)})
    features["name"] = io.FixedLenFeature([], bytes)
    features["tag"] = io.FixedLenFeature([], bytes)
    features["ids"] = io.VarLenFeature(np.int64)
    return features


def parse_example() -> float:
    """Records/s of TFRecordDataset(f).batch(256).map(parse_example)."""
    path, features = parse_example_file(), parse_example_features()
    ds = cv.data.TFRecordDataset(path).batch(256).map(
        lambda records: cv.io.parse_example(records, features))
    return _rate(ds, lambda batch: len(batch["int0"]))


def parse_example_cpu() -> float:
    """Records per CPU second (all the process's threads) of the same pipeline: what the parse
    costs, steadier than records/s on a loaded machine."""
    path, features = parse_example_file(), parse_example_features()
    ds = cv.data.TFRecordDataset(path).batch(256).map(
        lambda records: cv.io.parse_example(records, features))
    started, total = time.process_time(), 0
    for batch in ds:
        total += len(batch["int0"])
    return total / (time.process_time() - started)


SEQUENCE_RECORDS = 20_000
SEQUENCE_STEPS = 20


def parse_sequence_example_file() -> str:
    """A TFRecord file of 20,000 SequenceExamples: context (an int64 id, a float32 label) and
    3 feature lists of 20 steps (an int64 token, float32[4] and a variable-length bytes
    list per step), written once with convoy's message classes; both sides read it."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.gettempdir()) / "convoy-bench" / "parse_sequence_example.tfrecord"
    if path.exists():
        return str(path)
    path.parent.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    io = cv.io
    partial = path.with_suffix(".partial")
    with cv.data.TFRecordWriter(partial) as writer:
        for i in range(SEQUENCE_RECORDS):
            context = io.Features(feature={
                "id": io.Feature(int64_list=io.Int64List(value=[i])),
                "label": io.Feature(float_list=io.FloatList(value=[float(rng.random())]))})
            tokens = rng.integers(0, 50_000, size=SEQUENCE_STEPS)
            vectors = rng.standard_normal((SEQUENCE_STEPS, 4)).astype(np.float32)
            lists = {
                "tokens": io.FeatureList(feature=[
                    io.Feature(int64_list=io.Int64List(value=[t])) for t in tokens]),
                "vectors": io.FeatureList(feature=[
                    io.Feature(float_list=io.FloatList(value=v)) for v in vectors]),
                "words": io.FeatureList(feature=[
                    io.Feature(bytes_list=io.BytesList(
                        value=[b"w%d" % w for w in range(int(rng.integers(0, 3)))]))
                    for _ in range(SEQUENCE_STEPS)]),
            }
            writer.write(io.SequenceExample(
                context=context, feature_lists=io.FeatureLists(feature_list=lists)
            ).SerializeToString())
    partial.rename(path)
    return str(path)


def parse_sequence_example() -> float:
    """Records/s of TFRecordDataset(f).batch(256).map(parse_sequence_example)."""
    io = cv.io
    context = {"id": io.FixedLenFeature([], np.int64),
               "label": io.FixedLenFeature([], np.float32)}
    sequence = {"tokens": io.FixedLenSequenceFeature([], np.int64),
                "vectors": io.FixedLenSequenceFeature([4], np.float32),
                "words": io.VarLenFeature(bytes)}
    ds = cv.data.TFRecordDataset(parse_sequence_example_file()).batch(256).map(
        lambda records: io.parse_sequence_example(records, context, sequence))
    return _rate(ds, lambda parsed: len(parsed[0]["id"]))


ALL = [
    Workload("local_batch256", "batches/s", local_batch256),
    Workload("repeat_then_batch", "batches/s", repeat_then_batch),
    Workload("batch_then_repeat", "batches/s", batch_then_repeat),
    Workload("repeat_batch_ratio", "x batch 1st", repeat_then_batch_ratio),
    Workload("local_map_numpy_seq", "elements/s", local_sequential_map),
    Workload("local_map_numpy_par", "elements/s", local_parallel_map),
    Workload("scalar_map", "elements/s", scalar_map),
    Workload("batch256", "batches/s", batch256),
    Workload("tensor4MiB", "MB/s", tensor4mib_tcp),
    Workload("tensor4MiB_local", "MB/s", tensor4mib_local),
    Workload("images_auto", "MB/s", images_auto),
    Workload("dynamic_batch256", "batches/s", dynamic_batch256),
    Workload("two_workers", "batches/s", two_workers),
    Workload("abandoned_reads", "MB RSS grown", abandoned_reads),
    Workload("autoscale", "s to demand", autoscale, repeats=1),
    Workload("cache_two_trainers", "elements/s", cache_two_trainers),
    Workload("cache_produced", "per consumed", cache_produced_per_consumed),
    Workload("coordinated_2x2", "rounds/s", coordinated_2x2),
    Workload("coordinated_1x2", "rounds/s", coordinated_1x2),
    Workload("ps_embedding", "steps/s", ps_embedding),
    Workload("ps_embedding_module", "steps/s", ps_embedding_module),
    Workload("ps_dynamic_embedding", "steps/s", ps_dynamic_embedding),
    Workload("ps_embedding_tfstyle", "steps/s", ps_embedding_tfstyle),
    Workload("parse_example", "records/s", parse_example),
    Workload("parse_example_cpu", "records/CPU s", parse_example_cpu),
    Workload("parse_sequence_example", "records/s", parse_sequence_example),
    Workload("tfrecord_s3_raw", "MB/s", tfrecord_s3_raw),
    Workload("tfrecord_s3", "MB/s", tfrecord_s3),
    Workload("dispatcher_scale_gc", "CPU ms", dispatcher_scale_gc),
    Workload("dispatcher_scale_hb", "CPU us/beat", dispatcher_scale_heartbeat),
    Workload("dispatcher_grpc_hb", "heartbeats/s", dispatcher_grpc_heartbeats),
    Workload("dispatcher_grpc_info", "calls/s", dispatcher_grpc_info),
]
