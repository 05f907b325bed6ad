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


def _serve_until_signalled(server: Any, role: str, address: str) -> int:
    """Print where ``server`` listens, then serve until SIGTERM or SIGINT stops it."""
    _reuse_large_allocations()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"convoy {role} listening on {address}", flush=True)
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


@command("dispatcher", "run a data service dispatcher", _dispatcher_arguments)
def _dispatcher(args: argparse.Namespace) -> int:
    from convoy.data.service import DispatcherConfig, DispatchServer

    workers = args.worker_addresses.split(",") if args.worker_addresses else None
    server = DispatchServer(DispatcherConfig(port=args.port, work_dir=args.work_dir,
                                             fault_tolerant_mode=args.fault_tolerant,
                                             worker_addresses=workers))
    return _serve_until_signalled(server, "dispatcher", server._address)


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--address", default=None,
                        help="address consumers use to reach this worker (default "
                             "localhost:PORT)")
    parser.add_argument("--heartbeat-ms", type=int, default=None)
    parser.add_argument("--dispatcher-timeout-ms", type=int, default=None)


@command("worker", "run a data service worker", _worker_arguments)
def _worker(args: argparse.Namespace) -> int:
    from convoy.data.service import WorkerConfig, WorkerServer

    server = WorkerServer(WorkerConfig(dispatcher_address=args.dispatcher, port=args.port,
                                       worker_address=args.address,
                                       heartbeat_interval_ms=args.heartbeat_ms,
                                       dispatcher_timeout_ms=args.dispatcher_timeout_ms))
    return _serve_until_signalled(server, "worker", server._address)


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", default=None, help="ps or worker (default: TF_CONFIG's task)")
    parser.add_argument("--index", type=int, default=None,
                        help="task index (default: TF_CONFIG's task)")
    parser.add_argument("--cluster", default=None,
                        help='cluster as JSON, e.g. \'{"ps": ["h:1"], "worker": ["h:2"]}\' '
                             "(default: TF_CONFIG's cluster)")


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
    server = Server(cluster, job, index)
    return _serve_until_signalled(server, f"{job} task {index}", server.address)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convoy", description="Distributed input pipelines and parameter-server training."
    )
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help, arguments, _) in _COMMANDS.items():
        arguments(subcommands.add_parser(name, help=help, description=help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``convoy`` command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    return _COMMANDS[args.command][2](args)


if __name__ == "__main__":
    sys.exit(main())
