"""How to run the data service's servers: the security settings both share and the
dispatcher's and the worker's configs (public as ``convoy.data.service.DispatcherConfig`` and
``WorkerConfig``). They import the security layer, so no state machine reads them: the shells
pass on what their wings need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convoy._base import check
from convoy._transport import rpc as _rpc
from convoy._transport.security import MAX_REQUEST_BYTES, Security
from convoy.errors import InvalidArgumentError

#: The dispatcher's default limits: registered datasets, jobs, bytes of one pickled dataset.
MAX_DATASETS = 10_000
MAX_JOBS = 100_000
#: WorkerConfig.max_buffered_bytes's default: 1 GiB across a worker's tasks.
MAX_BUFFERED_BYTES = 1 << 30
MAX_DATASET_BYTES = 128 * 2**20


def checked_worker_addresses(value: Any) -> tuple[str, ...] | None:
    """``DispatcherConfig.worker_addresses`` checked: None, or distinct ``host:port``
    addresses."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(
            f"worker_addresses must be a list of 'host:port' strings, got {value!r}")
    for entry in value:
        if not _is_address(entry):
            raise InvalidArgumentError(
                f"worker_addresses entries must be exact 'host:port' addresses, the address "
                f"each worker reports (WorkerConfig.worker_address, else localhost:<port>); "
                f"'%port%' placeholders and host-only entries are not resolved; got {entry!r}"
            )
    duplicates = sorted({entry for entry in value if value.count(entry) > 1})
    if duplicates:
        raise InvalidArgumentError(f"worker_addresses lists {duplicates} more than once")
    return tuple(value)


def _is_address(entry: Any) -> bool:
    if not isinstance(entry, str) or "%" in entry:
        return False
    try:
        _rpc.check_address(entry, "worker_addresses")
    except InvalidArgumentError:
        return False
    return True


def _port(value: Any, name: str = "port") -> int:
    port = check.integer(name, value, 0)
    if port > 65535:
        raise InvalidArgumentError(f"{name} must be <= 65535, got {port}")
    return port


def _milliseconds(name: str, value: Any, default: int) -> int:
    if value is None:
        return default
    return check.integer(name, value, -1 if name == "job_gc_timeout_ms" else 1)


@dataclass(frozen=True, kw_only=True)
class ServerSecurity:
    """Who may call a server, and where it listens (keyword-only fields of both configs).

    ``auth_token``: the cluster's shared secret (hidden from ``repr``); without it, the content
    of ``auth_token_file``, else ``$CONVOY_AUTH_TOKEN``. ``certificate``/``key``: PEM paths of
    the server's TLS identity, also shown by the clients it makes; ``ca``: PEM path of the CA
    of the other side (a server with one requires client certificates). ``host``: what the
    server binds and advertises (default loopback); a host other than loopback needs a secret
    unless ``insecure``. ``max_request_bytes``: the largest request it accepts.
    """

    auth_token: str | None = field(default=None, repr=False)
    auth_token_file: str | None = None
    certificate: str | None = None
    key: str | None = None
    ca: str | None = None
    host: str | None = None
    insecure: bool = False
    max_request_bytes: int = MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        check.boolean("insecure", self.insecure)
        check.integer("max_request_bytes", self.max_request_bytes, 1)
        self.security()  # every setting is checked now, by name

    def security(self) -> Security:
        """The settings of the server and of the clients it makes."""
        return Security.load(self.auth_token, self.auth_token_file,
                             certificate=self.certificate, key=self.key, ca=self.ca,
                             host=self.host, insecure=self.insecure,
                             max_request_bytes=self.max_request_bytes)


# Default timeouts, in milliseconds, ordered so that the failure promises hold: a consumer
# retries a task's worker (and the dispatcher) for its dispatcher_timeout_ms (default
# DEFAULT_CONSUMER_TIMEOUT_MS), longer than the dispatcher takes to declare a silent worker
# lost (WORKER_TIMEOUT plus two heartbeats), so it never gives up on a task the dispatcher is
# about to adopt; the dispatcher forgets a silent consumer (CLIENT_TIMEOUT) only after that
# consumer would have given up on it.
DEFAULT_WORKER_TIMEOUT_MS = 60_000  # TensorFlow's
DEFAULT_HEARTBEAT_INTERVAL_MS = 1_000  # TensorFlow's is 30 s: workers are found lost sooner
DEFAULT_CONSUMER_TIMEOUT_MS = 90_000
DEFAULT_CLIENT_TIMEOUT_MS = 300_000
DEFAULT_JOB_GC_TIMEOUT_MS = 300_000  # TensorFlow's
#: A worker keeps trying its dispatcher this long (TensorFlow's hour), logging as it waits.
DEFAULT_WORKER_DISPATCHER_TIMEOUT_MS = 3_600_000


@dataclass(frozen=True)
class DispatcherConfig(ServerSecurity):
    """How to run a dispatcher. Times are in milliseconds; None takes the default.

    ``max_datasets``, ``max_jobs``: how many it keeps at most (more are refused with
    RESOURCE_EXHAUSTED); ``max_dataset_bytes``: the largest pickled dataset it registers.
    The security fields are :class:`ServerSecurity`'s.
    """

    port: int = 0
    protocol: str | None = None
    work_dir: str | None = None
    fault_tolerant_mode: bool = False
    worker_addresses: tuple[str, ...] | None = None
    job_gc_check_interval_ms: int | None = None
    job_gc_timeout_ms: int | None = None
    client_timeout_ms: int | None = None
    worker_timeout_ms: int | None = None
    max_datasets: int = MAX_DATASETS
    max_jobs: int = MAX_JOBS
    max_dataset_bytes: int = MAX_DATASET_BYTES
    #: Serve /metrics, /healthz and /readyz on this port of ``host`` while it runs (None:
    #: not; 0: any free port).
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_datasets", "max_jobs", "max_dataset_bytes"):
            check.integer(name, getattr(self, name), 1)
        _port(self.port)
        if self.metrics_port is not None:
            _port(self.metrics_port, "metrics_port")
        if self.protocol not in (None, "grpc"):
            raise InvalidArgumentError(f"protocol must be 'grpc', got {self.protocol!r}")
        check.boolean("fault_tolerant_mode", self.fault_tolerant_mode)
        if self.fault_tolerant_mode and not self.work_dir:
            raise InvalidArgumentError(
                "Cannot enable fault tolerant mode without configuring a work_dir: the "
                "journal is written there"
            )
        object.__setattr__(self, "worker_addresses",
                           checked_worker_addresses(self.worker_addresses))
        for name in ("job_gc_check_interval_ms", "job_gc_timeout_ms", "client_timeout_ms",
                     "worker_timeout_ms"):
            _milliseconds(name, getattr(self, name), 0)

    @property
    def gc_check_interval_s(self) -> float:
        return _milliseconds("job_gc_check_interval_ms", self.job_gc_check_interval_ms,
                             10_000) / 1000

    @property
    def iteration_timeout_s(self) -> float | None:
        """How long an iteration may go without clients before it is forgotten (None:
        forever, from ``job_gc_timeout_ms=-1``)."""
        ms = _milliseconds("job_gc_timeout_ms", self.job_gc_timeout_ms,
                          DEFAULT_JOB_GC_TIMEOUT_MS)
        return None if ms == -1 else ms / 1000

    @property
    def client_timeout_s(self) -> float:
        return _milliseconds("client_timeout_ms", self.client_timeout_ms,
                            DEFAULT_CLIENT_TIMEOUT_MS) / 1000

    @property
    def worker_timeout_s(self) -> float:
        return _milliseconds("worker_timeout_ms", self.worker_timeout_ms,
                            DEFAULT_WORKER_TIMEOUT_MS) / 1000


@dataclass(frozen=True)
class WorkerConfig(ServerSecurity):
    """How to run a worker. Times are in milliseconds; None takes the default.

    ``worker_address``: what consumers use to reach it (say a DNS name behind a gateway; a
    ``%port%`` in it becomes the bound port), by default its ``host`` and port.
    ``cross_trainer_cache_size_bytes``: the bound of each task's cross-trainer cache (default
    10 GiB). ``max_buffered_bytes``: the bytes of elements the worker buffers across all its
    tasks before their producers wait for consumers (default 1 GiB; each task also buffers
    64 MiB at most). The security fields are :class:`ServerSecurity`'s; its dispatcher client uses
    them too.
    """

    dispatcher_address: str = ""
    worker_address: str | None = None
    port: int = 0
    protocol: str | None = None
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    data_transfer_protocol: str | None = None
    shutdown_quiet_period_ms: int = 0
    cross_trainer_cache_size_bytes: int | None = None
    #: As DispatcherConfig's: /metrics, /healthz and /readyz on this port while it runs.
    metrics_port: int | None = None
    max_buffered_bytes: int = MAX_BUFFERED_BYTES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.metrics_port is not None:
            _port(self.metrics_port, "metrics_port")
        check.optional_integer("cross_trainer_cache_size_bytes",
                               self.cross_trainer_cache_size_bytes, 1)
        check.integer("max_buffered_bytes", self.max_buffered_bytes, 1)
        if not self.dispatcher_address:
            raise InvalidArgumentError(
                "Must specify a `dispatcher_address` in the `config` passed to WorkerServer"
            )
        _, address = _rpc.parse_target(self.dispatcher_address, "dispatcher_address")
        object.__setattr__(self, "dispatcher_address", address)
        if self.worker_address is not None:
            check.string("worker_address", self.worker_address)
        _port(self.port)
        if self.protocol not in (None, "grpc"):
            raise InvalidArgumentError(f"protocol must be 'grpc', got {self.protocol!r}")
        if self.data_transfer_protocol not in (None, "grpc"):
            raise InvalidArgumentError(
                f"data_transfer_protocol must be 'grpc' or None, got "
                f"{self.data_transfer_protocol!r}"
            )
        _milliseconds("heartbeat_interval_ms", self.heartbeat_interval_ms, 0)
        _milliseconds("dispatcher_timeout_ms", self.dispatcher_timeout_ms, 0)

    @property
    def heartbeat_interval_s(self) -> float:
        return _milliseconds("heartbeat_interval_ms", self.heartbeat_interval_ms,
                            DEFAULT_HEARTBEAT_INTERVAL_MS) / 1000

    @property
    def dispatcher_timeout_s(self) -> float:
        return _milliseconds("dispatcher_timeout_ms", self.dispatcher_timeout_ms,
                             DEFAULT_WORKER_DISPATCHER_TIMEOUT_MS) / 1000
