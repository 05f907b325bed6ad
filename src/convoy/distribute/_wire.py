"""The training cluster's wire: its two services, their methods, and every message's layout.

Every message is one codec element (pickle protocol 5, arrays out of band):

- a parameter server's ``Execute`` takes a list of operation lists (see
  :mod:`convoy.distribute._store`) and answers one :class:`~convoy._transport.rpc.Outcome` per list
  (its results or its error);
- a worker's ``Run`` takes a non-empty list of :data:`Call` and answers each one's pickled
  Outcome, so a function's own failure is told apart from the worker's (the call's status);
- ``Cancel``, ``Withdraw`` and ``Free`` take a list of ids (calls, per-worker resources) and
  answer an int; ``Ping`` takes None and answers the worker's incarnation.

Both ``Execute`` and ``Run`` carry several callers' work per message when there is a queue: the
fixed cost of a call would otherwise dominate small training steps.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, NamedTuple

import cloudpickle

from convoy._transport import rpc as _rpc
from convoy._transport.rpc import Outcome
from convoy._values.codec import Encoder, decode
from convoy.errors import (
    CancelledError,
    DataLossError,
    InvalidArgumentError,
    UnavailableError,
    UnknownError,
)

PS_SERVICE = "convoy.distribute.ParameterServer"
WORKER_SERVICE = "convoy.distribute.Worker"
#: A ps's ``Execute`` runs operation lists; ``FramedPort`` takes None and answers the port of
#: its framed transport for ``Execute`` (see :mod:`convoy._transport.framed`), or None if it
#: has none.
PS_METHODS = [_rpc.Method("Execute", None, None, streamed=True),
              _rpc.Method("FramedPort", None, None)]
#: The environment variable that chooses how a process's ``Execute`` messages (to a ps) and
#: ``Run`` messages (to a worker) travel: ``framed`` (the default: the server's framed port,
#: gRPC with a server that has none) or ``grpc``; a task with ``grpc`` opens no framed port.
PS_TRANSPORT_ENV = "CONVOY_PS_TRANSPORT"
PS_TRANSPORTS = ("framed", "grpc")
#: Both services' read-only ``Status`` (for ``convoy status``): takes None, answers a dict of
#: plain values (see :func:`convoy.distribute.server.Server.status`).
STATUS = _rpc.Method("Status", None, None)
#: A worker's ``Run`` runs calls; ``Ping`` answers its incarnation; ``Cancel`` cancels calls by
#: id; ``Withdraw`` takes back calls of one-at-a-time Runs that have not started, by id;
#: ``Free`` deletes per-worker resources by id; ``FramedPort`` answers the port of its framed
#: transport for ``Run``, or None.
WORKER_METHODS = [_rpc.Method("Run", None, None, streamed=True), _rpc.Method("Ping", None, None),
                  _rpc.Method("Cancel", None, None), _rpc.Method("Withdraw", None, None),
                  _rpc.Method("Free", None, None), _rpc.Method("FramedPort", None, None)]

#: One call of a ``Run``: (the function's digest, the cloudpickled function, its cloudpickled
#: ``(args, kwargs)``, the id a ``Cancel`` names it by, or None: it cannot be cancelled).
Call = tuple[bytes, bytes, bytes, int | None]

_encoder = Encoder(None)


def ps_transport() -> str:
    """How this process sends (or, a ps, serves) ``Execute``: see :data:`PS_TRANSPORT_ENV`."""
    transport = os.environ.get(PS_TRANSPORT_ENV) or PS_TRANSPORTS[0]
    if transport not in PS_TRANSPORTS:
        raise InvalidArgumentError(f"${PS_TRANSPORT_ENV} must be one of {PS_TRANSPORTS}, got "
                                   f"{transport!r}")
    return transport


def encode(value: Any) -> bytes:
    """``value`` as a message."""
    return _encoder.encode([value])


def decode_one(payload: bytes | memoryview) -> Any:
    """The value of a message; DataLossError if it is not one element."""
    elements = decode(payload)
    if len(elements) != 1:
        raise DataLossError(f"expected a message of one element, got {len(elements)}")
    return elements[0]


# ----- Execute ----------------------------------------------------------------------------------
def load_operation_lists(request: bytes | memoryview) -> list[Any]:
    """The operation lists of an ``Execute`` request (each list is checked as it runs)."""
    batch = decode_one(request)
    if type(batch) is not list:
        raise InvalidArgumentError(f"Execute takes a list of operation lists, got "
                                   f"{type(batch).__name__}")
    return batch


def load_execute_answer(answer: bytes | memoryview, count: int,
                        address: str) -> list[Outcome]:
    """The ``count`` outcomes of an ``Execute`` answer from the ps at ``address``."""
    outcomes = decode_one(answer)
    if (type(outcomes) is not list or len(outcomes) != count
            or not all(type(outcome) is Outcome for outcome in outcomes)):
        raise DataLossError(f"Execute at {address}: {count} operation lists got an answer "
                            f"that is not {count} outcomes")
    return outcomes


# ----- Run ----------------------------------------------------------------------------------
def is_call(call: Any) -> bool:
    """Whether ``call`` has the layout of a :data:`Call`."""
    return (type(call) is tuple and len(call) == 4
            and all(type(part) is bytes for part in call[:3])
            and (call[3] is None or type(call[3]) is int))


class WithdrawnError(CancelledError):
    """The outcome of a call withdrawn before it started: the coordinator runs it elsewhere."""


class WorkerReplacedError(UnavailableError):
    """A Run reached a worker process other than the one the coordinator last saw (a task
    restarted at the same address): it ran nothing, as the new process lacks the resources
    the calls may use."""


class RunRequest(NamedTuple):
    """A worker ``Run`` request: ``calls`` the worker runs at once; ``one_at_a_time``: only
    once no other such Run runs there (it may wait, and be withdrawn meanwhile);
    ``incarnation``: the worker process they are meant for (None: any); ``followed``: the
    coordinator had more closures queued, so another Run is likely to come soon."""

    calls: list[Any]
    one_at_a_time: bool = False
    incarnation: str | None = None
    followed: bool = False


def run_request(calls: list[Call], one_at_a_time: bool = False,
                incarnation: str | None = None, followed: bool = False) -> bytes:
    """A worker ``Run`` request (see :class:`RunRequest`)."""
    if one_at_a_time or incarnation is not None or followed:
        return encode((calls, one_at_a_time, incarnation, followed))
    return encode(calls)


def load_run_request(request: bytes | memoryview) -> RunRequest:
    """A ``Run`` request's fields (each call is checked as it runs)."""
    fields = decode_one(request)
    if type(fields) is tuple and len(fields) == 4 and type(fields[1]) is bool \
            and (fields[2] is None or type(fields[2]) is str) and type(fields[3]) is bool:
        loaded = RunRequest(*fields)
    else:
        loaded = RunRequest(fields)
    if type(loaded.calls) is not list or not loaded.calls:
        raise InvalidArgumentError(f"Run takes a non-empty list of calls, got "
                                   f"{type(loaded.calls).__name__}")
    return loaded


def run_answer(outcomes: list[bytes]) -> bytes:
    """A ``Run`` answer: each call's pickled Outcome, in the order of the calls."""
    return encode(outcomes)


def pickle_outcome(outcome: Outcome) -> bytes:
    """``outcome`` as a ``Run`` answer carries it; a value or error that does not pickle
    becomes an UnknownError that describes it."""
    pickled: bytes
    if outcome.error is None and type(outcome.value) in _PLAIN:  # a step's usual None
        return pickle.dumps(outcome, protocol=5)  # a tenth of cloudpickle's cost
    try:
        pickled = cloudpickle.dumps(outcome)
    except Exception as error:  # the result or exception does not pickle
        what = outcome.value if outcome.ok else outcome.error
        pickled = cloudpickle.dumps(Outcome(error=UnknownError(
            f"{type(what).__name__} from a scheduled function could not be sent back: "
            f"{error}; it was: {what!r:.200}")))
    return pickled


#: Results pickled as they are, without cloudpickle (nothing in them is sent by value).
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})


def load_outcomes(answer: bytes | memoryview) -> list[Outcome]:
    """The :class:`Outcome` of each call of a ``Run`` answer."""
    outcomes = []
    for pickled in decode_one(answer):
        try:
            outcome = cloudpickle.loads(pickled)
        except Exception as error:  # e.g. an exception class this process cannot import
            outcome = Outcome(error=UnknownError(
                f"a scheduled function's result could not be unpickled here: "
                f"{type(error).__name__}: {error}"))
        if type(outcome) is not Outcome:
            raise DataLossError(f"a Run answer holds {outcome!r:.100}, not an Outcome")
        outcomes.append(outcome)
    return outcomes


# ----- Cancel, Free, Ping ---------------------------------------------------------------------
def load_ids(request: bytes, method: str, what: str) -> list[int]:
    """The ids of a ``Cancel`` or ``Free`` request (``what`` names them)."""
    ids = decode_one(request)
    if type(ids) is not list or not all(type(i) is int for i in ids):
        raise InvalidArgumentError(f"{method} takes a list of {what} ids (ints)")
    return ids
