"""The exceptions convoy raises, one tree for the whole package.

::

    ConvoyError
     ├── CancelledError            (also concurrent.futures.CancelledError)
     ├── UnknownError
     ├── InvalidArgumentError      (also ValueError)
     ├── DeadlineExceededError     (also TimeoutError)
     ├── NotFoundError             (also LookupError)
     ├── AlreadyExistsError
     ├── PermissionDeniedError     (also PermissionError)
     ├── UnauthenticatedError
     ├── ResourceExhaustedError
     ├── FailedPreconditionError   (also RuntimeError)
     ├── AbortedError
     ├── OutOfRangeError           (also IndexError)
     ├── UnimplementedError        (also NotImplementedError)
     ├── InternalError
     ├── UnavailableError          (also ConnectionError)
     └── DataLossError

Each class carries the name of the gRPC status code it travels as (``grpc_code``); servers
send :func:`grpc_code_name` of an exception as the status and clients turn a status back into
the same exception with :func:`from_grpc_code`, so a remote error is caught like a local one.
All of them pickle, so they also cross process boundaries inside scheduled functions.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any


class ConvoyError(Exception):
    """Base of every error convoy raises on purpose."""

    grpc_code = "UNKNOWN"

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))

    def __str__(self) -> str:
        return self.message


class CancelledError(ConvoyError, concurrent.futures.CancelledError):
    """An operation was cancelled, usually because another one failed first."""

    grpc_code = "CANCELLED"


class UnknownError(ConvoyError):
    """An error with no better category, e.g. an exception from a user function on a server."""

    grpc_code = "UNKNOWN"


class InvalidArgumentError(ConvoyError, ValueError):
    """An argument had a wrong value, type or structure."""

    grpc_code = "INVALID_ARGUMENT"


class DeadlineExceededError(ConvoyError, TimeoutError):
    """An operation did not finish within its deadline."""

    grpc_code = "DEADLINE_EXCEEDED"


class NotFoundError(ConvoyError, LookupError):
    """A named thing (dataset id, job, file, variable) does not exist."""

    grpc_code = "NOT_FOUND"


class AlreadyExistsError(ConvoyError):
    """Something to be created exists already."""

    grpc_code = "ALREADY_EXISTS"


class PermissionDeniedError(ConvoyError, PermissionError):
    """The caller may not do this."""

    grpc_code = "PERMISSION_DENIED"


class UnauthenticatedError(ConvoyError):
    """The caller did not prove who it is."""

    grpc_code = "UNAUTHENTICATED"


class ResourceExhaustedError(ConvoyError):
    """A limit (memory, queue size, message size) was reached."""

    grpc_code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(ConvoyError, RuntimeError):
    """The system is not in a state where this operation can run."""

    grpc_code = "FAILED_PRECONDITION"


class AbortedError(ConvoyError):
    """An operation was aborted, typically by a concurrency conflict."""

    grpc_code = "ABORTED"


class OutOfRangeError(ConvoyError, IndexError):
    """Iteration went past the end of the input."""

    grpc_code = "OUT_OF_RANGE"


class UnimplementedError(ConvoyError, NotImplementedError):
    """The operation is not supported."""

    grpc_code = "UNIMPLEMENTED"


class InternalError(ConvoyError):
    """An invariant of convoy itself was broken: a bug, please report it."""

    grpc_code = "INTERNAL"


class UnavailableError(ConvoyError, ConnectionError):
    """A server could not be reached (yet); retrying later may succeed."""

    grpc_code = "UNAVAILABLE"


class DataLossError(ConvoyError):
    """Stored data is corrupt or truncated."""

    grpc_code = "DATA_LOSS"


#: gRPC status code name -> exception class; the single table both directions use.
BY_GRPC_CODE: dict[str, type[ConvoyError]] = {
    cls.grpc_code: cls
    for cls in (
        CancelledError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        UnauthenticatedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnknownError,
    )
}


def grpc_code_name(error: BaseException) -> str:
    """The gRPC status code name an exception travels as (``UNKNOWN`` for foreign ones)."""
    return error.grpc_code if isinstance(error, ConvoyError) else "UNKNOWN"


def from_grpc_code(code_name: str, message: str) -> ConvoyError:
    """The convoy exception for a gRPC status code name and its details."""
    return BY_GRPC_CODE.get(code_name, UnknownError)(message)


def from_rpc_error(error: Exception, where: str) -> ConvoyError:
    """The convoy exception for a failed gRPC call to ``where`` (a ``grpc.RpcError``)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    details = details or ""
    name = code.name if code is not None else "UNKNOWN"
    if (name in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED")
            and not details.startswith(where)):
        details = f"{where}: {details}"
    return from_grpc_code(name, details)
