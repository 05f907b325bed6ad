"""The events the coordinator's scheduling state machine takes and the instructions it gives
(:mod:`convoy.distribute._schedule_state`): frozen dataclasses, compared by value."""

from __future__ import annotations

from dataclasses import dataclass

from convoy._transport.rpc import Outcome

# ----- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """The coordinator starts: each worker's answer to a first ping (None: it is probed)."""
    incarnations: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Scheduled:
    closure_id: int


@dataclass(frozen=True, slots=True)
class Take:
    """A lane is free: it runs the :class:`Run` returned, or waits for a :class:`Wake`."""
    worker: int
    lane: int


@dataclass(frozen=True, slots=True)
class Finished:
    """A lane's Run answered: one outcome per closure, in the Run's order."""
    worker: int
    lane: int
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """A call found the worker unreachable: the Run of ``lane``, or another (``lane`` None)."""
    worker: int
    lane: int | None = None


@dataclass(frozen=True, slots=True)
class GraceOver:
    """The grace period of a :class:`CancelRunning` has passed."""
    worker: int
    lane: int
    closure_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkerBack:
    """A probed worker answered, as the process ``incarnation``."""
    worker: int
    incarnation: str


@dataclass(frozen=True, slots=True)
class Rebuilt:
    worker: int
    resource_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RebuildFailed:
    """Rebuilding ``resource_id`` raised ``error``, or found the worker ``unreachable``."""
    worker: int
    resource_id: int
    error: BaseException
    unreachable: bool = False


@dataclass(frozen=True, slots=True)
class ResourceAdded:
    """A per-worker resource was created; ``what`` names it in errors ("per-worker dataset")."""
    resource_id: int
    what: str


@dataclass(frozen=True, slots=True)
class Built:
    """A :class:`Build` succeeded."""
    worker: int
    resource_id: int


@dataclass(frozen=True, slots=True)
class ResourceDropped:
    """The resource is dropped (its creation failed, or the chief holds it no more): it is
    freed on the workers and not rebuilt."""
    resource_id: int


@dataclass(frozen=True, slots=True)
class ErrorTaken:
    """``join``, ``done`` or ``schedule`` takes the pending error; only once nothing runs."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The coordinator shuts down: queued and running closures are cancelled, waiting lanes
    woken, resources freed."""


Event = (Start | Scheduled | Take | Finished | WorkerLost | GraceOver | WorkerBack | Rebuilt
         | RebuildFailed | ResourceAdded | Built | ResourceDropped | ErrorTaken | Closed)


# ----- instructions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Send the closures to the worker on the lane; ``followed``: more were queued."""
    worker: int
    lane: int
    closure_ids: tuple[int, ...]
    followed: bool = False


@dataclass(frozen=True, slots=True)
class Resolve:
    """Set the closure's RemoteValue."""
    closure_id: int
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Wake:
    """The lane has work: it should :class:`Take` again."""
    worker: int
    lane: int


@dataclass(frozen=True, slots=True)
class CancelRunning:
    """Another closure failed: ask the worker to stop these (they resolve with its answer),
    and report :class:`GraceOver` after the grace period."""
    worker: int
    lane: int
    closure_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Abandon:
    """Stop waiting for the lane's Run of these closures (resolved as cancelled already): cut
    its call short, and ask the worker to stop them. Its answer, if any, is dropped."""
    worker: int
    lane: int
    closure_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Ask the worker to give back the lane's Run sent ahead, unless it started: it answers
    its closures as withdrawn (WithdrawnError), and they are queued again."""
    worker: int
    lane: int
    closure_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Probe:
    """Ping the worker until it answers as a process other than ``unless``."""
    worker: int
    unless: str | None = None


@dataclass(frozen=True, slots=True)
class Rebuild:
    """Build these resources on the worker, in order; :class:`Rebuilt` or RebuildFailed."""
    worker: int
    resource_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Build:
    """Build a new resource on the worker; :class:`Built` or WorkerLost."""
    worker: int
    resource_id: int


@dataclass(frozen=True, slots=True)
class Free:
    """Delete these resources on the worker (best effort: a worker gone has lost them)."""
    worker: int
    resource_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RaiseError:
    error: BaseException


Instruction = (Run | Resolve | Wake | CancelRunning | Abandon | Withdraw | Probe | Rebuild | Build
               | Free | RaiseError)
