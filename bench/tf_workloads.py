"""TensorFlow's side of the benchmark workloads: the same work as workloads.py, under the same
names, run with TensorFlow's own Python (``make bench-tf`` makes it).

``python tf_workloads.py --repeats N NAME`` runs workload NAME N times and prints one JSON line,
``{"results": [throughput, ...]}`` or ``{"error": message}``. Its servers run as processes of
their own and are killed when it ends. TensorFlow is imported only by the workloads, so the
runner in the convoy environment can import this module for ``WORKLOADS``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from readers import run_readers
from tf_servers import Servers, data_service, exit_with_parent, training_cluster

# Some reads take TensorFlow minutes (distributed_epoch fetches a split per element from the
# dispatcher): a read is cut after this long, and its rate is that of the part read.
READ_BUDGET_S = 10.0


def _read(iterable: object, measure: Callable[[object], float]) -> tuple[float, bool]:
    """The rate of ``measure`` over the elements read, and whether all were read."""
    started = time.perf_counter()
    total = 0.0
    complete = True
    for element in iterable:  # type: ignore[attr-defined]
        total += measure(element)
        if time.perf_counter() - started > READ_BUDGET_S:
            complete = False
            break
    return total / (time.perf_counter() - started), complete


def _rate(iterable: object, measure: Callable[[object], float] = lambda _: 1.0) -> float:
    return _read(iterable, measure)[0]


def _megabytes(element: object) -> float:
    return element.shape.num_elements() * element.dtype.size / 1e6  # type: ignore[attr-defined]


def _repeat(run: Callable[[], float], repeats: int) -> list[float]:
    return [run() for _ in range(repeats)]


# ----- local tf.data ---------------------------------------------------------------------------
def local_batch256(repeats: int) -> list[float]:
    import tensorflow as tf

    return _repeat(lambda: _rate(tf.data.Dataset.range(2_000_000).map(lambda x: x * 2)
                                 .batch(256)), repeats)


SLICE_BATCHES = 50_000


def _slice_batches(repeat_first: bool) -> float:
    import tensorflow as tf

    data = np.random.default_rng(1)
    rows = data.integers(0, 100_000, (16_384, 8)), data.random(16_384).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices(rows)
    ds = ds.repeat().batch(256) if repeat_first else ds.batch(256).repeat()
    return _rate(ds.take(SLICE_BATCHES))


def repeat_then_batch(repeats: int) -> list[float]:
    return _repeat(lambda: _slice_batches(repeat_first=True), repeats)


def batch_then_repeat(repeats: int) -> list[float]:
    return _repeat(lambda: _slice_batches(repeat_first=False), repeats)


def repeat_then_batch_ratio(repeats: int) -> list[float]:
    return _repeat(lambda: _slice_batches(repeat_first=True)
                   / _slice_batches(repeat_first=False), repeats)


def _numpy_work(x: np.ndarray) -> np.ndarray:
    return np.sort(np.fft.rfft(x).real)


def _parallel_map(parallel: int | None, repeats: int) -> list[float]:
    import tensorflow as tf

    rows = np.random.default_rng(0).standard_normal((64, 65_536)).astype(np.float32)

    def numpy_work(x: object) -> object:
        return tf.numpy_function(_numpy_work, [x], tf.float32)

    return _repeat(lambda: _rate(tf.data.Dataset.from_tensor_slices(rows).repeat(4)
                                 .map(numpy_work, num_parallel_calls=parallel)), repeats)


def local_map_numpy_seq(repeats: int) -> list[float]:
    return _parallel_map(None, repeats)


def local_map_numpy_par(repeats: int) -> list[float]:
    import tensorflow as tf

    return _parallel_map(tf.data.AUTOTUNE, repeats)


# ----- tf.data service: dispatcher and workers as processes, the consumer here -------------------
def _through_service(make_dataset: Callable[[], object], mode: str, repeats: int,
                     num_workers: int = 1, compression: str | None = "AUTO",
                     measure: Callable[[object], float] = lambda _: 1.0,
                     check: Callable[[bool], None] = lambda complete: None) -> list[float]:
    """Throughputs of ``repeats`` reads through one dispatcher and ``num_workers`` workers;
    ``check(complete)`` runs after each read."""
    import tensorflow as tf

    with Servers() as servers:
        target = data_service(num_workers, servers)

        def run() -> float:
            ds = make_dataset().apply(tf.data.experimental.service.distribute(  # type: ignore
                processing_mode=mode, service=target, compression=compression))
            rate, complete = _read(ds, measure)
            check(complete)
            return rate

        return _repeat(run, repeats)


def scalar_map(repeats: int) -> list[float]:
    import tensorflow as tf

    return _through_service(lambda: tf.data.Dataset.range(200_000).map(lambda x: x * 2),
                            "parallel_epochs", repeats)


def _batch256() -> object:
    import tensorflow as tf

    return tf.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)


def batch256(repeats: int) -> list[float]:
    return _through_service(_batch256, "parallel_epochs", repeats)


def tensor4mib(repeats: int) -> list[float]:
    import tensorflow as tf

    tensor = np.ones((1024, 1024), np.float32)
    return _through_service(lambda: tf.data.Dataset.from_tensors(tensor).repeat(500),
                            "parallel_epochs", repeats, compression=None, measure=_megabytes)


def images_auto(repeats: int) -> list[float]:
    import tensorflow as tf

    images = np.random.default_rng(0).integers(0, 256, (32, 224, 224, 3), dtype=np.uint8)
    return _through_service(lambda: tf.data.Dataset.from_tensors(images).repeat(300),
                            "parallel_epochs", repeats, compression="AUTO", measure=_megabytes)


def dynamic_batch256(repeats: int) -> list[float]:
    return _through_service(_batch256, "distributed_epoch", repeats)


class _ExactlyOnce:
    """Counts batches, and checks at the end that every element arrived exactly once (at
    most once, when the read was cut short)."""

    def __init__(self, elements: int) -> None:
        self.seen = np.zeros(elements, np.int64)

    def __call__(self, batch: object) -> float:
        np.add.at(self.seen, batch.numpy() // 2, 1)  # type: ignore[attr-defined]
        return 1.0

    def check(self, complete: bool) -> None:
        if (self.seen > 1).any() or (complete and not (self.seen == 1).all()):
            raise AssertionError("two_workers: some element did not arrive exactly once")
        self.seen[:] = 0


def two_workers(repeats: int) -> list[float]:
    counter = _ExactlyOnce(2_000_000)
    return _through_service(_batch256, "distributed_epoch", repeats, num_workers=2,
                            measure=counter, check=counter.check)


def _coordinated_rounds(num_consumers: int, repeats: int) -> list[float]:
    """Rounds/s of a coordinated read of ``range(10**6).repeat()`` on 2 workers, each consumer
    reading on a thread of its own (for at most READ_BUDGET_S)."""
    import tensorflow as tf

    with Servers() as servers:
        target = data_service(2, servers)
        jobs = iter(range(1 << 30))

        def run() -> float:
            job_name = f"coordinated-{num_consumers}-{next(jobs)}"
            ds = tf.data.Dataset.range(10**6).repeat()
            readers = [ds.apply(tf.data.experimental.service.distribute(  # type: ignore
                processing_mode="parallel_epochs", service=target, job_name=job_name,
                consumer_index=index, num_consumers=num_consumers))
                for index in range(num_consumers)]
            counts = [0] * num_consumers
            started = time.perf_counter()

            def consume(index: int) -> None:
                for _ in readers[index]:
                    counts[index] += 1
                    if counts[index] >= 60_000 or time.perf_counter() - started > READ_BUDGET_S:
                        return

            run_readers(consume, num_consumers, f"coordinated_{num_consumers}x2",
                        READ_BUDGET_S + 60)
            return min(counts) / (time.perf_counter() - started)

        return _repeat(run, repeats)


def coordinated_2x2(repeats: int) -> list[float]:
    return _coordinated_rounds(2, repeats)


def coordinated_1x2(repeats: int) -> list[float]:
    return _coordinated_rounds(1, repeats)


# ----- parameter-server training: chief here, 2 ps + 2 workers as tf.distribute.Server ---------
LEARNING_RATE = 0.1
BATCH, BAG, ROWS, WIDTH = 256, 8, 100_000, 64


def _embedding_dataset() -> object:
    import tensorflow as tf

    data = np.random.default_rng(1)
    ids = data.integers(0, ROWS, (64 * BATCH, BAG))
    labels = (data.random(64 * BATCH) < 0.5).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH).repeat()


def _fused_step(strategy: object, table: object, weights: object,
                bias: object) -> Callable[[Iterator], None]:
    """The step as TensorFlow's guide writes it: a gradient tape and an optimizer, in a
    function run by ``strategy.run``."""
    import tensorflow as tf

    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE)

    def replica_step(ids: object, labels: object) -> None:
        with tf.GradientTape() as tape:
            bags = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
            logits = tf.linalg.matvec(bags, weights) + bias
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        # a tape differentiates by the shards of a sharded variable (the partitioner shards
        # the weights too)
        variables = [part for v in (table, weights, bias) for part in getattr(v, "variables", [v])]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    @tf.function
    def step(iterator: Iterator) -> None:
        strategy.run(replica_step, args=next(iterator))

    return step


def _tfstyle_step(strategy: object, table: object, weights: object,
                  bias: object) -> Callable[[Iterator], None]:
    """The step with a read per variable, gradients by hand, and per-variable updates."""
    import tensorflow as tf

    @tf.function
    def step(iterator: Iterator) -> None:
        ids, labels = next(iterator)
        flat_ids = tf.reshape(ids, [-1])  # a ShardedVariable reads by a vector of ids
        rows = tf.reshape(table.sparse_read(flat_ids), [-1, BAG, WIDTH])  # type: ignore
        # the partitioner shards the weights too, and a ShardedVariable has no read_value
        w, b = tf.convert_to_tensor(weights), bias.read_value()  # type: ignore[attr-defined]
        bags = tf.reduce_mean(rows, axis=1)
        logits = tf.linalg.matvec(bags, w) + b
        dlogits = (tf.sigmoid(logits) - labels) / BATCH
        row_grads = tf.broadcast_to((dlogits[:, None] * w)[:, None, :] / BAG, tf.shape(rows))
        table.scatter_sub(tf.IndexedSlices(  # type: ignore[attr-defined]
            tf.reshape(LEARNING_RATE * row_grads, [-1, WIDTH]), flat_ids))
        weights.assign_sub(  # type: ignore[attr-defined]
            LEARNING_RATE * tf.linalg.matvec(bags, dlogits, transpose_a=True))
        bias.assign_sub(LEARNING_RATE * tf.reduce_sum(dlogits))  # type: ignore[attr-defined]

    return step


def _embedding_rates(make_step: Callable[..., Callable[[Iterator], None]], repeats: int,
                     steps: int = 2000) -> list[float]:
    """Steps/s of ``steps`` scheduled steps, ``repeats`` times on one cluster (a process
    connects to one TensorFlow cluster only)."""
    import tensorflow as tf

    with Servers() as servers:
        spec = tf.train.ClusterSpec(training_cluster(num_workers=2, num_ps=2, servers=servers))
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver,
            variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        rng = np.random.default_rng(0)
        with strategy.scope():
            table = tf.Variable(rng.normal(0, 0.05, (ROWS, WIDTH)).astype(np.float32),
                                name="table")
            weights = tf.Variable(np.zeros(WIDTH, np.float32), name="weights")
            bias = tf.Variable(np.zeros((), np.float32), name="bias")
            step = make_step(strategy, table, weights, bias)
        iterator = iter(coordinator.create_per_worker_dataset(_embedding_dataset))
        for _ in range(20):  # warm up: tracing and connections on the workers
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        results = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(steps):
                coordinator.schedule(step, args=(iterator,))
            coordinator.join()
            results.append(steps / (time.perf_counter() - started))
        return results


def ps_embedding(repeats: int) -> list[float]:
    return _embedding_rates(_fused_step, repeats)


def ps_embedding_tfstyle(repeats: int) -> list[float]:
    return _embedding_rates(_tfstyle_step, repeats)


def cache_two_trainers(repeats: int) -> list[float]:
    """Two trainers with different ids read one job through the cross-trainer cache at once
    (20,000 elements of 1 KiB each, or what they read within the budget)."""
    import tensorflow as tf

    service = tf.data.experimental.service
    runs = iter(range(repeats))
    with Servers() as servers:
        target = data_service(1, servers)

        def run() -> float:
            job = f"cache-{next(runs)}"
            consumed = [0, 0]

            def trainer(index: int) -> None:
                ds = tf.data.Dataset.range(10**12).repeat().map(
                    lambda x: tf.fill([256], tf.cast(x, tf.float32)))
                ds = ds.apply(service.distribute(
                    processing_mode="parallel_epochs", service=target, job_name=job,
                    compression=None,
                    cross_trainer_cache=service.CrossTrainerCache(f"trainer-{index}")))
                started = time.perf_counter()
                for _ in ds.take(20_000):
                    consumed[index] += 1
                    if time.perf_counter() - started > READ_BUDGET_S:
                        break

            started = time.perf_counter()
            run_readers(trainer, 2, "cache_two_trainers", READ_BUDGET_S + 60)
            return sum(consumed) / (time.perf_counter() - started)

        return _repeat(run, repeats)


# ----- tf.train.Example parsing ----------------------------------------------------------------
def _parse_example_inputs() -> tuple[Any, dict[str, Any]]:
    """The file convoy's side wrote (workloads.parse_example_file) and tf.io's features."""
    import tempfile
    from pathlib import Path

    import tensorflow as tf

    path = Path(tempfile.gettempdir()) / "convoy-bench" / "parse_example.tfrecord"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run convoy's side of parse_example first")
    features = {f"int{j}": tf.io.FixedLenFeature([], tf.int64) for j in range(4)}
    features.update({f"float{j}": tf.io.FixedLenFeature([4], tf.float32) for j in range(3)})
    features["name"] = tf.io.FixedLenFeature([], tf.string)
    features["tag"] = tf.io.FixedLenFeature([], tf.string)
    features["ids"] = tf.io.VarLenFeature(tf.int64)
    return path, features


def parse_example(repeats: int) -> list[float]:
    """The file convoy's side wrote (workloads.parse_example_file), parsed by tf.io."""
    import tensorflow as tf

    path, features = _parse_example_inputs()

    def run() -> float:
        ds = tf.data.TFRecordDataset(str(path)).batch(256).map(
            lambda records: tf.io.parse_example(records, features))
        return _rate(ds, lambda batch: int(batch["int0"].shape[0]))

    return _repeat(run, repeats)


def parse_example_cpu(repeats: int) -> list[float]:
    """Records per CPU second (all the process's threads, TensorFlow's pools included)."""
    import tensorflow as tf

    path, features = _parse_example_inputs()

    def run() -> float:
        ds = tf.data.TFRecordDataset(str(path)).batch(256).map(
            lambda records: tf.io.parse_example(records, features))
        started, total = time.process_time(), 0
        for batch in ds:
            total += int(batch["int0"].shape[0])
        return total / (time.process_time() - started)

    return _repeat(run, repeats)


def parse_sequence_example(repeats: int) -> list[float]:
    """The file convoy's side wrote (workloads.parse_sequence_example_file), parsed by
    tf.io."""
    import tempfile
    from pathlib import Path

    import tensorflow as tf

    path = Path(tempfile.gettempdir()) / "convoy-bench" / "parse_sequence_example.tfrecord"
    if not path.exists():
        raise FileNotFoundError(f"{path}: run convoy's side of parse_sequence_example first")
    context = {"id": tf.io.FixedLenFeature([], tf.int64),
               "label": tf.io.FixedLenFeature([], tf.float32)}
    sequence = {"tokens": tf.io.FixedLenSequenceFeature([], tf.int64),
                "vectors": tf.io.FixedLenSequenceFeature([4], tf.float32),
                "words": tf.io.VarLenFeature(tf.string)}

    def run() -> float:
        ds = tf.data.TFRecordDataset(str(path)).batch(256).map(
            lambda records: tf.io.parse_sequence_example(records, context, sequence))
        return _rate(ds, lambda parsed: int(parsed[0]["id"].shape[0]))

    return _repeat(run, repeats)


WORKLOADS: dict[str, Callable[[int], list[float]]] = {
    "local_batch256": local_batch256,
    "repeat_then_batch": repeat_then_batch,
    "batch_then_repeat": batch_then_repeat,
    "repeat_batch_ratio": repeat_then_batch_ratio,
    "local_map_numpy_seq": local_map_numpy_seq,
    "local_map_numpy_par": local_map_numpy_par,
    "scalar_map": scalar_map,
    "batch256": batch256,
    "tensor4MiB": tensor4mib,
    "images_auto": images_auto,
    "dynamic_batch256": dynamic_batch256,
    "two_workers": two_workers,
    "cache_two_trainers": cache_two_trainers,
    "coordinated_2x2": coordinated_2x2,
    "coordinated_1x2": coordinated_1x2,
    "ps_embedding": ps_embedding,
    "ps_embedding_module": ps_embedding,  # the same model and step in TensorFlow
    "ps_embedding_tfstyle": ps_embedding_tfstyle,
    "parse_example": parse_example,
    "parse_example_cpu": parse_example_cpu,
    "parse_sequence_example": parse_sequence_example,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name", choices=sorted(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    exit_with_parent()  # and its servers with it
    try:
        print(json.dumps({"results": WORKLOADS[args.name](args.repeats)}), flush=True)
    except Exception as error:
        # the message, apart from TensorFlow's logs on stderr
        print(json.dumps({"error": f"{type(error).__name__}: {error}"[:2000]}), flush=True)
        raise


if __name__ == "__main__":
    main()
