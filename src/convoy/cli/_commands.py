"""What every ``convoy`` subcommand shares: the registry of subcommands, their errors and exit
statuses, and the options of several (security, metrics, a training cluster)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from convoy import errors
from convoy._transport import rpc as _rpc
from convoy._transport.security import MAX_REQUEST_BYTES
from convoy._version import __version__

#: Exit statuses: a command line that cannot work as given, and a failure while running.
USAGE, FAILURE = 2, 1


class CommandError(Exception):
    """What went wrong, in one line that says what to do, and the exit ``status``."""

    def __init__(self, message: str, status: int = FAILURE) -> None:
        super().__init__(message)
        self.status = status


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str,
            arguments: Callable[[argparse.ArgumentParser], None]) -> Callable[..., object]:
    """Register ``run(args) -> exit code`` as the subcommand ``name``."""
    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (help, arguments, run)
        return run
    return register


@command("version", "print convoy's version", lambda parser: None)
def _version(args: argparse.Namespace) -> int:
    print(f"convoy {__version__}")
    return 0


def metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port``, for the commands that run a server."""
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics at /metrics, and the probes /healthz "
                             "(alive) and /readyz (serving), on this port of --host "
                             "(default: none; 0: any free port)")


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
