"""Files on any file system, named and behaving as ``tf.io.gfile``.

Paths are local paths or URLs (``s3://bucket/key``, ``gs://...``, any fsspec scheme), through
the same layer as every other convoy API: a URL is never taken for a local path, and a
missing file is :class:`~convoy.errors.NotFoundError`, a refused one
:class:`~convoy.errors.PermissionDeniedError`, on either kind of path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from convoy._base import fs as _fs
from convoy.errors import (
    AlreadyExistsError,
    ConvoyError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    UnknownError,
)

__all__ = ["GFile", "copy", "exists", "glob", "isdir", "listdir", "makedirs", "mkdir",
           "remove", "rename", "rmtree", "stat", "walk"]


@contextlib.contextmanager
def _errors(path: Any) -> Iterator[None]:
    """OS errors on ``path`` as convoy's, naming it."""
    try:
        yield
    except ConvoyError:
        raise
    except OSError as e:
        shown = os.fsdecode(os.fspath(path))
        mapped = _fs._translate(e, shown)
        if mapped is None:
            mapped = UnknownError(f"{shown}: {e}")
        raise mapped from e


class GFile:
    """A file on any file system, as ``tf.io.gfile.GFile``: ``mode`` ``"r"``/``"w"``/``"a"``
    with ``"b"`` for bytes. A file written on an object store appears whole when closed."""

    def __init__(self, name: str | os.PathLike[str], mode: str = "r") -> None:
        if mode.replace("b", "") not in ("r", "w", "a", "x"):
            raise FailedPreconditionError(f"GFile: mode must be r, w, a or x (with b), "
                                          f"got {mode!r}")
        self.name = os.fsdecode(os.fspath(name))
        self.mode = mode
        self._file: IO[Any] | None = None

    def _open(self) -> IO[Any]:
        if self._file is None:
            with _errors(self.name):
                self._file = _fs.open_file(
                    self.name, self.mode, encoding=None if "b" in self.mode else "utf-8")
        return self._file

    def read(self, n: int = -1) -> Any:
        """``n`` bytes (or characters), or the rest of the file."""
        with _errors(self.name):
            return self._open().read(n)

    def readline(self) -> Any:
        """The next line, with its newline."""
        with _errors(self.name):
            return self._open().readline()

    def readlines(self) -> list[Any]:
        """The remaining lines."""
        with _errors(self.name):
            return list(self._open())

    def __iter__(self) -> Iterator[Any]:
        return iter(self.readline, "" if "b" not in self.mode else b"")

    def write(self, data: Any) -> None:
        """Appends ``data`` (str or bytes, as the mode says)."""
        with _errors(self.name):
            self._open().write(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Moves the read position."""
        with _errors(self.name):
            return int(self._open().seek(offset, whence))

    def tell(self) -> int:
        """The current position."""
        return int(self._open().tell())

    def size(self) -> int:
        """The file's length in bytes."""
        return stat(self.name).length

    def flush(self) -> None:
        """Flushes local buffers (an object is only written at close)."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Finishes the file; on an object store, writes it."""
        file, self._file = self._file, None
        if file is not None:
            with _errors(self.name):
                file.close()
        elif "r" not in self.mode:  # an empty file written: create it
            with _errors(self.name), _fs.open_file(self.name, self.mode.replace("b", "") + "b"):
                pass

    def __enter__(self) -> GFile:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        discard = getattr(self._file, "discard", None)
        if exc_type is not None and discard is not None:
            self._file = None
            discard()
            return
        self.close()


@dataclass(frozen=True)
class FileStatistics:
    """What :func:`stat` returns, as TensorFlow's."""

    length: int
    mtime_nsec: int
    is_directory: bool


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` exists."""
    with _errors(path):
        return _fs.exists(path)


def isdir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory."""
    with _errors(path):
        return _fs.isdir(path)


def glob(pattern: str | os.PathLike[str]) -> list[str]:
    """The paths matching ``pattern``."""
    with _errors(pattern):
        return _fs.glob(pattern)


def listdir(path: str | os.PathLike[str]) -> list[str]:
    """The names of the entries of a directory; NotFoundError if it does not exist."""
    with _errors(path):
        if not _fs.is_url(path) and not os.path.isdir(path):
            raise NotFoundError(f"no such directory: {os.fsdecode(os.fspath(path))}")
        return _fs.listdir(path)


def makedirs(path: str | os.PathLike[str]) -> None:
    """Makes a directory and its missing parents; nothing if it exists."""
    with _errors(path):
        _fs.makedirs(path)


def mkdir(path: str | os.PathLike[str]) -> None:
    """Makes one directory, whose parent must exist."""
    with _errors(path):
        if _fs.is_url(path):
            _fs.makedirs(path)
        else:
            os.mkdir(path)


def remove(path: str | os.PathLike[str]) -> None:
    """Deletes a file."""
    with _errors(path):
        _fs.remove(path)


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str],
           overwrite: bool = False) -> None:
    """Moves ``src`` to ``dst``; AlreadyExistsError if ``dst`` exists and not ``overwrite``."""
    with _errors(src):
        _fs.rename(src, dst, overwrite=overwrite)


def copy(src: str | os.PathLike[str], dst: str | os.PathLike[str],
         overwrite: bool = False) -> None:
    """Copies a file (across file systems too); AlreadyExistsError if ``dst`` exists and not
    ``overwrite``."""
    if not overwrite and exists(dst):
        raise AlreadyExistsError(f"already exists: {os.fsdecode(os.fspath(dst))}")
    with _errors(src):
        data = _fs.read_bytes(src)
    with _errors(dst):
        _fs.atomic_write(dst, data)


def rmtree(path: str | os.PathLike[str]) -> None:
    """Deletes a directory and everything below it."""
    with _errors(path):
        _fs.rmtree(path)


def stat(path: str | os.PathLike[str]) -> FileStatistics:
    """Length, modification time and kind of ``path``."""
    with _errors(path):
        found = _fs.stat(path)
    mtime = found["mtime"]
    return FileStatistics(found["size"], int(mtime * 1e9) if mtime else 0, found["isdir"])


def walk(top: str | os.PathLike[str], topdown: bool = True,
         onerror: Callable[[ConvoyError], None] | None = None,
         ) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(directory, subdirectory names, file names)`` for ``top`` and each directory below
    it, parents first unless ``topdown`` is False; errors go to ``onerror`` (or are
    skipped)."""
    top = os.fsdecode(os.fspath(top))
    try:
        with _errors(top):
            entries = _fs.scandir(top)
    except (NotFoundError, PermissionDeniedError, FailedPreconditionError) as e:
        if onerror is not None:
            onerror(e)
        return
    subdirs = [name for name, is_dir in entries if is_dir]
    files = [name for name, is_dir in entries if not is_dir]
    if topdown:
        yield top, subdirs, files
    for name in subdirs:
        yield from walk(_fs.join(top, name), topdown, onerror)
    if not topdown:
        yield top, subdirs, files


def read_file(filename: str | os.PathLike[str]) -> bytes:
    """A whole file's content, as ``tf.io.read_file`` (bytes for its scalar string)."""
    with _errors(filename):
        return _fs.read_bytes(filename)


def write_file(filename: str | os.PathLike[str], contents: bytes | str) -> None:
    """Writes ``contents`` as the whole file, as ``tf.io.write_file``: readers see the old
    file or the new one, never a part (a str is written as UTF-8)."""
    data = contents.encode() if isinstance(contents, str) else bytes(contents)
    with _errors(filename):
        parent = os.path.dirname(os.fsdecode(os.fspath(filename)))
        if parent and not _fs.is_url(filename):
            _fs.makedirs(parent)
        _fs.atomic_write(filename, data)
