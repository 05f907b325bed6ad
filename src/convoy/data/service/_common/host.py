"""This host, as same-host transfer sees it: whether two processes can exchange shared-memory
segments (the worker's and the consumer's ends of :mod:`convoy.data.service._shm.segments` and the
consumer's read options ask)."""

from __future__ import annotations

import functools
import os

#: Where POSIX shared memory lives on Linux.
SHM_DIR = "/dev/shm"


@functools.cache
def host_identity() -> str:
    """What two processes share exactly when they can exchange segments: the boot, the
    shared-memory file system, the pid namespace (containers on one machine may differ in
    these two) and the user (segments are private to theirs). "" where there is no POSIX
    shared memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        shm = os.stat(SHM_DIR)
    except OSError:
        return ""
    return f"{boot_id}:{shm.st_dev}:{pid_namespace()}:{os.getuid()}"


@functools.cache
def pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0
