"""The ``convoy`` command: one subcommand per server role (``dispatcher``, ``worker``,
``server``, ``cluster``), plus ``status`` and ``version``."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Sequence

from convoy import errors
from convoy._version import __version__
from convoy.cli import _serve, _status  # noqa: F401 (their subcommands register on import)
from convoy.cli._commands import COMMANDS, FAILURE, USAGE, CommandError

log = logging.getLogger("convoy.cli")


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
    group.add_argument("--version", action="version", version=f"convoy {__version__}")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convoy", description="Distributed input pipelines and parameter-server training."
    )
    parser.add_argument("--version", action="version", version=f"convoy {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_arguments()
    for name, (help, arguments, _) in COMMANDS.items():
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
        return COMMANDS[args.command][2](args)
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
