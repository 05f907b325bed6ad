"""One file-system layer: local paths go straight to the OS, ``scheme://`` URLs to fsspec.

Every convoy API that takes a path goes through here. A local path (or ``file://`` URL)
costs what ``open``/``os`` cost; anything of the form ``scheme://...`` is a URL and is never
taken for a local path: it goes to that scheme's fsspec file system (``s3://`` through s3fs,
``gs://`` through gcsfs, ``az://``/``abfs://`` through adlfs, ``memory://`` built in) or fails
with one line naming the extra to install. Credentials and endpoints come from each backend's
own environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...).

Errors on URLs are convoy's: a missing bucket or object is :class:`NotFoundError`, a refused
one :class:`PermissionDeniedError`, and transient failures (5xx, throttling, reset
connections) are retried within a bounded budget and then raised as
:class:`UnavailableError`; every message names the URL.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

from convoy.errors import (
    AlreadyExistsError,
    ConvoyError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = ["atomic_write", "exists", "glob", "is_url", "isdir", "join", "listdir",
           "makedirs", "open_file", "read_bytes", "remove", "rename", "rmtree", "stat",
           "write_if_absent"]

log = logging.getLogger(__name__)

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
# The package that brings each scheme's file system, as ``pip install 'convoy[extra]'``.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure",
           "abfs": "azure", "abfss": "azure", "adl": "azure"}
# Object stores have no directories: making one is nothing, a prefix with objects is one.
_OBJECT_STORES = frozenset(_EXTRAS)
# Transient failures: tried this many times in all, waiting between tries (bounded).
ATTEMPTS = 4
_BACKOFF = 0.2
_T = TypeVar("_T")


def is_url(path: Any) -> bool:
    """Whether ``path`` is a ``scheme://`` URL other than ``file://``."""
    match = _URL.match(_text(path))
    return match is not None and match.group(1).lower() != "file"


def _text(path: Any) -> str:
    if isinstance(path, (bytes, bytearray)):
        return os.fsdecode(bytes(path))
    if isinstance(path, (str, os.PathLike)):
        return os.fsdecode(os.fspath(path))
    raise InvalidArgumentError(f"path: expected a str or os.PathLike, got {type(path).__name__}")


def _local(path: Any) -> str:
    text = _text(path)
    return text[len("file://"):] if text.lower().startswith("file://") else text


def join(path: Any, *names: str) -> str:
    """``os.path.join`` for local paths, ``/``-joined for URLs."""
    text = _text(path)
    if not is_url(text):
        return os.path.join(text, *names)
    for name in names:
        text = text.rstrip("/") + "/" + name
    return text


_ENVIRONMENT = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                "AWS_DEFAULT_REGION", "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")


def _filesystem(scheme: str) -> Any:
    """The fsspec file system for ``scheme``: one per process and backend environment."""
    return _filesystem_for(scheme, os.getpid(),
                           tuple(os.environ.get(name) for name in _ENVIRONMENT))


@functools.cache
def _filesystem_for(scheme: str, pid: int, environment: tuple[str | None, ...]) -> Any:
    import fsspec  # type: ignore[import-untyped]

    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError:
        extra = _EXTRAS.get(scheme)
        hint = f"pip install 'convoy[{extra}]'" if extra else "install its fsspec backend"
        raise UnimplementedError(
            f"no file system for {scheme}:// URLs is installed: {hint}") from None
    except ValueError:
        raise UnimplementedError(f"unknown URL scheme {scheme}://") from None
    for name in ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "azure"):
        logger = logging.getLogger(name)  # their INFO lines (credentials found...) are noise
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    options: dict[str, Any] = {}
    if scheme in ("s3", "s3a"):
        # Bounded: few retries below, ours above; no instance reuse across forks.
        options = {"skip_instance_cache": True, "use_listings_cache": False,
                   "config_kwargs": {"connect_timeout": 10, "read_timeout": 60,
                                     "retries": {"max_attempts": 2}}}
    fs = cls(**options)
    if scheme in ("s3", "s3a"):
        fs.retries = 2
    return fs


def _split(path: Any) -> tuple[Any, str, str]:
    """(file system, its path, the URL as shown) of a URL."""
    url = _text(path)
    scheme = _URL.match(url).group(1).lower()  # type: ignore[union-attr]
    fs = _filesystem(scheme)
    return fs, fs._strip_protocol(url), url


def _is_object_store(url: str) -> bool:
    match = _URL.match(url)
    return match is not None and match.group(1).lower() in _OBJECT_STORES


def _translate(error: BaseException, url: str) -> ConvoyError | None:
    """convoy's error for a backend's, or None for a transient one worth retrying."""
    if isinstance(error, ConvoyError):
        return error
    if isinstance(error, FileNotFoundError):
        return NotFoundError(f"no such file, directory or bucket: {url}")
    if isinstance(error, PermissionError):
        return PermissionDeniedError(f"permission denied: {url}")
    if isinstance(error, FileExistsError):
        return AlreadyExistsError(f"already exists: {url}")
    if isinstance(error, IsADirectoryError):
        return FailedPreconditionError(f"is a directory: {url}")
    if isinstance(error, NotADirectoryError):
        return FailedPreconditionError(f"not a directory: {url}")
    if isinstance(error, (ValueError, TypeError)):
        return InvalidArgumentError(f"{url}: {error}")
    return None


def _call(url: str, what: str, function: Callable[[], _T]) -> _T:
    """``function()`` on a URL, transient failures retried within the budget."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return function()
        except Exception as e:  # noqa: BLE001 - every backend error is mapped below
            error = _translate(e, url)
            if error is not None:
                raise error from e
            if attempt == ATTEMPTS:
                raise UnavailableError(
                    f"{what} {url} failed {ATTEMPTS} times, last: {type(e).__name__}: {e}"
                ) from e
            delay = _BACKOFF * 2 ** (attempt - 1) * (0.5 + random.random())
            log.warning("%s %s failed (%s: %s); retrying in %.1fs", what, url,
                        type(e).__name__, e, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class _WriteFile:
    """A URL's file being written: only :meth:`close` publishes it; a ``with`` block left by
    an exception, or :meth:`discard`, throws the partial object away."""

    def __init__(self, file: Any, url: str) -> None:
        self._file = file
        self._url = url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def write(self, data: Any) -> int:
        return _call(self._url, "writing", lambda: self._file.write(data))

    def flush(self) -> None:
        # Parts go up by themselves once large; an object is only visible at close.
        pass

    def close(self) -> None:
        if not self._file.closed:
            _call(self._url, "writing", self._file.close)

    def __del__(self) -> None:
        if not self._file.closed:  # never closed: nothing appears (fsspec's would publish)
            self.discard()

    def discard(self) -> None:
        """Drops what was written: the object is not created."""
        with contextlib.suppress(Exception):
            self._file.discard()
        with contextlib.suppress(Exception):
            self._file.closed = True

    @property
    def closed(self) -> bool:
        return bool(self._file.closed)

    def __enter__(self) -> _WriteFile:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


class _ReadFile:
    """A URL's file being read, its errors convoy's and naming the URL."""

    def __init__(self, file: Any, url: str) -> None:
        self._file = file
        self._url = url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def read(self, size: int = -1) -> bytes:
        return _call(self._url, "reading", lambda: self._file.read(size))

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._file)

    def __enter__(self) -> _ReadFile:
        return self

    def __exit__(self, *_: Any) -> None:
        self._file.close()


def open_file(path: Any, mode: str = "rb", buffering: int = -1,
              **kwargs: Any) -> IO[Any]:
    """``open`` for a local path or a URL. Writing a URL makes its object appear whole at
    ``close`` (or never, when the ``with`` block raises); appending to an object store is
    refused. Text modes take ``encoding``/``newline``/``errors`` as ``open`` does."""
    if not is_url(path):
        return open(_local(path), mode, buffering, **kwargs)  # noqa: SIM115
    fs, inner, url = _split(path)
    binary = mode.replace("t", "")
    if "b" not in binary:
        binary += "b"
    if "a" in mode and _is_object_store(url):
        raise UnimplementedError(f"objects cannot be appended to: {url}")
    if "+" in mode:
        raise UnimplementedError(f"mode {mode!r} is not supported on URLs: {url}")
    if "x" in binary:
        if exists(url):
            raise AlreadyExistsError(f"already exists: {url}")
        binary = binary.replace("x", "w")
    raw = _call(url, "opening", lambda: fs.open(inner, binary))
    file: Any = _ReadFile(raw, url) if "r" in binary else _WriteFile(raw, url)
    if "b" in mode:
        return file
    import io

    return io.TextIOWrapper(file, **kwargs)


def read_bytes(path: Any) -> bytes:
    """A whole file's content."""
    if not is_url(path):
        with open(_local(path), "rb") as file:
            return file.read()
    fs, inner, url = _split(path)
    return _call(url, "reading", lambda: fs.cat_file(inner))


def atomic_write(path: Any, data: bytes) -> None:
    """Writes a whole file so that readers see the old content or the new, never a part:
    locally through a temporary file renamed over ``path``, on a URL as one object."""
    if not is_url(path):
        target = _local(path)
        partial = f"{target}.{os.getpid()}.{random.getrandbits(32):08x}.tmp"
        try:
            with open(partial, "wb") as file:
                file.write(data)
            os.replace(partial, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(partial)
            raise
        return
    fs, inner, url = _split(path)
    _call(url, "writing", lambda: fs.pipe_file(inner, bytes(data)))


def write_if_absent(path: Any, data: bytes) -> bool:
    """Creates ``path`` with ``data`` unless it exists (on S3, ``If-None-Match: *``: of two
    writers exactly one wins); False when it existed."""
    if not is_url(path):
        try:
            with open(_local(path), "xb") as file:
                file.write(data)
        except FileExistsError:
            return False
        return True
    fs, inner, url = _split(path)
    try:
        _call(url, "creating", lambda: fs.pipe_file(inner, bytes(data), mode="create"))
    except AlreadyExistsError:
        return False
    except (UnavailableError, InvalidArgumentError) as e:
        # s3fs reports S3's 412 Precondition Failed as an OSError(EINVAL)
        if "Precondition" in repr(e.__cause__) or "412" in repr(e.__cause__):
            return False
        raise
    return True


def exists(path: Any) -> bool:
    """Whether a file or directory (or, on an object store, a prefix with objects) exists."""
    if not is_url(path):
        return os.path.exists(_local(path))
    fs, inner, url = _split(path)
    return bool(_call(url, "checking", lambda: fs.exists(inner)))


def isdir(path: Any) -> bool:
    """Whether ``path`` is a directory (on an object store: a prefix with objects)."""
    if not is_url(path):
        return os.path.isdir(_local(path))
    fs, inner, url = _split(path)
    return bool(_call(url, "checking", lambda: fs.isdir(inner)))


def glob(pattern: Any) -> list[str]:
    """The paths matching a glob pattern, sorted; URLs keep their scheme."""
    if not is_url(pattern):
        import glob as _glob

        return sorted(_glob.glob(_local(pattern)))
    fs, inner, url = _split(pattern)
    found = _call(url, "listing", lambda: fs.glob(inner))
    return sorted(fs.unstrip_protocol(p) for p in found)


def listdir(path: Any) -> list[str]:
    """The names (not paths) of a directory's entries, sorted."""
    if not is_url(path):
        return sorted(os.listdir(_local(path)))
    fs, inner, url = _split(path)
    entries = _call(url, "listing", lambda: fs.ls(inner, detail=False, refresh=True))
    names = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries}
    names.discard("")
    if not names and not _call(url, "checking", lambda: fs.exists(inner)):
        raise NotFoundError(f"no such directory: {url}")
    return sorted(names)


def makedirs(path: Any) -> None:
    """Makes a directory and its parents (nothing to do on an object store)."""
    if not is_url(path):
        os.makedirs(_local(path), exist_ok=True)
        return
    fs, inner, url = _split(path)
    if not _is_object_store(url):
        _call(url, "making", lambda: fs.makedirs(inner, exist_ok=True))


def remove(path: Any) -> None:
    """Deletes one file."""
    if not is_url(path):
        os.remove(_local(path))
        return
    fs, inner, url = _split(path)
    if not _call(url, "checking", lambda: fs.isfile(inner)):
        raise NotFoundError(f"no such file: {url}")
    _call(url, "deleting", lambda: fs.rm_file(inner))


def rename(source: Any, target: Any, overwrite: bool = True) -> None:
    """Moves a file; on an object store a copy (the target appears whole) then a delete."""
    if is_url(source) != is_url(target):
        raise InvalidArgumentError(f"rename: {_text(source)} and {_text(target)} are not on "
                                   "one file system")
    if not overwrite and exists(target):
        raise AlreadyExistsError(f"already exists: {_text(target)}")
    if not is_url(source):
        os.replace(_local(source), _local(target))
        return
    fs, inner, url = _split(source)
    _, inner_target, _ = _split(target)
    _call(url, "renaming", lambda: fs.mv(inner, inner_target))


def rmtree(path: Any) -> None:
    """Deletes a directory and everything below it."""
    if not is_url(path):
        shutil.rmtree(_local(path))
        return
    fs, inner, url = _split(path)
    if not _call(url, "checking", lambda: fs.exists(inner)):
        raise NotFoundError(f"no such directory: {url}")
    _call(url, "deleting", lambda: fs.rm(inner, recursive=True))


def stat(path: Any) -> dict[str, Any]:
    """``{"size", "mtime", "isdir"}`` of a file or directory (``mtime`` in seconds, or None)."""
    if not is_url(path):
        result = os.stat(_local(path))
        import stat as _stat

        return {"size": result.st_size, "mtime": result.st_mtime,
                "isdir": _stat.S_ISDIR(result.st_mode)}
    fs, inner, url = _split(path)
    info = _call(url, "checking", lambda: fs.info(inner))
    mtime = info.get("LastModified") or info.get("mtime") or info.get("created")
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return {"size": int(info.get("size") or 0), "mtime": mtime,
            "isdir": info.get("type") == "directory"}


def invalidate(path: Any) -> None:
    """Forgets a URL's cached listings (another process may have written below it)."""
    if is_url(path):
        fs, inner, _ = _split(path)
        fs.invalidate_cache(inner)


def glob_below(directory: Any, *pattern: str) -> list[str]:
    """The paths matching ``pattern`` (joined parts) below ``directory``, whose own name is
    taken literally, sorted."""
    import glob as _glob

    text = _text(directory)
    return glob(join(text if is_url(text) else _glob.escape(text), *pattern))


def scandir(path: Any) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` of a directory's entries, sorted by name."""
    if not is_url(path):
        with os.scandir(_local(path)) as entries:
            return sorted((e.name, e.is_dir()) for e in entries)
    fs, inner, url = _split(path)
    infos = _call(url, "listing", lambda: fs.ls(inner, detail=True, refresh=True))
    found = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e.get("type") == "directory"
             for e in infos}
    found.pop("", None)
    if not found and not _call(url, "checking", lambda: fs.exists(inner)):
        raise NotFoundError(f"no such directory: {url}")
    return sorted(found.items())
