"""The code examples of the tf.data service module docstring (seed 000) and of the
``tf.data.experimental.service.distribute`` API page (seed 001), ported to convoy
(``tf.data.experimental.service`` -> ``cv.data.service``, ``tf.data`` -> ``cv.data``), with the
documented output asserted.

Outputs whose order depends on timing are compared as multisets (sorted lists); where the
documents print one possible split between consumers, the test asserts what is guaranteed:
every element exactly once in total. Examples that need a feature this version refuses on
purpose assert the UnimplementedError it raises. Servers bind port 0 (free ports) throughout.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError
from convoy.testing import InProcessCluster, TrainingCluster, free_port, free_ports

# Dataset functions defined here also run in other processes, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service


@pytest.fixture
def cluster1() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=1) as local:
        yield local


@pytest.fixture
def cluster2() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=2) as local:
        yield local


def in_threads(*readers: Callable[[], Any]) -> list[Any]:
    """Run the readers concurrently (like separate trainer processes); their results in order."""
    results: list[Any] = [None] * len(readers)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = readers[index]()
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(readers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a reader hung"
    if errors:
        raise errors[0]
    return results


def ints(dataset: Any) -> list[int]:
    return [int(x) for x in dataset]


# ===== seed 000: the tf.data service module docstring ===========================================

def test_module_docstring_doctest():
    dispatcher = cv.data.service.DispatchServer()
    dispatcher_address = dispatcher.target.split("://")[1]
    worker = cv.data.service.WorkerServer(
        cv.data.service.WorkerConfig(
            dispatcher_address=dispatcher_address))
    try:
        dataset = cv.data.Dataset.range(10)
        dataset = dataset.apply(cv.data.service.distribute(
            processing_mode=cv.data.service.ShardingPolicy.OFF,
            service=dispatcher.target))
        # One worker: the order is the worker's, as printed (also over many batches).
        assert list(dataset.as_numpy_iterator()) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        many = cv.data.Dataset.range(50_000).apply(cv.data.service.distribute(
            processing_mode=cv.data.service.ShardingPolicy.OFF, service=dispatcher.target))
        assert ints(many) == list(range(50_000))
    finally:
        worker.stop()
        dispatcher.stop()


def test_distribute_example_shared_job_then_prefetch(cluster2):
    # Every trainer builds the same pipeline with job_name="shared_job"; they share one job.
    def trainer() -> list[int]:
        dataset = cv.data.Dataset.range(20)  # Define your dataset here.
        dataset = dataset.apply(
            cv.data.service.distribute(
                processing_mode=cv.data.service.ShardingPolicy.OFF,
                service=cluster2.target,
                job_name="shared_job"))
        # Any transformations added after `distribute` will be run on the local machine.
        dataset = dataset.prefetch(1)
        return ints(dataset)

    first, second = in_threads(trainer, trainer)
    # OFF: each of the 2 workers produces the whole dataset once; the job is split between
    # the trainers first come first served, so together they see each element twice.
    assert sorted(first + second) == sorted(list(range(20)) * 2)


def test_register_dataset_and_from_dataset_id_example(cluster1):
    workers = ["trainer-0", "trainer-1", "trainer-2"]
    dataset = cv.data.Dataset.range(30)  # Define your dataset here.
    dataset_id = cv.data.service.register_dataset(
        service=cluster1.target,
        dataset=dataset)
    # Use `from_dataset_id` to create per-worker datasets.
    per_worker_datasets = {}
    for worker in workers:
        per_worker_datasets[worker] = cv.data.service.from_dataset_id(
            processing_mode=cv.data.service.ShardingPolicy.OFF,
            service=cluster1.target,
            dataset_id=dataset_id,
            job_name="shared_job")

    outputs = in_threads(*(lambda w=w: ints(per_worker_datasets[w]) for w in workers))
    # One data service worker, one shared job: each element reaches exactly one trainer.
    assert sorted(sum(outputs, [])) == list(range(30))
    for worker in workers:  # the element spec comes from the registration
        assert per_worker_datasets[worker].element_spec == dataset.element_spec


@pytest.mark.parametrize("legacy, policy", [("parallel_epochs", service.ShardingPolicy.OFF),
                                            ("distributed_epoch",
                                             service.ShardingPolicy.DYNAMIC)])
def test_processing_mode_strings_equal_policies(cluster2, legacy, policy):
    # "processing_mode may also be set to the strings "parallel_epochs" or
    # "distributed_epoch", which are respectively equivalent to OFF and DYNAMIC."
    def read(mode: Any) -> list[int]:
        return sorted(ints(cv.data.Dataset.range(12).apply(
            service.distribute(processing_mode=mode, service=cluster2.target))))

    assert read(legacy) == read(policy)


def write_files(directory: Any, count: int, records: int) -> list[str]:
    """``count`` TFRecord files of ``records`` records "<file>-<record>"; their paths."""
    filenames = []
    for f in range(count):
        path = str(directory / f"part-{f}.tfrecord")
        with cv.data.TFRecordWriter(path) as writer:
            for r in range(records):
                writer.write(f"{f}-{r}".encode())
        filenames.append(path)
    return filenames


def test_dynamic_sharding_example(cluster2, tmp_path):
    filenames = write_files(tmp_path, 6, 7)
    batch_size = 4

    def preprocess_fn(record: bytes) -> bytes:
        return record.upper()

    dataset = cv.data.Dataset.from_tensor_slices(filenames)
    dataset = dataset.interleave(cv.data.TFRecordDataset)
    dataset = dataset.map(preprocess_fn)
    dataset = dataset.batch(batch_size)
    dataset = dataset.apply(
        cv.data.service.distribute(
            processing_mode=cv.data.service.ShardingPolicy.DYNAMIC,
            service=cluster2.target))

    batches = list(dataset.as_numpy_iterator())
    # The dispatcher hands out the file names; every record is visited exactly once.
    records = sorted(bytes(r) for batch in batches for r in batch)
    assert records == sorted(f"{f}-{r}".upper().encode() for f in range(6) for r in range(7))
    assert all(1 <= len(batch) <= batch_size for batch in batches)


@pytest.mark.parametrize("policy, copies", [(service.ShardingPolicy.OFF, 2),
                                            (service.ShardingPolicy.DYNAMIC, 1)])
def test_jobs_section_range5(cluster2, policy, copies):
    # "if a job is created for Dataset.range(5) and the processing mode is OFF, each worker
    # produces {0, 1, 2, 3, 4} ... 5 * num_workers elements. If DYNAMIC, only 5 elements."
    dataset = cv.data.Dataset.range(5).apply(
        service.distribute(processing_mode=policy, service=cluster2.target))
    assert sorted(ints(dataset)) == sorted(list(range(5)) * copies)


@pytest.fixture
def listed2() -> Iterator[InProcessCluster]:
    """Two workers on a fixed list in the DispatcherConfig, as static sharding requires."""
    ports = free_ports(2)
    config = service.DispatcherConfig(worker_addresses=[f"localhost:{p}" for p in ports])
    with InProcessCluster(num_workers=0, dispatcher_config=config) as local:
        for port in ports:
            local.add_worker(port)
        yield local


@pytest.mark.parametrize("policy", [service.ShardingPolicy.FILE, service.ShardingPolicy.DATA,
                                    service.ShardingPolicy.FILE_OR_DATA,
                                    service.ShardingPolicy.HINT])
def test_static_sharding_section(listed2, tmp_path, policy):
    # "FILE: Shards by input files (i.e. each worker will get a fixed set of files to
    # process)." "DATA: Shards by elements produced by the dataset." "HINT: Looks for the
    # presence of `shard(SHARD_HINT, ...)` which is treated as a placeholder to replace with
    # `shard(num_workers, worker_index)`." Between them the workers produce every record once.
    filenames = write_files(tmp_path, 4, 5)
    dataset = cv.data.Dataset.from_tensor_slices(filenames)
    dataset = dataset.interleave(cv.data.TFRecordDataset)
    if policy is service.ShardingPolicy.HINT:
        dataset = dataset.shard(cv.data.SHARD_HINT, cv.data.SHARD_HINT)
    dataset = dataset.apply(
        cv.data.service.distribute(processing_mode=policy, service=listed2.target))
    records = sorted(bytes(r) for r in dataset.as_numpy_iterator())
    assert records == sorted(f"{f}-{r}".encode() for f in range(4) for r in range(5))


def test_static_sharding_needs_a_fixed_list_of_workers(cluster1):
    # "These policies require: The tf.data service cluster is configured with a fixed list
    # of workers in DispatcherConfig."
    dataset = cv.data.Dataset.range(8).apply(service.distribute(
        processing_mode=service.ShardingPolicy.DATA, service=cluster1.target))
    with pytest.raises(InvalidArgumentError, match="DispatcherConfig.worker_addresses"):
        list(dataset)


def test_file_sharding_with_fewer_files_than_workers(listed2, tmp_path):
    # "If there are fewer input files than workers, a runtime error will be raised."
    dataset = cv.data.TFRecordDataset(write_files(tmp_path, 1, 3)).apply(service.distribute(
        processing_mode=service.ShardingPolicy.FILE, service=listed2.target))
    with pytest.raises(InvalidArgumentError, match="1 files, not enough for the required 2 "
                                                   "shards/workers"):
        list(dataset)


def test_fault_tolerance_setup(tmp_path):
    work_dir = str(tmp_path / "work_dir")
    # "Dispatcher fault tolerance requires work_dir to be configured."
    with pytest.raises(InvalidArgumentError, match="work_dir"):
        service.DispatcherConfig(fault_tolerant_mode=True)

    config = service.DispatcherConfig(port=0, work_dir=work_dir, fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    dataset_id = service.register_dataset(dispatcher.target, cv.data.Dataset.range(6))
    dispatcher.stop()
    # "the dispatcher will journal its state to the work directory so that no state is
    # lost when the dispatcher is restarted."
    assert os.listdir(work_dir)
    dispatcher = service.DispatchServer(config)
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher.target.split("://")[1]))
    try:
        dataset = service.from_dataset_id(service.ShardingPolicy.OFF, dispatcher.target,
                                          dataset_id)
        assert ints(dataset) == list(range(6))
    finally:
        worker.stop()
        dispatcher.stop()


# ----- "Usage with tf.distribute": ParameterServerStrategy with a coordinator -----------------
# convoy's strategy is ParameterServerStrategy, so the dataset functions of the three examples
# run inside create_per_worker_dataset on real worker processes, as for TF's PSStrategy.

@pytest.fixture(scope="module")
def training():
    with TrainingCluster(num_workers=2, num_ps=1) as training_cluster:
        strategy = cv.distribute.experimental.ParameterServerStrategy(
            cluster_resolver=training_cluster.resolver())
        coordinator = cv.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        try:
            yield strategy, coordinator
        finally:
            coordinator.shutdown()


def drain(iterator: Any) -> tuple[int, list[int]]:
    return os.getpid(), [int(x) for x in iterator]


def read_on_every_worker(coordinator: Any, per_worker_dataset: Any) -> list[int]:
    """Drain the per-worker iterators of every training worker: a worker's reader may hold
    elements of the shared job that only a function running on that worker can see."""
    per_worker_iterator = iter(per_worker_dataset)
    elements: list[int] = []
    workers: set[int] = set()
    for _ in range(100):  # the coordinator picks the worker; go on until both have run one
        pid, part = coordinator.schedule(drain, args=(per_worker_iterator,)).fetch()
        workers.add(pid)
        elements += part
        if len(workers) == 2:
            return sorted(elements)
    raise AssertionError("the coordinator never ran a function on the second worker")


@pytest.mark.timeout(120)
def test_strategy_experimental_distribute_dataset_example(training, cluster1):
    strategy, coordinator = training
    dataset = cv.data.Dataset.range(40)  # Define your dataset here.
    target = cluster1.target  # the functions below run on the workers
    dataset_id = cv.data.service.register_dataset(
        service=target,
        dataset=dataset)

    def per_worker_dataset_fn():
        dataset = cv.data.service.from_dataset_id(
            processing_mode=cv.data.service.ShardingPolicy.OFF,
            service=target,
            dataset_id=dataset_id,
            job_name="shared_job")
        return strategy.experimental_distribute_dataset(dataset)

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    # Both training workers consume one job: each element once in total.
    assert read_on_every_worker(coordinator, per_worker_dataset) == list(range(40))


@pytest.mark.timeout(120)
def test_strategy_distribute_datasets_from_function_example(training, cluster1):
    strategy, coordinator = training
    dataset = cv.data.Dataset.range(40).map(lambda x: x * 3)  # dataset_fn()
    target = cluster1.target  # the functions below run on the workers
    dataset_id = cv.data.service.register_dataset(
        service=target,
        dataset=dataset)

    def new_dataset_fn(input_context):
        del input_context
        return cv.data.service.from_dataset_id(
            processing_mode=cv.data.service.ShardingPolicy.OFF,
            service=target,
            dataset_id=dataset_id,
            job_name="shared_job")

    per_worker_dataset = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(new_dataset_fn))
    assert read_on_every_worker(coordinator, per_worker_dataset) == [x * 3 for x in range(40)]


@pytest.mark.timeout(120)
def test_coordinator_create_per_worker_dataset_example(training, cluster1):
    _, coordinator = training
    dataset = cv.data.Dataset.range(40).map(lambda x: x + 1000)  # dataset_fn()
    target = cluster1.target  # the functions below run on the workers
    dataset_id = cv.data.service.register_dataset(
        service=target,
        dataset=dataset)

    def new_dataset_fn(input_context=None):
        # The seed's function takes input_context; create_per_worker_dataset calls
        # dataset_fn() without arguments (as TensorFlow's does), hence the default.
        del input_context
        return cv.data.service.from_dataset_id(
            processing_mode=cv.data.service.ShardingPolicy.OFF,
            service=target,
            dataset_id=dataset_id,
            job_name="shared_job")

    per_worker_dataset = coordinator.create_per_worker_dataset(new_dataset_fn)
    assert read_on_every_worker(coordinator, per_worker_dataset) == [x + 1000 for x in
                                                                      range(40)]


def test_cross_trainer_cache_example(cluster1):
    def trainer_id() -> str:
        return "trainer-0"

    def expensive_computation() -> cv.data.Dataset:
        return cv.data.Dataset.range(10).repeat()  # endless, as the cache requires

    dataset = expensive_computation()
    dataset = dataset.apply(cv.data.service.distribute(
        processing_mode=cv.data.service.ShardingPolicy.OFF,
        service=cluster1.target,
        job_name="job",
        cross_trainer_cache=cv.data.service.CrossTrainerCache(
            trainer_id=trainer_id())))
    first = [int(x) for x in dataset.take(25)]
    # another trainer (another id) reuses what the first one's reading produced
    other = cv.data.Dataset.range(10).repeat().apply(cv.data.service.distribute(
        processing_mode=cv.data.service.ShardingPolicy.OFF, service=cluster1.target,
        job_name="job", cross_trainer_cache=cv.data.service.CrossTrainerCache("trainer-1")))
    assert [int(x) for x in other.take(25)] == first == [x % 10 for x in range(25)]


# ===== seed 001: the distribute() API page =====================================================

def test_parallel_epochs_two_workers():
    dispatcher = cv.data.service.DispatchServer()
    dispatcher_address = dispatcher.target.split("://")[1]
    # Start two workers
    workers = [
        cv.data.service.WorkerServer(
            cv.data.service.WorkerConfig(
                dispatcher_address=dispatcher_address)) for _ in range(2)
    ]
    try:
        dataset = cv.data.Dataset.range(10)
        dataset = dataset.apply(cv.data.service.distribute(
            processing_mode="parallel_epochs", service=dispatcher.target))
        assert sorted(list(dataset.as_numpy_iterator())) == [
            0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_distributed_epoch_two_workers():
    dispatcher = cv.data.service.DispatchServer()
    dispatcher_address = dispatcher.target.split("://")[1]
    workers = [
        cv.data.service.WorkerServer(
            cv.data.service.WorkerConfig(
                dispatcher_address=dispatcher_address)) for _ in range(2)
    ]
    try:
        dataset = cv.data.Dataset.range(10)
        dataset = dataset.apply(cv.data.service.distribute(
            processing_mode="distributed_epoch", service=dispatcher.target))
        assert sorted(list(dataset.as_numpy_iterator())) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_map_before_distribute_runs_on_workers_after_runs_locally():
    dispatcher = cv.data.service.DispatchServer()
    dispatcher_address = dispatcher.target.split("://")[1]
    workers = [
        cv.data.service.WorkerServer(
            cv.data.service.WorkerConfig(
                dispatcher_address=dispatcher_address)) for _ in range(2)
    ]
    try:
        dataset = cv.data.Dataset.range(5)
        dataset = dataset.map(lambda x: x * x)
        dataset = dataset.apply(
            cv.data.service.distribute("parallel_epochs",
                                       dispatcher.target))
        dataset = dataset.map(lambda x: x + 1)
        assert sorted(list(dataset.as_numpy_iterator())) == [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]

        # Where each part runs: the prefix on the workers' task threads; the suffix here, so
        # it may use what cannot be sent to a worker (a lock does not pickle).
        lock = threading.Lock()

        def where(x: Any) -> tuple[Any, str]:
            return x, threading.current_thread().name

        def local(x: Any, remote: str) -> tuple[str, str]:
            with lock:
                return remote, threading.current_thread().name

        dataset = cv.data.Dataset.range(5).map(where).apply(
            cv.data.service.distribute("parallel_epochs", dispatcher.target)).map(local)
        places = set(dataset.as_numpy_iterator())
        assert {remote.startswith("convoy-task-") for remote, _ in places} == {True}
        assert {here for _, here in places} == {threading.current_thread().name}
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_servers_bind_free_ports_or_the_given_port():
    # "The dispatcher and workers will bind to usable free ports (chosen at random) ...
    # to bind them to specific ports, pass the port argument."
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher.target.split("://")[1], port=0))
    port = free_port()
    fixed = service.DispatchServer(service.DispatcherConfig(port=port))
    try:
        # Unlike TensorFlow's, which bind every interface, they bind (and name) loopback.
        assert dispatcher.target.startswith("grpc://127.0.0.1:")
        assert int(dispatcher.target.rsplit(":", 1)[1]) > 0
        assert fixed.target == f"grpc://127.0.0.1:{port}"
        dataset = cv.data.Dataset.range(3).apply(
            service.distribute("parallel_epochs", dispatcher.target))
        assert ints(dataset) == [0, 1, 2]
    finally:
        fixed.stop()
        worker.stop()
        dispatcher.stop()


def test_job_name_two_trainers_three_iterations(cluster1):
    # Two training workers iterate three times over a dataset shared by job_name; one
    # tf.data worker. (The seed's dispatcher is at localhost:5000; here on a free port.)
    def training_worker() -> list[list[int]]:
        range5_dataset = cv.data.Dataset.range(5)
        dataset = range5_dataset.apply(cv.data.service.distribute(
            "parallel_epochs", cluster1.target, job_name="my_job_name"))
        return [ints(dataset) for iteration in range(3)]

    process_1, process_2 = in_threads(training_worker, training_worker)
    # One possible outcome is [0, 2, 4] / [1, 3], ...: the split is first come first served,
    # but every iteration (a new job per repetition) is consumed exactly once in total.
    for iteration in range(3):
        assert sorted(process_1[iteration] + process_2[iteration]) == [0, 1, 2, 3, 4]


def test_job_name_reused_after_end_of_input(cluster1):
    # "a training job calls distribute with job_name="job" and reads until end of input. If
    # another independent job connects ... and tries to read from job_name="job", it will
    # immediately receive end of input, without getting any data."
    def job() -> Any:
        return cv.data.Dataset.range(8).apply(cv.data.service.distribute(
            "parallel_epochs", cluster1.target, job_name="job"))

    assert ints(job()) == list(range(8))
    assert ints(job()) == []


def test_coordinated_data_read(cluster2):
    # "define a dataset which generates rounds of `num_consumers` consecutive similar-sized
    # batches, then enable coordinated reads by setting `consumer_index` and `num_consumers`";
    # "coordinated reads require that the dataset have infinite cardinality ... `.repeat()`"
    num_consumers = 2
    sizes = cv.data.Dataset.from_tensor_slices([3, 5, 2, 7]).repeat()  # a size per round
    dataset = sizes.flat_map(lambda size: cv.data.Dataset.from_tensors(
        np.zeros(int(size), np.float32)).repeat(num_consumers)).repeat()
    replicas = [iter(dataset.apply(cv.data.service.distribute(
        "parallel_epochs", cluster2.target, job_name="coordinated",
        consumer_index=consumer_index, num_consumers=num_consumers)))
        for consumer_index in range(num_consumers)]
    for _ in range(600):  # each step: every replica gets a batch of the same size
        assert len({len(next(replica)) for replica in replicas}) == 1
    finite = cv.data.Dataset.range(8).apply(cv.data.service.distribute(
        "parallel_epochs", cluster2.target, job_name="finite", consumer_index=0,
        num_consumers=1))
    with pytest.raises(cv.errors.FailedPreconditionError, match=r"add.*\.repeat\(\)"):
        next(iter(finite))


def test_target_workers_local(cluster1):
    # "LOCAL" reads only the workers beside the consumer (here: on its host), which "helps
    # avoid RPC and data copies" when they are co-located
    dataset = cv.data.Dataset.range(4).apply(cv.data.service.distribute(
        "parallel_epochs", cluster1.target, target_workers="LOCAL"))
    assert ints(dataset) == list(range(4))


def test_other_distribute_arguments(cluster2):
    # The signature's remaining arguments, with the values the page describes.
    dataset = cv.data.Dataset.range(50).apply(cv.data.service.distribute(
        processing_mode="distributed_epoch", service=cluster2.target, job_name=None,
        max_outstanding_requests=1,
        data_transfer_protocol="grpc", compression=None, target_workers="ANY"))
    assert sorted(ints(dataset)) == list(range(50))
    compressed = cv.data.Dataset.range(50).apply(cv.data.service.distribute(
        "distributed_epoch", cluster2.target, compression="AUTO", target_workers="AUTO"))
    assert sorted(ints(compressed)) == list(range(50))
    # "If it is a tuple, it should be (protocol, address)."
    as_tuple = cv.data.Dataset.range(50).apply(cv.data.service.distribute(
        "distributed_epoch", ("grpc", cluster2.address)))
    assert sorted(ints(as_tuple)) == list(range(50))
