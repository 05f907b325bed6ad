"""What a dispatcher takes at most: checked before an event is applied, never on replay.

The limits guard a dispatcher against a client (buggy, or holding the secret but careless)
that would fill its memory and journal; a refused request leaves the state unchanged and the
dispatcher serves everyone else as before.
"""

from __future__ import annotations

from typing import Protocol

from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.state import DispatcherState
from convoy.errors import ResourceExhaustedError


class Limits(Protocol):
    """The limits of a dispatcher (its ``DispatcherConfig`` has them)."""

    @property
    def max_datasets(self) -> int: ...

    @property
    def max_jobs(self) -> int: ...

    @property
    def max_dataset_bytes(self) -> int: ...


def admit(config: Limits, state: DispatcherState, event: ev.Event) -> None:
    """Raise :class:`ResourceExhaustedError`, naming the limit, if applying ``event`` to
    ``state`` would go beyond one of ``config``'s limits."""
    if isinstance(event, ev.RegisterDataset):
        if len(event.payload) > config.max_dataset_bytes:
            raise ResourceExhaustedError(
                f"the dataset pickles to {len(event.payload):,} bytes, more than this "
                f"dispatcher's max_dataset_bytes ({config.max_dataset_bytes:,}): read large "
                "data from files on the workers rather than capturing it in the pipeline")
        if len(state.datasets) >= config.max_datasets and _adds_dataset(state, event):
            raise ResourceExhaustedError(
                f"this dispatcher holds {len(state.datasets):,} datasets, its max_datasets: "
                "register no more, or restart it with a larger max_datasets (--max-datasets)")
    elif isinstance(event, ev.GetOrCreateJob) and event.job_name not in state.named_jobs:
        # finished named jobs (tombstones) are not counted: they are bounded on their own
        live = len(state.jobs) - len(state.records.tombstones)
        if live >= config.max_jobs:
            raise ResourceExhaustedError(
                f"this dispatcher holds {live:,} jobs, its max_jobs (finished named jobs "
                "not counted): restart it with a larger max_jobs (--max-jobs)")


def _adds_dataset(state: DispatcherState, event: ev.RegisterDataset) -> bool:
    """Whether registering makes a new dataset (an equal one, or one of the same requested
    id, is answered with the one registered)."""
    if event.requested_id:
        return event.requested_id not in state.datasets
    return all(record.fingerprint != event.fingerprint for record in state.datasets.values())
