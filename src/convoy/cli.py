"""The ``convoy`` command: one subcommand per server role, plus small utilities."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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
