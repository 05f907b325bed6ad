"""What a convoy process tells its operator: Prometheus metrics and health probes over HTTP.

Every metric is defined here, each name prefixed ``convoy_``; the servers and clients update
them whether or not anything serves them. A process exports the families common to all
(process, build, RPCs, refused calls) and those of the roles it takes (:func:`export`: a
dispatcher shows no parameter-server families), all in :data:`REGISTRY`.
:func:`serve` starts an HTTP server (off unless called: the ``convoy`` command calls it for
``--metrics-port``) answering

- ``/metrics``: the metrics, in Prometheus's text format (OpenMetrics if asked for);
- ``/healthz``: 200 while the process runs (a liveness probe);
- ``/readyz``: 200 when every check of :func:`add_readiness_check` passes, else 503 with one
  short line per failing check (a readiness probe).

None of them is authenticated, so none carries data: counts, sizes and times only.
"""

from __future__ import annotations

import dataclasses
import errno
import http.server
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from convoy import errors
from convoy._base import threads as _threads
from convoy._version import __version__

__all__ = [
    "BUFFERED_BYTES",
    "BYTES_PRODUCED",
    "BYTES_SERVED",
    "CONSUMER_WAIT_SECONDS",
    "COORDINATOR_FUNCTIONS_DONE",
    "COORDINATOR_FUNCTIONS_FAILED",
    "COORDINATOR_FUNCTIONS_QUEUED",
    "COORDINATOR_FUNCTIONS_RUNNING",
    "ELEMENTS_PRODUCED",
    "ELEMENTS_SERVED",
    "HEARTBEATS",
    "MAX_BUFFERED_BYTES",
    "PS_BYTES",
    "PS_EMBEDDING_EVICTIONS",
    "PS_EMBEDDING_ROWS",
    "PS_OPERATIONS",
    "REFUSED_CALLS",
    "REGISTRY",
    "ROLES",
    "RPC_SECONDS",
    "MetricsServer",
    "add_readiness_check",
    "export",
    "readiness",
    "remove_readiness_check",
    "serve",
]

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=Collector)

#: The registry of every convoy metric this process exports (not prometheus_client's default
#: one, so that a scrape carries convoy's names only). Families common to every process are in
#: it from the start; those of a role join it when the process takes that role (:func:`export`).
REGISTRY = CollectorRegistry(auto_describe=True)

_NS = "convoy"
#: From a millisecond to a minute: element waits and RPCs span that range.
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)

#: The roles a process takes, and the families each exports: ``dispatcher`` and ``worker``
#: (the data service's), ``consumer`` (reads from the data service), ``ps`` (a parameter
#: server) and ``coordinator`` (schedules training functions).
ROLES: dict[str, list[Collector]] = {role: [] for role in
                                     ("dispatcher", "worker", "consumer", "ps", "coordinator")}
_exported: set[int] = set()
_export_lock = threading.Lock()


def _of(*roles: str) -> Callable[[_M], _M]:
    """Files a family under ``roles`` (exported once the process takes one of them)."""
    def file(metric: _M) -> _M:
        for role in roles:
            ROLES[role].append(metric)
        return metric
    return file


def export(role: str) -> None:
    """Add the families of ``role`` (one of :data:`ROLES`) to :data:`REGISTRY`: a process
    exports those of the roles it takes only (idempotent)."""
    if role not in ROLES:
        raise errors.InvalidArgumentError(f"`role` must be one of {sorted(ROLES)}, got {role!r}")
    with _export_lock:
        for family in ROLES[role]:
            if id(family) not in _exported:
                _exported.add(id(family))
                REGISTRY.register(family)


ProcessCollector(namespace=_NS, registry=REGISTRY)  # convoy_process_cpu_seconds_total, ...
_BUILD = Info("build", "convoy's version", namespace=_NS, registry=REGISTRY)

# -- every server ----------------------------------------------------------------------------
RPC_SECONDS = Histogram(
    "rpc_duration_seconds", "Time a server took to answer each call (each message of a "
    "stream), by service, method and status code (OK, UNAVAILABLE, ...)",
    ["service", "method", "code"], namespace=_NS, buckets=_SECONDS_BUCKETS, registry=REGISTRY)
REFUSED_CALLS = Counter(
    "refused_calls", "Calls a server refused before reading them, by reason: missing (not "
    "signed: the caller has no secret), wrong (another secret), stale (clocks apart), "
    "malformed or replayed", ["reason"], namespace=_NS, registry=REGISTRY)

def timer(service: str, method: str) -> Callable[[str], Histogram]:
    """The :data:`RPC_SECONDS` series of ``service``'s ``method`` by status code name, each
    made once (a call's lookup costs a dict get)."""
    series: dict[str, Histogram] = {}

    def of(code: str) -> Histogram:
        found = series.get(code)
        if found is None:
            found = series.setdefault(code, RPC_SECONDS.labels(service, method, code))
        return found
    return of


class _Refusals:
    """Counts refused calls by reason and logs them summarised: the first at once, then at
    most one line per ``every_s`` with how many more, of which reasons."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._since: dict[str, int] = {}
        self._logged_at: float | None = None

    def refused(self, reason: str, method: str, message: str) -> None:
        """Count one call to ``method`` refused for ``reason`` (saying ``message``)."""
        REFUSED_CALLS.labels(reason).inc()
        now = time.monotonic()
        with self._lock:
            self._since[reason] = self._since.get(reason, 0) + 1
            if self._logged_at is not None and now - self._logged_at < self.every_s:
                return
            elapsed = 0.0 if self._logged_at is None else now - self._logged_at
            first, self._logged_at = self._logged_at is None, now
            counts, self._since = self._since, {}
        if first:
            log.warning("refused a call to %s: %s (further refusals are summarised, at most "
                        "one line a minute)", method, message)
        else:
            log.warning("refused %d more calls in the last %.0f s (%s), the latest to %s: %s",
                        sum(counts.values()), elapsed, ", ".join(
                            f"{reason} {n}" for reason, n in sorted(counts.items())),
                        method, message)


#: Where servers report the calls they refuse (:meth:`_Refusals.refused`).
REFUSALS = _Refusals()


# -- the data service ------------------------------------------------------------------------
ELEMENTS_PRODUCED = _of("worker")(Counter(
    "elements_produced", "Elements a data worker's tasks produced",
    namespace=_NS, subsystem="data", registry=None))
BYTES_PRODUCED = _of("worker")(Counter(
    "bytes_produced", "Bytes (of arrays) of the elements a data worker's tasks produced",
    namespace=_NS, subsystem="data", registry=None))
ELEMENTS_SERVED = _of("worker")(Counter(
    "elements_served", "Elements a data worker sent to consumers",
    namespace=_NS, subsystem="data", registry=None))
BYTES_SERVED = _of("worker")(Counter(
    "bytes_served", "Bytes of the answers carrying elements a data worker sent to consumers",
    namespace=_NS, subsystem="data", registry=None))
BUFFERED_BYTES = _of("worker")(Gauge(
    "buffered_bytes", "Bytes of elements a data worker holds for its consumers, all tasks",
    namespace=_NS, subsystem="data", registry=None))
MAX_BUFFERED_BYTES = _of("worker")(Gauge(
    "max_buffered_bytes", "The bound of convoy_data_buffered_bytes (--max-buffered-bytes): at "
    "it, a data worker stops producing until its consumers take elements",
    namespace=_NS, subsystem="data", registry=None))
CONSUMER_WAIT_SECONDS = _of("consumer")(Histogram(
    "consumer_wait_seconds", "How long a consumer of the data service waited for its next "
    "elements (one wait per batch received)", buckets=_SECONDS_BUCKETS,
    namespace=_NS, subsystem="data", registry=None))
HEARTBEATS = _of("worker", "dispatcher")(Counter(
    "heartbeats", "Worker heartbeats, by event: sent and failed (a worker), received "
    "(the dispatcher)", ["event"], namespace=_NS, subsystem="data", registry=None))
JOURNAL_WRITE_SECONDS = _of("dispatcher")(Histogram(
    "journal_write_seconds", "Time the dispatcher took to make one journal write durable "
    "(an event, or a snapshot of its whole state)", buckets=_SECONDS_BUCKETS,
    namespace=_NS, subsystem="data", registry=None))
JOURNAL_WRITE_FAILURES = _of("dispatcher")(Counter(
    "journal_write_failures", "Journal writes that failed (a full disk, say): the dispatcher "
    "refuses new work until one succeeds", namespace=_NS, subsystem="data", registry=None))


@dataclasses.dataclass
class DispatcherStats:
    """What a dispatcher counts, read at each scrape (:data:`DISPATCHER`). ``splits`` and
    ``workers_lost`` are counts since its journal began (since it started, without one)."""

    workers: int = 0
    jobs: int = 0
    iterations: int = 0
    clients: int = 0
    workers_lost: int = 0
    splits: dict[str, int] = dataclasses.field(default_factory=dict)
    journal_bytes: int = 0
    journal_segments: int = 0
    optimal_workers: int = 0  # the workers its jobs need (0: unknown)


class _DispatcherCollector(Collector):
    """The families of :class:`DispatcherStats`, summed over the dispatchers of the process
    (usually one) that :meth:`watch` it."""

    def __init__(self) -> None:
        self._sources: dict[object, Callable[[], DispatcherStats]] = {}
        self._lock = threading.Lock()

    def watch(self, key: object, stats: Callable[[], DispatcherStats]) -> None:
        """Export ``stats()`` (of the dispatcher ``key``) at each scrape."""
        with self._lock:
            self._sources[key] = stats

    def forget(self, key: object) -> None:
        """Stop exporting the dispatcher ``key`` (no-op if not watched)."""
        with self._lock:
            self._sources.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sources = list(self._sources.values())
        every = [stats() for stats in sources]
        yield from _dispatcher_families(every)


def _dispatcher_families(every: list[DispatcherStats]) -> Iterator[Metric]:
    def total(name: str) -> int:
        return sum(getattr(stats, name) for stats in every)

    name = f"{_NS}_data_"
    for field, help_text in (
            ("workers", "Data workers registered with the dispatcher"),
            ("jobs", "Jobs the dispatcher holds, but finished named jobs kept as tombstones"),
            ("iterations", "Iterations (a job's pass over its dataset) not finished"),
            ("clients", "Consumers (iterators) reading an iteration"),
            ("journal_bytes", "Bytes of the dispatcher's journal files (0: no journal)"),
            ("journal_segments", "Files of the dispatcher's journal: a snapshot and logs")):
        yield GaugeMetricFamily(name + field, help_text, value=total(field))
    yield CounterMetricFamily(
        name + "workers_lost", "Workers declared lost (silent past the worker timeout, "
        "refusing connections or replaced); their unfinished DYNAMIC tasks go to others",
        value=total("workers_lost"))
    splits = CounterMetricFamily(
        name + "splits", "Splits of DYNAMIC sharding, by event: handed_out to a worker's task, "
        "acknowledged (done) or returned (by a worker lost or leaving, for another to run); "
        "kept in the journal, so a restarted dispatcher goes on counting", labels=["event"])
    for event in SPLIT_EVENTS:
        splits.add_metric([event], sum(stats.splits.get(event, 0) for stats in every))
    yield splits
    optimal = GaugeMetricFamily(
        name + "optimal_workers", "Workers the dispatcher's jobs need: their consumers' rate "
        "over the mean worker throughput (TensorFlow's estimate); no sample while unknown")
    known = [stats.optimal_workers for stats in every if stats.optimal_workers]
    if known:
        optimal.add_metric([], max(known))
    yield optimal


#: The events of ``convoy_data_splits_total``.
SPLIT_EVENTS = ("handed_out", "acknowledged", "returned")
#: The dispatchers of this process: each :meth:`~_DispatcherCollector.watch` es itself.
DISPATCHER = _of("dispatcher")(_DispatcherCollector())

# -- parameter-server training ---------------------------------------------------------------
PS_OPERATIONS = _of("ps")(Counter(
    "operations", "Variable operations a parameter server ran, by operation",
    ["operation"], namespace=_NS, subsystem="ps", registry=None))
PS_BYTES = _of("ps")(Counter(
    "bytes", "Bytes a parameter server received and sent, by direction",
    ["direction"], namespace=_NS, subsystem="ps", registry=None))
PS_EMBEDDING_ROWS = _of("ps")(Gauge(
    "embedding_rows", "Rows a parameter server holds of each dynamic embedding table",
    ["table"], namespace=_NS, subsystem="ps", registry=None))
PS_EMBEDDING_EVICTIONS = _of("ps")(Counter(
    "embedding_evictions", "Rows of dynamic embedding tables evicted to stay within max_rows",
    ["table"], namespace=_NS, subsystem="ps", registry=None))
COORDINATOR_FUNCTIONS_QUEUED = _of("coordinator")(Gauge(
    "functions_queued", "Functions scheduled by the coordinator and not yet running",
    namespace=_NS, subsystem="coordinator",
    registry=None))
COORDINATOR_FUNCTIONS_RUNNING = _of("coordinator")(Gauge(
    "functions_running", "Functions the coordinator has running on workers",
    namespace=_NS, subsystem="coordinator",
    registry=None))
COORDINATOR_FUNCTIONS_DONE = _of("coordinator")(Counter(
    "functions_done", "Functions that finished with a result",
    namespace=_NS, subsystem="coordinator",
    registry=None))
COORDINATOR_FUNCTIONS_FAILED = _of("coordinator")(Counter(
    "functions_failed", "Functions that finished with an error",
    namespace=_NS, subsystem="coordinator",
    registry=None))

# Labelled series whose values are known are shown from the start, at 0.
for _event in ("sent", "failed", "received"):
    HEARTBEATS.labels(_event)
for _direction in ("received", "sent"):
    PS_BYTES.labels(_direction)
for _reason in ("missing", "wrong", "stale", "malformed", "replayed"):
    REFUSED_CALLS.labels(_reason)


# -- readiness -------------------------------------------------------------------------------
_checks: dict[str, Callable[[], str | None]] = {}
_checks_lock = threading.Lock()


def add_readiness_check(name: str, fn: Callable[[], str | None]) -> None:
    """Make ``/readyz`` depend on ``fn``: it returns None when ready, else a short reason
    (an exception counts as not ready). Replaces an earlier check of the same ``name``."""
    if not isinstance(name, str) or not name:
        raise errors.InvalidArgumentError(f"`name` must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise errors.InvalidArgumentError(f"`fn` must be callable, got {type(fn).__name__}")
    with _checks_lock:
        _checks[name] = fn


def remove_readiness_check(name: str) -> None:
    """Forget the check ``name`` (no-op if there is none)."""
    with _checks_lock:
        _checks.pop(name, None)


def readiness() -> list[str]:
    """The reasons this process is not ready, one per failing check (empty: ready)."""
    with _checks_lock:
        checks = list(_checks.items())
    reasons = []
    for name, fn in checks:
        try:
            reason = fn()
        except Exception as error:  # a broken check is a failing one, said so
            reason = f"{type(error).__name__}: {error}"
        if reason is not None:
            reasons.append(f"{name}: {' '.join(str(reason).split())[:200]}")
    return reasons


# -- the HTTP server -------------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "convoy"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encode, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, encode(REGISTRY), content_type)
        elif path == "/healthz":
            dead = _threads.not_live()
            self._answer(503 if dead else 200, f"not live: {dead}\n".encode() if dead
                         else b"ok\n")
        elif path == "/readyz":
            reasons = readiness()
            if reasons:
                self._answer(503, ("not ready: " + "; ".join(reasons) + "\n").encode())
            else:
                self._answer(200, b"ready\n")
        else:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n")

    def _answer(self, status: int, body: bytes,
                content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # probes come every few seconds: no line each


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """The HTTP server :func:`serve` started: ``host``, the bound ``port``, and ``close``."""

    def __init__(self, port: int, host: str) -> None:
        try:
            kind = _HTTPServer6 if ":" in host else _HTTPServer
            self._server = kind((host, port), _Handler)
        except OSError as error:
            why = ("the port is in use" if error.errno == errno.EADDRINUSE
                   else error.strerror or str(error))
            raise errors.UnavailableError(
                f"could not serve metrics on {host}:{port}: {why}; choose another metrics "
                "port, or stop what holds it") from None
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = _threads.start("convoy-metrics", self._server.serve_forever,
                                      restart=True)
        log.info("metrics on http://%s:%d/metrics (probes: /healthz, /readyz)", host, self.port)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetricsServer(host={self.host!r}, port={self.port})"


def serve(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve this process's ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (port
    0: any free port) from a daemon thread, until :meth:`MetricsServer.close`."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise errors.InvalidArgumentError(f"`port` must be an int in [0, 65535], got {port!r}")
    if not isinstance(host, str) or not host:
        raise errors.InvalidArgumentError(f"`host` must be a host name or IP, got {host!r}")
    _BUILD.info({"version": __version__})
    return MetricsServer(port, host.strip("[]"))
