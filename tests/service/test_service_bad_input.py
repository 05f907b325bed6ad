"""Every check the data service's public API makes: each raises a clear error naming the
argument, what was expected and what was received."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from convoy.data import Dataset
from convoy.data.service import (
    CrossTrainerCache,
    DispatcherConfig,
    DispatchServer,
    ShardingPolicy,
    WorkerConfig,
    WorkerServer,
    distribute,
    from_dataset_id,
    register_dataset,
)
from convoy.errors import InvalidArgumentError, NotFoundError
from convoy.testing import InProcessCluster

SERVICE = "grpc://localhost:5050"  # never contacted: argument checks come first


def read(**overrides: Any) -> None:
    """Call distribute with defaults overridden (checks run before any RPC)."""
    arguments: dict[str, Any] = {"processing_mode": "parallel_epochs", "service": SERVICE}
    arguments.update(overrides)
    distribute(**arguments)


def read_by_id(**overrides: Any) -> None:
    arguments: dict[str, Any] = {"processing_mode": "parallel_epochs", "service": SERVICE,
                                 "dataset_id": "1000"}
    arguments.update(overrides)
    from_dataset_id(**arguments)


READERS = [pytest.param(read, id="distribute"), pytest.param(read_by_id, id="from_dataset_id")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=1) as local:
        yield local


# ----- distribute and from_dataset_id ------------------------------------------------------------


@pytest.mark.parametrize("reader", READERS)
def test_empty_job_name(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="`job_name` must not be empty"):
        reader(job_name="")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("job_name, type_name", [(5, "int"), (b"job", "bytes"), (["j"], "list")])
def test_job_name_not_a_string(reader: Any, job_name: Any, type_name: str) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=f"`job_name` must be a string, but `job_name` was of type "
                             f"{type_name}"):
        reader(job_name=job_name)


@pytest.mark.parametrize("reader", READERS)
def test_consumer_index_without_num_consumers(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=r"Must either set both `consumer_index` and `num_consumers`, or "
                             r"neither; got consumer_index=0, num_consumers=None"):
        reader(job_name="j", consumer_index=0)


@pytest.mark.parametrize("reader", READERS)
def test_num_consumers_without_consumer_index(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=r"Must either set both .*; got consumer_index=None, "
                             r"num_consumers=2"):
        reader(job_name="j", num_consumers=2)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("consumer_index, num_consumers, message", [
    (2, 2, r"consumer_index must be in \[0, num_consumers=2\), got 2"),
    (7, 3, r"consumer_index must be in \[0, num_consumers=3\), got 7"),
    (-1, 2, r"consumer_index must be >= 0, got -1"),
    (0, 0, r"num_consumers must be >= 1, got 0"),
    (0, 1.5, r"num_consumers must be an integer, got 1.5 \(float\)"),
    ("0", 2, r"consumer_index must be an integer, got '0' \(str\)"),
])
def test_consumer_index_out_of_range(reader: Any, consumer_index: Any, num_consumers: Any,
                                     message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        reader(job_name="j", consumer_index=consumer_index, num_consumers=num_consumers)


@pytest.mark.parametrize("reader", READERS)
def test_num_consumers_without_job_name(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="`job_name` must be set when setting `num_consumers`. "
                             "num_consumers was set to 3."):
        reader(consumer_index=0, num_consumers=3)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("mode, shown", [("invalid", "'invalid'"), (7, "7"), (None, "None")])
def test_unknown_processing_mode(reader: Any, mode: Any, shown: str) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=r"processing_mode should be a convoy.data.service.ShardingPolicy, "
                             rf"\"parallel_epochs\" or \"distributed_epoch\". Got {shown}\."):
        reader(processing_mode=mode)


def test_processing_mode_spellings_are_accepted() -> None:
    for mode in ("parallel_epochs", "distributed_epoch", "off", "DYNAMIC", ShardingPolicy.OFF):
        read(processing_mode=mode)


@pytest.mark.parametrize("reader", READERS)
def test_service_with_unknown_protocol(reader: Any) -> None:
    with pytest.raises(NotFoundError,
                       match="`service` uses protocol 'grp'; the only protocol available is "
                             "'grpc'"):
        reader(service="grp://localhost:5000")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("service", ["localhost", "grpc://localhost", "localhost:0",
                                     "localhost:70000", "grpc://:5000", "grpc://local host:1"])
def test_service_without_a_valid_port(reader: Any, service: str) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=r"`service` must name a host and a port, like 'localhost:5050', "
                             r"got '"):
        reader(service=service)


@pytest.mark.parametrize("reader", READERS)
def test_empty_service(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="^`service` must not be empty$"):
        reader(service="")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("service, type_name", [(5050, "int"), (None, "NoneType"),
                                                (b"grpc://localhost:1", "bytes")])
def test_service_not_a_string(reader: Any, service: Any, type_name: str) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=f"`service` must be a string like 'grpc://host:port', but was of "
                             f"type {type_name}"):
        reader(service=service)


@pytest.mark.parametrize("reader", READERS)
def test_service_with_two_protocols(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="Malformed `service` string has multiple '://': "
                             "grpc://grpc://localhost:5000"):
        reader(service="grpc://grpc://localhost:5000")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("value, message", [
    (0, r"max_outstanding_requests must be >= 1 \(or one of \[-1\]\), got 0"),
    (-5, r"max_outstanding_requests must be >= 1 \(or one of \[-1\]\), got -5"),
    (2.5, r"max_outstanding_requests must be an integer, got 2.5 \(float\)"),
    (True, r"max_outstanding_requests must be an integer, got True \(bool\)"),
])
def test_max_outstanding_requests(reader: Any, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        reader(max_outstanding_requests=value)


def test_max_outstanding_requests_minus_one_means_default() -> None:
    read(max_outstanding_requests=-1)


@pytest.mark.parametrize("compression", ["foo", "snappy", 5])
def test_unknown_compression(compression: Any) -> None:
    message = (r"compression must be None, 'AUTO' or 'LZ4' \(case-insensitive\), got "
               + repr(compression))
    with pytest.raises(InvalidArgumentError, match=message):
        read(compression=compression)
    with pytest.raises(InvalidArgumentError, match=message):
        register_dataset(SERVICE, Dataset.range(3), compression=compression)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("target_workers", ["nope", 5, ""])
def test_unknown_target_workers(reader: Any, target_workers: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=rf"target_workers must be one of \['AUTO', 'ANY', 'LOCAL'\], got "
                             rf"{target_workers!r}"):
        reader(target_workers=target_workers)


@pytest.mark.parametrize("reader", READERS)
def test_unknown_data_transfer_protocol(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="data_transfer_protocol must be None, 'grpc' or 'local', got "
                             "'http'"):
        reader(data_transfer_protocol="http")


@pytest.mark.parametrize("reader", READERS)
def test_cross_trainer_cache_of_the_wrong_type(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="cross_trainer_cache must be a CrossTrainerCache or None, got str"):
        reader(job_name="j", cross_trainer_cache="trainer-1")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("value, message", [
    (0, r"dispatcher_timeout_ms must be >= 1, got 0"),
    ("10", r"dispatcher_timeout_ms must be an integer, got '10' \(str\)"),
])
def test_dispatcher_timeout(reader: Any, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        reader(dispatcher_timeout_ms=value)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("value, message", [
    (0, r"max_buffered_elements must be >= 1, got 0"),
    (-64, r"max_buffered_elements must be >= 1, got -64"),
    (2.5, r"max_buffered_elements must be an integer, got 2.5 \(float\)"),
    (True, r"max_buffered_elements must be an integer, got True \(bool\)"),
])
def test_max_buffered_elements(reader: Any, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        reader(job_name="j", max_buffered_elements=value)


@pytest.mark.parametrize("trainer_id", ["", None, 3])
def test_cross_trainer_cache_needs_a_trainer_id(trainer_id: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=rf"cross-trainer cache requires a non-empty trainer ID, got "
                             rf"{trainer_id!r}"):
        CrossTrainerCache(trainer_id)


@pytest.mark.parametrize("reader", READERS)
def test_cross_trainer_cache_needs_a_job_name(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching requires named jobs. Got empty `job_name`."):
        reader(cross_trainer_cache=CrossTrainerCache("t"))


@pytest.mark.parametrize("reader", READERS)
def test_cross_trainer_cache_refuses_coordinated_reads(reader: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching does not support coordinated reads."):
        reader(job_name="j", consumer_index=0, num_consumers=2,
               cross_trainer_cache=CrossTrainerCache("t"))


@pytest.mark.parametrize("value, message", [
    (0, r"cross_trainer_cache_size_bytes must be >= 1, got 0"),
    ("1", r"cross_trainer_cache_size_bytes must be an integer, got '1' \(str\)"),
])
def test_cross_trainer_cache_size(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        WorkerConfig(dispatcher_address="localhost:5050", cross_trainer_cache_size_bytes=value)


# ----- register_dataset and from_dataset_id ------------------------------------------------------


@pytest.mark.parametrize("dataset_id, message", [
    (5, r"dataset_id must be a string, got 5 \(int\)"),
    ("", r"dataset_id must be a non-empty string, got ''"),
])
def test_dataset_id_must_be_a_string(dataset_id: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        read_by_id(dataset_id=dataset_id)
    with pytest.raises(InvalidArgumentError, match=message):
        register_dataset(SERVICE, Dataset.range(3), dataset_id=dataset_id)


@pytest.mark.parametrize("dataset", [[1, 2, 3], None])
def test_register_something_that_is_not_a_dataset(dataset: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=f"dataset must be a convoy.data.Dataset, got "
                             f"{type(dataset).__name__}"):
        register_dataset(SERVICE, dataset)


@pytest.mark.timeout(30)
def test_unknown_dataset_id(cluster: InProcessCluster) -> None:
    with pytest.raises(NotFoundError, match="Dataset id 'UnregisteredID' not found"):
        from_dataset_id("parallel_epochs", cluster.target, "UnregisteredID")


@pytest.mark.timeout(30)
def test_same_dataset_id_for_another_dataset(cluster: InProcessCluster) -> None:
    assert register_dataset(cluster.target, Dataset.range(3), dataset_id="taken") == "taken"
    assert register_dataset(cluster.target, Dataset.range(3), dataset_id="taken") == "taken"
    with pytest.raises(InvalidArgumentError,
                       match="Datasets with the same ID should have the same structure: "
                             "dataset id 'taken'"):
        register_dataset(cluster.target, Dataset.range(4), dataset_id="taken")


@pytest.mark.timeout(30)
def test_named_job_reused_with_other_options(cluster: InProcessCluster) -> None:
    dataset = Dataset.range(10)
    first = dataset.apply(distribute("distributed_epoch", cluster.target, job_name="mismatch"))
    assert sorted(first) == list(range(10))
    second = dataset.apply(distribute("parallel_epochs", cluster.target, job_name="mismatch"))
    with pytest.raises(InvalidArgumentError,
                       match=r"Tried to create job with name 'mismatch', but found an existing "
                             r"job with different parameters: existing processing mode DYNAMIC"
                             r".*; got processing mode OFF"):
        list(second)


# ----- datasets that cannot be sent --------------------------------------------------------------


def _locked_identity() -> Any:
    guard = threading.Lock()

    def identity(x: Any) -> Any:
        with guard:
            return x

    return identity


def test_unpicklable_closure_is_named() -> None:
    dataset = Dataset.range(3).map(_locked_identity())
    with pytest.raises(InvalidArgumentError,
                       match=r"the dataset cannot be sent to the data service: Map "
                             r"transformation's 'fn' \(.*identity\) captures 'guard' = "
                             r"<unlocked _thread.lock .*, which cannot be pickled"):
        dataset.apply(distribute("parallel_epochs", SERVICE))
    with pytest.raises(InvalidArgumentError, match="captures 'guard'"):
        register_dataset(SERVICE, dataset)


def test_unpicklable_global_is_named() -> None:
    # a function of a script (pickled by value) that uses a global lock
    namespace: dict[str, Any] = {"__name__": "a_script_not_importable", "threading": threading}
    exec("LOCK = threading.Lock()\n"
         "def locked(x):\n"
         "    with LOCK:\n"
         "        return x\n", namespace)
    dataset = Dataset.range(3).filter(lambda x: x > 0).map(namespace["locked"])
    with pytest.raises(InvalidArgumentError,
                       match=r"Map transformation's 'fn' \(locked\) captures 'LOCK' = "
                             r"<unlocked _thread.lock .*, which cannot be pickled"):
        dataset.apply(distribute("parallel_epochs", SERVICE))


def test_unpicklable_upstream_is_found_first() -> None:
    dataset = Dataset.range(3).map(_locked_identity()).map(lambda x: x + 1)
    with pytest.raises(InvalidArgumentError, match="captures 'guard'"):
        dataset.apply(distribute("parallel_epochs", SERVICE))


# ----- server configs ----------------------------------------------------------------------------


@pytest.mark.parametrize("address", [None, ""])
def test_worker_config_without_dispatcher_address(address: Any) -> None:
    with pytest.raises(InvalidArgumentError,
                       match="Must specify a `dispatcher_address` in the `config` passed to "
                             "WorkerServer"):
        WorkerConfig(dispatcher_address=address)
    with pytest.raises(InvalidArgumentError, match="Must specify a `dispatcher_address`"):
        WorkerConfig()


@pytest.mark.parametrize("address, error, message", [
    ("localhost", InvalidArgumentError,
     r"`dispatcher_address` must name a host and a port, like 'localhost:5050', got "
     r"'localhost'"),
    (5050, InvalidArgumentError,
     r"`dispatcher_address` must be a string like 'grpc://host:port', but was of type int"),
    ("grp://localhost:5050", NotFoundError, r"`dispatcher_address` uses protocol 'grp'"),
    ("grpc://grpc://localhost:5050", InvalidArgumentError,
     r"Malformed `dispatcher_address` string has multiple '://'"),
])
def test_worker_config_with_a_bad_dispatcher_address(address: Any, error: type[Exception],
                                                     message: str) -> None:
    with pytest.raises(error, match=message):
        WorkerConfig(dispatcher_address=address)


@pytest.mark.parametrize("address", ["localhost:5050", "grpc://localhost:5050"])
def test_worker_config_dispatcher_address_forms(address: str) -> None:
    assert WorkerConfig(dispatcher_address=address).dispatcher_address == "localhost:5050"


@pytest.mark.parametrize("overrides, message", [
    ({"port": -1}, r"port must be >= 0, got -1"),
    ({"port": 70000}, r"port must be <= 65535, got 70000"),
    ({"port": "80"}, r"port must be an integer, got '80' \(str\)"),
    ({"protocol": "http"}, r"protocol must be 'grpc', got 'http'"),
    ({"data_transfer_protocol": "http"},
     r"data_transfer_protocol must be 'grpc' or None, got 'http'"),
    ({"heartbeat_interval_ms": 0}, r"heartbeat_interval_ms must be >= 1, got 0"),
    ({"dispatcher_timeout_ms": -3}, r"dispatcher_timeout_ms must be >= 1, got -3"),
    ({"worker_address": 7}, r"worker_address must be a string, got 7 \(int\)"),
])
def test_worker_config_values(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        WorkerConfig(dispatcher_address="localhost:5050", **overrides)


def test_dispatcher_config_fault_tolerance_needs_a_work_dir() -> None:
    with pytest.raises(InvalidArgumentError,
                       match="Cannot enable fault tolerant mode without configuring a "
                             "work_dir"):
        DispatcherConfig(fault_tolerant_mode=True)


@pytest.mark.parametrize("overrides, message", [
    ({"port": -1}, r"port must be >= 0, got -1"),
    ({"port": 65536}, r"port must be <= 65535, got 65536"),
    ({"port": 1.5}, r"port must be an integer, got 1.5 \(float\)"),
    ({"protocol": "grp"}, r"protocol must be 'grpc', got 'grp'"),
    ({"fault_tolerant_mode": "yes"}, r"fault_tolerant_mode must be True or False, got 'yes'"),
    ({"client_timeout_ms": 0}, r"client_timeout_ms must be >= 1, got 0"),
    ({"worker_timeout_ms": -10}, r"worker_timeout_ms must be >= 1, got -10"),
    ({"job_gc_check_interval_ms": 0}, r"job_gc_check_interval_ms must be >= 1, got 0"),
    ({"job_gc_timeout_ms": -2}, r"job_gc_timeout_ms must be >= -1, got -2"),
    ({"worker_addresses": "localhost:1"}, r"worker_addresses must be a list of 'host:port' "
                                          r"strings, got 'localhost:1'"),
    ({"worker_addresses": ["localhost:%port%"]},
     r"entries must be exact 'host:port' addresses.*got 'localhost:%port%'"),
    ({"worker_addresses": ["localhost"]}, r"exact 'host:port' addresses.*got 'localhost'"),
    ({"worker_addresses": ["localhost:worker"]}, r"got 'localhost:worker'"),
    ({"worker_addresses": [5050]}, r"got 5050"),
    ({"worker_addresses": ["a:1", "b:2", "a:1"]}, r"worker_addresses lists \['a:1'\] more than "
                                                  r"once"),
])
def test_dispatcher_config_values(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        DispatcherConfig(**overrides)


def test_a_worker_list_becomes_a_tuple() -> None:
    assert DispatcherConfig(worker_addresses=["a:1", "[::1]:2"]).worker_addresses == (
        "a:1", "[::1]:2")
    assert DispatcherConfig().worker_addresses is None


def test_file_sharding_needs_files_at_distribute() -> None:
    with pytest.raises(InvalidArgumentError,
                       match="FILE sharding found no files to shard: `range` is not a source "
                             "of files"):
        Dataset.range(5).map(lambda x: x).apply(distribute(processing_mode="FILE",
                                                           service=SERVICE))


def test_shard_hint_is_a_placeholder_for_both_arguments() -> None:
    from convoy.data import SHARD_HINT
    with pytest.raises(InvalidArgumentError, match="num_shards must be >= 1, got -1"):
        Dataset.range(5).shard(SHARD_HINT, 0)
    placeholder = Dataset.range(5).shard(SHARD_HINT, SHARD_HINT)
    with pytest.raises(InvalidArgumentError, match="only the data service's HINT sharding "
                                                   "policy runs it"):
        list(placeholder)


def test_servers_need_their_config_type() -> None:
    with pytest.raises(InvalidArgumentError, match="config must be a DispatcherConfig, got dict"):
        DispatchServer({"port": 0}, start=False)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="config must be a WorkerConfig, got str"):
        WorkerServer("localhost:5050", start=False)  # type: ignore[arg-type]
