"""The commands that run a server until a signal stops it: ``dispatcher``, ``worker``,
``server`` (a training task) and ``cluster`` (a local data service)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from convoy import errors, monitoring
from convoy._base import fs as _fs
from convoy._transport.security import LOOPBACK
from convoy.cli._commands import (
    FAILURE,
    USAGE,
    CommandError,
    _cluster,
    command,
    metrics_arguments,
    security_arguments,
    security_settings,
)
from convoy.data.service._common.server_config import MAX_DATASET_BYTES, MAX_DATASETS, MAX_JOBS
from convoy.distribute._limits import MAX_FUNCTION_BYTES

log = logging.getLogger("convoy.cli")


def _reuse_large_allocations() -> None:
    """Keep glibc from mapping and unmapping every buffer of 128 KiB or more. A server
    allocates such buffers for every message and array it handles, and the page faults of
    fresh mappings can cost more than the work: a 1,024-row sparse update on a parameter
    server took 674 us with the default and 235 us with this. A no-op without glibc."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 256 << 20)
    mallopt(m_trim_threshold, 512 << 20)


def _serve_until_signalled(server: Any, role: str, address: str, advertised: str = "",
                           on_sigterm: Callable[[], object] | None = None) -> int:
    """Print the address ``server`` bound (and the one it advertises, if another), then serve
    until SIGTERM or SIGINT stops it (SIGTERM by ``on_sigterm``, if given: a graceful leave)."""
    _reuse_large_allocations()
    stop = threading.Event()
    signals: list[int] = []

    def signalled(signum: int, _: object) -> None:
        signals.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signalled)
    also = f" (advertised as {advertised})" if advertised and advertised != address else ""
    monitoring.add_readiness_check(_SERVING, lambda: _problem(server))
    print(f"convoy {role} listening on {address}{also}", flush=True)
    parent = os.environ.get("CONVOY_PARENT_PID")
    while not stop.wait(0.5):
        if parent and os.getppid() != int(parent):
            break  # started by a test or demo harness that is gone
        if getattr(server, "error", None) is not None:
            log.error("convoy %s stopped: %s", role, server.error)
            monitoring.add_readiness_check(_SERVING, lambda: "stopped")
            server.stop()
            return FAILURE
    log.info("convoy %s stopping", role)
    monitoring.add_readiness_check(_SERVING, lambda: "stopping")
    if on_sigterm is not None and signals[:1] == [signal.SIGTERM]:
        on_sigterm()
    else:
        server.stop()
    return 0


#: The readiness check of the command's server.
_SERVING = "server"


def _problem(server: Any) -> str | None:
    """Why ``server`` is not ready (None: it is)."""
    error = getattr(server, "error", None)
    if error is not None:
        return f"stopped: {error}"
    return None if server.started else "not serving"


@contextmanager
def _metrics(args: argparse.Namespace) -> Iterator[None]:
    """Serve /metrics, /healthz and /readyz on ``--metrics-port`` (if given) while the body
    runs; not ready until the server is up (readiness as :func:`_serve_until_signalled` sets
    it)."""
    if args.metrics_port is None:
        yield
        return
    monitoring.add_readiness_check(_SERVING, lambda: "starting")
    server = monitoring.serve(args.metrics_port, args.host or LOOPBACK)
    try:
        yield
    finally:
        server.close()
        monitoring.remove_readiness_check(_SERVING)


def _dispatcher_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--work-dir", default=None, metavar="DIR",
                        help="directory of the dispatcher's journal (with --fault-tolerant)")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="journal state changes in --work-dir and replay them on restart")
    parser.add_argument("--worker-timeout-ms", type=int, default=None, metavar="MS",
                        help="a worker silent this long is declared lost and its DYNAMIC "
                             "tasks are run by others (default 60000)")
    parser.add_argument("--client-timeout-ms", type=int, default=None, metavar="MS",
                        help="a consumer silent this long is forgotten (default 300000)")
    parser.add_argument("--job-gc-timeout-ms", type=int, default=None, metavar="MS",
                        help="an iteration without consumers this long is collected; -1: "
                             "never (default 300000)")
    parser.add_argument("--job-gc-check-interval-ms", type=int, default=None, metavar="MS",
                        help="how often silent consumers and workers are looked for "
                             "(default 10000)")
    parser.add_argument("--worker-addresses", default=None,
                        help="comma-separated HOST:PORT of a fixed list of workers (needed by "
                             "the FILE, DATA, FILE_OR_DATA and HINT sharding policies)")
    parser.add_argument("--max-datasets", type=int, default=MAX_DATASETS, metavar="N",
                        help="datasets it keeps at most (default %(default)s)")
    parser.add_argument("--max-jobs", type=int, default=MAX_JOBS, metavar="N",
                        help="jobs it keeps at most (default %(default)s)")
    parser.add_argument("--max-dataset-bytes", type=int, default=MAX_DATASET_BYTES,
                        metavar="N", help="largest pickled dataset (default %(default)s)")
    metrics_arguments(parser)
    security_arguments(parser)


@command("dispatcher", "run a data service dispatcher", _dispatcher_arguments)
def _dispatcher(args: argparse.Namespace) -> int:
    from convoy.data.service import DispatcherConfig, DispatchServer

    workers = args.worker_addresses.split(",") if args.worker_addresses else None
    config = DispatcherConfig(
        port=args.port, work_dir=args.work_dir, fault_tolerant_mode=args.fault_tolerant,
        worker_addresses=workers, worker_timeout_ms=args.worker_timeout_ms,
        client_timeout_ms=args.client_timeout_ms, job_gc_timeout_ms=args.job_gc_timeout_ms,
        job_gc_check_interval_ms=args.job_gc_check_interval_ms,
        max_datasets=args.max_datasets, max_jobs=args.max_jobs,
        max_dataset_bytes=args.max_dataset_bytes, **security_settings(args))
    if args.work_dir and not args.fault_tolerant:
        log.warning("--work-dir %s is not used without --fault-tolerant: nothing is "
                    "persisted, and a restarted dispatcher starts empty; add --fault-tolerant "
                    "to journal its state there", args.work_dir)
    elif args.work_dir:
        _check_writable(args.work_dir)
    with _metrics(args):
        server = DispatchServer(config)
        return _serve_until_signalled(server, "dispatcher", server._address)


def _check_writable(directory: str) -> None:
    """Refuse a ``--work-dir`` that cannot hold the journal, saying why."""
    if _fs.is_url(directory):  # an object store: a probe object written and deleted
        probe = _fs.join(directory, f".convoy-probe-{os.getpid()}")
        try:
            _fs.atomic_write(probe, b"")
            _fs.remove(probe)
        except (errors.ConvoyError, OSError) as error:
            raise CommandError(f"cannot use --work-dir {directory!r}: {error}") from None
        return
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CommandError(f"--work-dir {directory!r} is not a directory: give a directory "
                           "(it is made if missing)")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise CommandError(
            f"cannot use --work-dir {directory!r}: {error.strerror or error}; give a "
            "directory this user can create and write") from None


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--address", default=None, metavar="NAME:PORT",
                        help="what consumers use to reach this worker, say a DNS name behind "
                             "a gateway; only advertised, never bound (default: --host and "
                             "the bound port; %%port%% in it becomes the bound port)")
    parser.add_argument("--heartbeat-ms", type=int, default=None, metavar="MS",
                        help="how often it tells the dispatcher it is alive (default 1000)")
    parser.add_argument("--dispatcher-timeout-ms", type=int, default=None, metavar="MS",
                        help="how long it keeps trying to reach the dispatcher before it "
                             "gives up (default 3600000, an hour)")
    parser.add_argument("--cross-trainer-cache-size-bytes", type=int, default=None,
                        metavar="N", help="bound of each task's cross-trainer cache "
                                          "(default 10 GiB)")
    parser.add_argument("--drain-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="on SIGTERM, how long its consumers may take what it buffered "
                             "before it deregisters and exits; its unfinished DYNAMIC splits "
                             "run elsewhere, exactly once (default %(default)s)")
    parser.add_argument("--max-buffered-bytes", type=int, default=1 << 30, metavar="N",
                        help="bytes of elements it buffers across all its tasks before their "
                             "producers wait for consumers (default 1 GiB)")
    metrics_arguments(parser)
    security_arguments(parser)


@command("worker", "run a data service worker", _worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    from convoy.data.service import WorkerConfig, WorkerServer

    if not args.drain_timeout >= 0:
        raise CommandError(f"--drain-timeout must be a number of seconds >= 0, got "
                           f"{args.drain_timeout}", USAGE)
    config = WorkerConfig(dispatcher_address=args.dispatcher, port=args.port,
                          worker_address=args.address, heartbeat_interval_ms=args.heartbeat_ms,
                          dispatcher_timeout_ms=args.dispatcher_timeout_ms,
                          cross_trainer_cache_size_bytes=args.cross_trainer_cache_size_bytes,
                          max_buffered_bytes=args.max_buffered_bytes,
                          **security_settings(args))
    with _metrics(args):
        try:
            server = WorkerServer(config)
        except (errors.UnavailableError, errors.DeadlineExceededError) as error:
            if config.dispatcher_address not in str(error):
                raise  # not about the dispatcher: e.g. its own port taken
            raise CommandError(
                f"{error}; check that a dispatcher runs at {config.dispatcher_address} and "
                "that this machine reaches it (a worker waits --dispatcher-timeout-ms for "
                "it)") from error
        return _serve_until_signalled(server, "worker", server.bound_address, server._address,
                                      lambda: server.drain(args.drain_timeout))


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", default=None, help="ps or worker (default: TF_CONFIG's task)")
    parser.add_argument("--index", type=int, default=None,
                        help="task index (default: TF_CONFIG's task)")
    parser.add_argument("--cluster", default=None,
                        help='cluster as JSON, e.g. \'{"ps": ["h:1"], "worker": ["h:2"]}\' '
                             "(default: TF_CONFIG's cluster)")
    parser.add_argument("--max-function-bytes", type=int, default=MAX_FUNCTION_BYTES,
                        metavar="N",
                        help="largest pickled function a worker runs (default %(default)s)")
    parser.add_argument("--framed-port", type=int, default=0, metavar="PORT",
                        help="the port of the task's framed connections (a ps's Execute, a "
                             "worker's Run) on the host it binds (default 0: an ephemeral "
                             "port)")
    metrics_arguments(parser)
    security_arguments(parser, host_help="host to bind (default: the host of the task's "
                                         "address in the cluster, which others still use)")


@command("server", "run one ps or worker task of a training cluster", _server_arguments)
def _server(args: argparse.Namespace) -> int:
    from convoy.distribute import Server
    from convoy.distribute.cluster_resolver import TFConfigClusterResolver

    try:
        resolver = TFConfigClusterResolver()
    except errors.ConvoyError as error:
        raise CommandError(f"TF_CONFIG: {error}", USAGE) from None
    cluster = _cluster(args.cluster) if args.cluster else resolver.cluster_spec()
    job = args.job or resolver.task_type
    index = args.index if args.index is not None else resolver.task_id
    if job is None or index is None:
        raise CommandError("give --job and --index, or set TF_CONFIG's task", USAGE)
    with _metrics(args):
        server = Server(cluster, job, index, max_function_bytes=args.max_function_bytes,
                        framed_port=args.framed_port, **security_settings(args))
        return _serve_until_signalled(server, f"{job} task {index}", server.bound_address)


def _local_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="run N workers (default: --min-workers, or 1)")
    parser.add_argument("--min-workers", type=int, default=None, metavar="A",
                        help="with --max-workers: follow the dispatcher's estimate of the "
                        "workers needed, between A and B")
    parser.add_argument("--max-workers", type=int, default=None, metavar="B")
    parser.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                        help="how often adaptive scaling looks at the estimate")


@command("cluster", "run a data-service dispatcher and workers as processes on this machine",
         _local_cluster_arguments)
def _local_cluster(args: argparse.Namespace) -> int:
    from convoy.data.service import LocalCluster

    adaptive = args.min_workers is not None or args.max_workers is not None
    minimum = 1 if args.min_workers is None else args.min_workers
    workers = args.workers if args.workers is not None else max(1, minimum)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with LocalCluster(workers) as cluster:
        if adaptive:
            cluster.adapt(minimum, args.max_workers, args.interval)
        print(f"convoy cluster: dispatcher listening on {cluster.target} "
              f"({workers} workers{', adaptive' if adaptive else ''})", flush=True)
        stop.wait()
    return 0
