"""The ``convoy`` command: one subcommand per server role, plus small utilities."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import convoy
from convoy import errors, monitoring
from convoy._base import fs as _fs
from convoy._transport import rpc as _rpc
from convoy._transport.security import LOOPBACK, MAX_REQUEST_BYTES
from convoy.data.service._common.server_config import MAX_DATASET_BYTES, MAX_DATASETS, MAX_JOBS
from convoy.distribute._limits import MAX_FUNCTION_BYTES

log = logging.getLogger("convoy.cli")

#: Exit statuses: a command line that cannot work as given, and a failure while running.
USAGE, FAILURE = 2, 1


class CommandError(Exception):
    """What went wrong, in one line that says what to do, and the exit ``status``."""

    def __init__(self, message: str, status: int = FAILURE) -> None:
        super().__init__(message)
        self.status = status

_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str,
            arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[..., object]:
    """Register ``run(args) -> exit code`` as the subcommand ``name``."""
    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = (help, arguments, run)
        return run
    return register


@command("version", "print convoy's version", lambda parser: None)
def _version(args: argparse.Namespace) -> int:
    print(f"convoy {convoy.__version__}")
    return 0


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


def metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port``, for the commands that run a server."""
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics at /metrics, and the probes /healthz "
                             "(alive) and /readyz (serving), on this port of --host "
                             "(default: none; 0: any free port)")


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


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--dispatcher", default=None, metavar="HOST:PORT",
                        help="a data service dispatcher: its workers, datasets, jobs and "
                             "iterations")
    target.add_argument("--cluster", default=None, metavar="JSON",
                        help="a training cluster (default: TF_CONFIG's): each ps and worker, "
                             "its variables and their bytes, its functions running")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout instead of tables")
    parser.add_argument("--watch", type=float, default=None, metavar="SECONDS",
                        help="print again every SECONDS until Ctrl-C")
    parser.add_argument("--count", type=int, default=None, metavar="N",
                        help="with --watch, stop after N prints (default: until Ctrl-C)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long each call waits for its answer (default %(default)s)")
    group = parser.add_argument_group(
        "security", "The shared secret is read from --auth-token-file, else from "
        "$CONVOY_AUTH_TOKEN; TLS paths not given come from $CONVOY_TLS_*.")
    group.add_argument("--auth-token-file", default=None, metavar="PATH",
                       help="file holding the cluster's shared secret")
    group.add_argument("--auth-token", nargs="?", action=_RefuseSecret, help=argparse.SUPPRESS)
    group.add_argument("--certificate", default=None, metavar="PEM",
                       help="this client's TLS certificate (mutual TLS, with --key)")
    group.add_argument("--key", default=None, metavar="PEM", help="its TLS private key")
    group.add_argument("--ca", default=None, metavar="PEM", help="CA that signed the servers")


@command("status", "show a data service's or a training cluster's state", _status_arguments)
def _status(args: argparse.Namespace) -> int:
    from convoy import cluster_status
    from convoy._transport.security import Security

    if args.watch is not None and args.watch <= 0:
        raise CommandError(f"--watch must be a number of seconds > 0, got {args.watch}", USAGE)
    if args.count is not None and args.count < 1:
        raise CommandError(f"--count must be >= 1, got {args.count}", USAGE)
    security = Security.load(None, args.auth_token_file, certificate=args.certificate,
                             key=args.key, ca=args.ca)
    if args.dispatcher:
        def read() -> dict[str, Any]:
            return cluster_status.dispatcher_status(args.dispatcher, security, args.timeout)
        render = cluster_status.render_dispatcher
    else:
        cluster = _cluster(args.cluster) if args.cluster else _tf_config_cluster()

        def read() -> dict[str, Any]:
            return cluster_status.training_status(cluster, security, args.timeout)
        render = cluster_status.render_cluster
    printed = 0
    try:
        while True:
            status = read()
            if args.json:
                print(json.dumps(status), flush=True)
            else:
                if args.watch is not None and sys.stdout.isatty():
                    print("\033[2J\033[H", end="")  # clear the screen
                print(render(status), flush=True)
            printed += 1
            if args.watch is None or (args.count is not None and printed >= args.count):
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


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


def _tf_config_cluster() -> dict[str, Any]:
    from convoy.distribute.cluster_resolver import TFConfigClusterResolver

    try:
        spec = TFConfigClusterResolver().cluster_spec()
    except errors.ConvoyError as error:
        raise CommandError(f"TF_CONFIG: {error}", USAGE) from None
    cluster: dict[str, Any] = spec.as_dict()
    if not cluster:
        raise CommandError("give --dispatcher HOST:PORT or --cluster JSON, or set TF_CONFIG",
                           USAGE)
    return cluster


_CLUSTER_EXAMPLE = """'{"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]}'"""


def _cluster(text: str) -> dict[str, Any]:
    """The cluster of ``--cluster``: JSON mapping each job to its tasks' HOST:PORT."""
    try:
        cluster = json.loads(text)
    except ValueError as error:
        raise CommandError(f"--cluster is not JSON ({error}); give it like "
                           f"{_CLUSTER_EXAMPLE}", USAGE) from None
    shape = CommandError(f"--cluster must map each job to its tasks' HOST:PORT, like "
                         f"{_CLUSTER_EXAMPLE}; got {text!r:.200}", USAGE)
    if not isinstance(cluster, dict) or not cluster:
        raise shape
    for tasks in cluster.values():
        if not isinstance(tasks, (list, dict)):
            raise shape
        for address in tasks.values() if isinstance(tasks, dict) else tasks:
            if not isinstance(address, str):
                raise shape
            try:
                _rpc.check_address(address, "--cluster")
            except errors.InvalidArgumentError as error:
                raise CommandError(f"{error}, e.g. {_CLUSTER_EXAMPLE}", USAGE) from None
    return cluster


class _RefuseSecret(argparse.Action):
    """Refuses a secret given on the command line (``ps`` would show it), without echoing it."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        parser.error("the shared secret is never taken on the command line, where `ps` shows "
                     "it: use --auth-token-file PATH or $CONVOY_AUTH_TOKEN")


def security_arguments(parser: argparse.ArgumentParser,
                       host_help: str = "host to bind and advertise (default: loopback)"
                       ) -> None:
    """The options every server command shares: who may call it and where it listens."""
    group = parser.add_argument_group(
        "security", "The shared secret is read from --auth-token-file, else from "
        "$CONVOY_AUTH_TOKEN; it is never given on the command line. TLS paths not given are "
        "read from $CONVOY_TLS_CERTIFICATE, $CONVOY_TLS_KEY and $CONVOY_TLS_CA.")
    group.add_argument("--host", default=None, metavar="H", help=host_help)
    group.add_argument("--auth-token-file", default=None, metavar="PATH",
                       help="file holding the cluster's shared secret")
    group.add_argument("--auth-token", nargs="?", action=_RefuseSecret, help=argparse.SUPPRESS)
    group.add_argument("--certificate", default=None, metavar="PEM",
                       help="this server's TLS certificate (with --key)")
    group.add_argument("--key", default=None, metavar="PEM",
                       help="this server's TLS private key")
    group.add_argument("--ca", default=None, metavar="PEM",
                       help="CA of the other side: its clients must show certificates it "
                            "signed (mutual TLS), and its own clients check servers with it")
    group.add_argument("--insecure", action="store_true",
                       help="bind a host other than loopback without a shared secret: only "
                            "when every machine that can reach it is trusted")
    group.add_argument("--max-request-bytes", type=int, default=MAX_REQUEST_BYTES,
                       metavar="N", help="largest request accepted (default %(default)s)")


def security_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of a config (or training Server) for :func:`security_arguments`."""
    return {name: getattr(args, name) for name in (
        "host", "auth_token_file", "certificate", "key", "ca", "insecure",
        "max_request_bytes")}


def _common_arguments() -> argparse.ArgumentParser:
    """The options of every command: logging, tracebacks, the version."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("--log-level", default="INFO", type=str.upper, metavar="LEVEL",
                       choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                       help="least severe log lines shown: DEBUG, INFO (default), WARNING, "
                            "ERROR or CRITICAL")
    group.add_argument("--debug", action="store_true",
                       help="on a failure, show the traceback too (and gRPC's own logs)")
    group.add_argument("--version", action="version", version=f"convoy {convoy.__version__}")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convoy", description="Distributed input pipelines and parameter-server training."
    )
    parser.add_argument("--version", action="version", version=f"convoy {convoy.__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_arguments()
    for name, (help, arguments, _) in _COMMANDS.items():
        # No abbreviations: --auth-token must not pass for --auth-token-file.
        arguments(subcommands.add_parser(name, help=help, description=help, allow_abbrev=False,
                                         parents=[common]))
    return parser


def configure_logging(level: str, command: str) -> None:
    """Log to stderr, each line with its UTC time, level, command and process id."""
    handler = logging.StreamHandler()
    formatter = logging.Formatter(
        f"%(asctime)s.%(msecs)03dZ %(levelname)s convoy-{command}[%(process)d] "
        "%(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def explain(error: BaseException) -> tuple[str, int]:
    """One line saying what went wrong (and what to do), and the exit status."""
    if isinstance(error, CommandError):
        return str(error), error.status
    if isinstance(error, (errors.InvalidArgumentError, errors.FailedPreconditionError)):
        return str(error), USAGE  # a setting refused as given
    if isinstance(error, errors.DataLossError):
        return (f"{error}; restore the journal from a backup, or move it away to start the "
                "dispatcher with no state"), FAILURE
    if isinstance(error, errors.ConvoyError):
        return str(error), FAILURE
    if isinstance(error, OSError):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}", FAILURE
    return (f"unexpected {type(error).__name__}: {error} (--debug shows where it came from)",
            FAILURE)


#: Settings whose flag is not the setting's name with dashes.
_FLAG_OF_SETTING = {"heartbeat_interval_ms": "--heartbeat-ms", "dispatcher_address": "--dispatcher",
                    "worker_address": "--address", "fault_tolerant_mode": "--fault-tolerant",
                    "auth_token_file": "--auth-token-file"}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag of ``parser`` and of its subcommands."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _flags(sub)
    return flags


def with_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` (of a config refusing a setting) naming the flags that set what it names
    (``--worker-timeout-ms``, not ``worker_timeout_ms``)."""
    flags = _flags(parser)

    def flag(match: re.Match[str]) -> str:
        setting = match[0]
        named = _FLAG_OF_SETTING.get(setting, "--" + setting.replace("_", "-"))
        return named if named in flags else setting

    return re.sub(r"(?<![\w./-])[a-z]+(?:_[a-z0-9]+)+\b", flag, message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``convoy`` command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.command)  # gRPC's own lines: see convoy/__init__
    try:
        return _COMMANDS[args.command][2](args)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if args.debug:
            log.error("convoy %s failed", args.command, exc_info=error)
        message, status = explain(error)
        if status == USAGE:
            message = with_flags(message, parser)
        print(f"convoy {args.command}: {' '.join(message.split())}", file=sys.stderr,
              flush=True)
        return status


if __name__ == "__main__":
    sys.exit(main())
