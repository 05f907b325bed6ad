"""Shared-memory segments on one host: files of POSIX shared memory (``/dev/shm``, Linux).

A segment holds one codec message at a time. Its writer (a worker) creates it with mode
0600 and ``O_EXCL`` (never an existing file) and writes a message into it. Its reader (a
consumer) maps the message read-only: the mapping lives until the reader lets go of the last
array viewing it, or dies. Only then may the writer write the next message into the same
segment (:func:`rewrite_segment`), which costs a copy instead of a new file's fresh pages; a
segment's name is unlinked by its writer, and the memory goes once no mapping is left.

Names say who made them: ``convoy-shm.u<uid>.n<pid namespace>.p<pid>.s<start>.<token>.<n>``,
the writer's user, its process (pid namespace, pid and start time, so a sweep can tell whether
it still runs), a random token per process and a counter. Two users, jobs or processes on one
host never share a name, and :func:`sweep_orphans` unlinks the segments of writers that died.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from convoy.data.service._common.host import SHM_DIR, pid_namespace
from convoy.errors import DataLossError, InvalidArgumentError

log = logging.getLogger(__name__)

PREFIX = "convoy-shm"
_NAME = re.compile(PREFIX + r"\.u(\d+)\.n(\d+)\.p(\d+)\.s(\d+)\.[0-9a-f]+\.\d+")
_MODE = 0o600
_IOV_MAX = 512  # pieces per writev call (Linux allows 1024)


# ----- this host's processes ---------------------------------------------------------------
def shm_capacity() -> int:
    """The size of the shared-memory file system, in bytes (0 if there is none)."""
    try:
        info = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return info.f_blocks * info.f_frsize


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is none: with
    the pid, it names a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])  # field 22 of proc(5); the two before ")" are cut off


@dataclass(frozen=True)
class Process:
    """A process of this host: its pid and start time."""

    pid: int
    start: int

    @classmethod
    def this(cls) -> Process:
        pid = os.getpid()
        return cls(pid, process_start(pid) or 0)

    def alive(self) -> bool:
        return process_start(self.pid) == self.start


# ----- names -------------------------------------------------------------------------------------
class SegmentNames:
    """The names of one process's segments, each new."""

    def __init__(self) -> None:
        me = Process.this()
        self._stem = (f"{PREFIX}.u{os.getuid()}.n{pid_namespace()}.p{me.pid}.s{me.start}."
                      f"{secrets.token_hex(8)}")
        self._numbers = itertools.count()

    def new(self) -> str:
        return f"{self._stem}.{next(self._numbers)}"


def _path(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"not a convoy shared-memory segment name: {name!r}")
    return os.path.join(SHM_DIR, name)


# ----- writing, mapping, unlinking ---------------------------------------------------------------
def write_segment(name: str, pieces: Sequence[Any]) -> None:
    """Create segment ``name`` (mode 0600; an existing file is an error) holding ``pieces``
    (bytes-like) one after the other."""
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                 | os.O_CLOEXEC, _MODE)
    try:
        _write_all(fd, pieces)
    except BaseException:
        os.unlink(_path(name))
        raise
    finally:
        os.close(fd)


def rewrite_segment(name: str, pieces: Sequence[Any]) -> None:
    """Write ``pieces`` over the start of segment ``name``, which this process wrote before
    and no reader maps any more. Its pages exist already, so this is a plain copy."""
    fd = os.open(_path(name), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _write_all(fd, pieces)
    finally:
        os.close(fd)


def _write_all(fd: int, pieces: Sequence[Any]) -> None:
    views = [memoryview(piece).cast("B") for piece in pieces]
    start = offset = 0
    while start < len(views):
        batch = views[start:start + _IOV_MAX]
        written = os.pwritev(fd, batch, offset)
        offset += written
        for view in batch:  # a short write: go on from the first byte not written
            if written < view.nbytes:
                views[start] = view[written:]
                break
            written -= view.nbytes
            start += 1


def map_segment(name: str, length: int) -> mmap.mmap:
    """Map the first ``length`` bytes of segment ``name`` read-only; the memory stays as long
    as the mapping does, whatever becomes of the name."""
    path = _path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DataLossError(
            f"shared-memory segment {name} is gone: its worker freed it before it was mapped "
            f"(a worker frees what it handed out when the consumer exits, after a timeout, or "
            f"when it stops), or another process removed it") from None
    except OSError as error:
        raise DataLossError(f"cannot open shared-memory segment {name}: {error}") from error
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise DataLossError(
                f"shared-memory segment {name} is not private to this user (owner uid "
                f"{info.st_uid}, mode {info.st_mode & 0o777:o}): refused")
        if not 0 < length <= info.st_size:
            raise DataLossError(f"shared-memory segment {name} holds {info.st_size} bytes, "
                                f"not the {length} its answer names")
        try:
            return mmap.mmap(fd, length, access=mmap.ACCESS_READ)
        except OSError as error:
            raise DataLossError(f"cannot map shared-memory segment {name}: {error}") from error
    finally:
        os.close(fd)


def unlink_segment(name: str) -> bool:
    """Remove segment ``name``'s name; False if it was gone already."""
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        return False
    return True


def unlink_all(names: Iterable[str]) -> None:
    """Unlink the segments ``names``, warning about those that cannot be (they are not ours
    to remove any more: nothing to free)."""
    for name in names:
        try:
            unlink_segment(name)
        except OSError as error:
            log.warning("cannot unlink shared-memory segment %s (%s)", name, error)


# ----- orphans -----------------------------------------------------------------------------------
def segments(uid: int | None = None) -> list[str]:
    """The names of the convoy segments on this host (of user ``uid``, if given)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(name for name in names if _NAME.fullmatch(name)
                  and (uid is None or _owner(name)[0] == uid))


def _owner(name: str) -> tuple[int, int, Process]:
    match = _NAME.fullmatch(name)
    assert match is not None
    uid, namespace, pid, start = (int(group) for group in match.groups())
    return uid, namespace, Process(pid, start)


def writer_of(name: str) -> Process:
    """The process that wrote segment ``name``."""
    _path(name)
    return _owner(name)[2]


def sweep_orphans() -> list[str]:
    """Unlink this user's segments whose writer (of this pid namespace) no longer runs; the
    names unlinked."""
    swept = []
    for name in _orphans():
        with contextlib.suppress(OSError):
            if unlink_segment(name):
                swept.append(name)
    return swept


def _orphans() -> Iterator[str]:
    uid, namespace = os.getuid(), pid_namespace()
    for name in segments(uid):
        _, its_namespace, writer = _owner(name)
        if its_namespace == namespace and not writer.alive():
            yield name
