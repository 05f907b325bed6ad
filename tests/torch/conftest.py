"""Loader workers in these tests start from a fork server: the tests run convoy's servers in
this process (a InProcessCluster), and gRPC's threads do not survive a plain fork (see
docs/pytorch.md, "Forked loader workers and gRPC"). The server imports torch and convoy
once, so a loader worker starts as fast as a forked one.

Tests that run torch.distributed ranks start them through the ``ranks`` fixture: each rank
is a process group of its own (with its loader workers and its fork server), killed whole
when the test ends, whether it passed, failed or timed out."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

multiprocessing.set_forkserver_preload(["torch", "convoy", "convoy.torch"])


class Ranks:
    """The rank processes of one test."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[Any]] = []

    def start(self, script: str, *args: str, **popen: Any) -> subprocess.Popen[Any]:
        """Run ``script`` with ``args`` in a new process group."""
        process = subprocess.Popen([sys.executable, script, *args], env=os.environ.copy(),
                                   start_new_session=True, **popen)
        self.processes.append(process)
        return process

    def end(self, process: subprocess.Popen[Any]) -> None:
        """Kill ``process`` and every process left in its group (its loader workers may
        outlive it)."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the group has no process left
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank process {process.pid} did not exit within 30 s of "
                                 "SIGKILL") from None

    def end_all(self) -> None:
        for process in self.processes:
            self.end(process)


@pytest.fixture
def ranks() -> Iterator[Ranks]:
    started = Ranks()
    try:
        yield started
    finally:
        started.end_all()
