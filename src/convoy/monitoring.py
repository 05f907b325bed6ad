"""What a convoy process tells its operator: Prometheus metrics and health probes over HTTP.

Every metric of the process lives in :data:`REGISTRY` and is defined here, each name prefixed
``convoy_``; the servers and clients update them whether or not anything serves them.
:func:`serve` starts an HTTP server (off unless called: the ``convoy`` command calls it for
``--metrics-port``) answering

- ``/metrics``: the metrics, in Prometheus's text format (OpenMetrics if asked for);
- ``/healthz``: 200 while the process runs (a liveness probe);
- ``/readyz``: 200 when every check of :func:`add_readiness_check` passes, else 503 with one
  short line per failing check (a readiness probe).

None of them is authenticated, so none carries data: counts, sizes and times only.
"""

from __future__ import annotations

import errno
import http.server
import logging
import socket
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from convoy import _threads, errors

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
    "PS_BYTES",
    "PS_OPERATIONS",
    "REGISTRY",
    "RPC_SECONDS",
    "SPLITS",
    "MetricsServer",
    "add_readiness_check",
    "readiness",
    "remove_readiness_check",
    "serve",
]

log = logging.getLogger(__name__)

#: The registry of every convoy metric of this process (not prometheus_client's default one,
#: so that a scrape carries convoy's names only).
REGISTRY = CollectorRegistry(auto_describe=True)

_NS = "convoy"
#: From a millisecond to a minute: element waits and RPCs span that range.
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)

ProcessCollector(namespace=_NS, registry=REGISTRY)  # convoy_process_cpu_seconds_total, ...
_BUILD = Info("build", "convoy's version", namespace=_NS, registry=REGISTRY)

# -- the data service ------------------------------------------------------------------------
ELEMENTS_PRODUCED = Counter(
    "elements_produced", "Elements a data worker's tasks produced",
    namespace=_NS, subsystem="data", registry=REGISTRY)
BYTES_PRODUCED = Counter(
    "bytes_produced", "Bytes (of arrays) of the elements a data worker's tasks produced",
    namespace=_NS, subsystem="data", registry=REGISTRY)
ELEMENTS_SERVED = Counter(
    "elements_served", "Elements a data worker sent to consumers",
    namespace=_NS, subsystem="data", registry=REGISTRY)
BYTES_SERVED = Counter(
    "bytes_served", "Bytes of the answers carrying elements a data worker sent to consumers",
    namespace=_NS, subsystem="data", registry=REGISTRY)
BUFFERED_BYTES = Gauge(
    "buffered_bytes", "Bytes of elements a data worker holds for its consumers, all tasks",
    namespace=_NS, subsystem="data", registry=REGISTRY)
CONSUMER_WAIT_SECONDS = Histogram(
    "consumer_wait_seconds", "How long a consumer of the data service waited for its next "
    "elements (one wait per batch received)",
    namespace=_NS, subsystem="data", buckets=_SECONDS_BUCKETS, registry=REGISTRY)
SPLITS = Counter(
    "splits", "Splits of DYNAMIC sharding, by event: handed_out to a worker's task, "
    "acknowledged (done) or returned (by a worker lost or leaving, for another to run)",
    ["event"], namespace=_NS, subsystem="data", registry=REGISTRY)
HEARTBEATS = Counter(
    "heartbeats", "Worker heartbeats, by event: sent and failed (a worker), received "
    "(the dispatcher)", ["event"], namespace=_NS, subsystem="data", registry=REGISTRY)

# -- every gRPC server -----------------------------------------------------------------------
RPC_SECONDS = Histogram(
    "rpc_duration_seconds", "Time a server took to answer each call (each message of a "
    "stream), by service and method", ["service", "method"],
    namespace=_NS, buckets=_SECONDS_BUCKETS, registry=REGISTRY)

# -- parameter-server training ---------------------------------------------------------------
PS_OPERATIONS = Counter(
    "operations", "Variable operations a parameter server ran, by operation",
    ["operation"], namespace=_NS, subsystem="ps", registry=REGISTRY)
PS_BYTES = Counter(
    "bytes", "Bytes a parameter server received and sent, by direction",
    ["direction"], namespace=_NS, subsystem="ps", registry=REGISTRY)
COORDINATOR_FUNCTIONS_QUEUED = Gauge(
    "functions_queued", "Functions scheduled by the coordinator and not yet running",
    namespace=_NS, subsystem="coordinator", registry=REGISTRY)
COORDINATOR_FUNCTIONS_RUNNING = Gauge(
    "functions_running", "Functions the coordinator has running on workers",
    namespace=_NS, subsystem="coordinator", registry=REGISTRY)
COORDINATOR_FUNCTIONS_DONE = Counter(
    "functions_done", "Functions that finished with a result",
    namespace=_NS, subsystem="coordinator", registry=REGISTRY)
COORDINATOR_FUNCTIONS_FAILED = Counter(
    "functions_failed", "Functions that finished with an error",
    namespace=_NS, subsystem="coordinator", registry=REGISTRY)

# Labelled series whose values are known are shown from the start, at 0.
for _event in ("handed_out", "acknowledged", "returned"):
    SPLITS.labels(_event)
for _event in ("sent", "failed", "received"):
    HEARTBEATS.labels(_event)
for _direction in ("received", "sent"):
    PS_BYTES.labels(_direction)


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
    import convoy

    _BUILD.info({"version": convoy.__version__})
    return MetricsServer(port, host.strip("[]"))
