"""The ``convoy`` command: one subcommand per server role, plus small utilities."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import convoy
from convoy._security import MAX_REQUEST_BYTES
from convoy.data.service._common.server_config import MAX_DATASET_BYTES, MAX_DATASETS, MAX_JOBS
from convoy.distribute._limits import MAX_FUNCTION_BYTES

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


def _serve_until_signalled(server: Any, role: str, address: str, advertised: str = "") -> int:
    """Print the address ``server`` bound (and the one it advertises, if another), then serve
    until SIGTERM or SIGINT stops it."""
    _reuse_large_allocations()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    also = f" (advertised as {advertised})" if advertised and advertised != address else ""
    print(f"convoy {role} listening on {address}{also}", flush=True)
    parent = os.environ.get("CONVOY_PARENT_PID")
    while not stop.wait(0.5):
        if parent and os.getppid() != int(parent):
            break  # started by a test or demo harness that is gone
        if getattr(server, "error", None) is not None:
            print(f"convoy {role} stopped: {server.error}", file=sys.stderr, flush=True)
            server.stop()
            return 1
    server.stop()
    return 0


def _dispatcher_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--work-dir", default=None, help="directory for the dispatcher's state")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="journal state changes in --work-dir and replay them on restart")
    parser.add_argument("--worker-addresses", default=None,
                        help="comma-separated HOST:PORT of a fixed list of workers (needed by "
                             "the FILE, DATA, FILE_OR_DATA and HINT sharding policies)")
    parser.add_argument("--max-datasets", type=int, default=MAX_DATASETS, metavar="N",
                        help="datasets it keeps at most (default %(default)s)")
    parser.add_argument("--max-jobs", type=int, default=MAX_JOBS, metavar="N",
                        help="jobs it keeps at most (default %(default)s)")
    parser.add_argument("--max-dataset-bytes", type=int, default=MAX_DATASET_BYTES,
                        metavar="N", help="largest pickled dataset (default %(default)s)")
    security_arguments(parser)


@command("dispatcher", "run a data service dispatcher", _dispatcher_arguments)
def _dispatcher(args: argparse.Namespace) -> int:
    from convoy.data.service import DispatcherConfig, DispatchServer

    workers = args.worker_addresses.split(",") if args.worker_addresses else None
    server = DispatchServer(DispatcherConfig(
        port=args.port, work_dir=args.work_dir, fault_tolerant_mode=args.fault_tolerant,
        worker_addresses=workers, max_datasets=args.max_datasets, max_jobs=args.max_jobs,
        max_dataset_bytes=args.max_dataset_bytes, **security_settings(args)))
    return _serve_until_signalled(server, "dispatcher", server._address)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--address", default=None, metavar="NAME:PORT",
                        help="what consumers use to reach this worker, say a DNS name behind "
                             "a gateway; only advertised, never bound (default: --host and "
                             "the bound port; %%port%% in it becomes the bound port)")
    parser.add_argument("--heartbeat-ms", type=int, default=None)
    parser.add_argument("--dispatcher-timeout-ms", type=int, default=None)
    parser.add_argument("--cross-trainer-cache-size-bytes", type=int, default=None,
                        metavar="N", help="bound of each task's cross-trainer cache "
                                          "(default 10 GiB)")
    security_arguments(parser)


@command("worker", "run a data service worker", _worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    from convoy.data.service import WorkerConfig, WorkerServer

    server = WorkerServer(WorkerConfig(dispatcher_address=args.dispatcher, port=args.port,
                                       worker_address=args.address,
                                       heartbeat_interval_ms=args.heartbeat_ms,
                                       dispatcher_timeout_ms=args.dispatcher_timeout_ms,
                                       cross_trainer_cache_size_bytes=(
                                           args.cross_trainer_cache_size_bytes),
                                       **security_settings(args)))
    return _serve_until_signalled(server, "worker", server.bound_address, server._address)


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
    security_arguments(parser, host_help="host to bind (default: the host of the task's "
                                         "address in the cluster, which others still use)")


@command("server", "run one ps or worker task of a training cluster", _server_arguments)
def _server(args: argparse.Namespace) -> int:
    import json

    from convoy.distribute import Server
    from convoy.distribute.cluster_resolver import TFConfigClusterResolver

    resolver = TFConfigClusterResolver()
    cluster = json.loads(args.cluster) if args.cluster else resolver.cluster_spec()
    job = args.job or resolver.task_type
    index = args.index if args.index is not None else resolver.task_id
    if job is None or index is None:
        print("convoy server: give --job and --index, or set TF_CONFIG's task",
              file=sys.stderr)
        return 2
    server = Server(cluster, job, index, max_function_bytes=args.max_function_bytes,
                    **security_settings(args))
    return _serve_until_signalled(server, f"{job} task {index}", server.bound_address)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convoy", description="Distributed input pipelines and parameter-server training."
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, arguments, _) in _COMMANDS.items():
        # No abbreviations: --auth-token must not pass for --auth-token-file.
        arguments(subcommands.add_parser(name, help=help, description=help, allow_abbrev=False))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``convoy`` command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command][2](args)
    except convoy.errors.ConvoyError as error:  # e.g. a setting refused at start: no trace
        print(f"convoy {args.command}: {error}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
