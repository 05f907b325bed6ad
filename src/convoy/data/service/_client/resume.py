"""A consumer's saved position: what it returned to its caller, and how a new reading resumes.

The saved state is plain data and self-contained: the dataset's fingerprint, the processing
mode and, under DYNAMIC, the iteration's split cursor and, per task, its seed, its split answers
in request order and the element numbers the consumer returned. Restoring creates a new job
whose iteration starts at the saved cursor and runs each saved task again: replaying its split
answers with its seed, the pipeline makes the same elements under the same numbers, and the
returned ones are skipped. Under OFF the state is each worker's seed and count of elements
returned, by worker address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import ranges as _ranges
from convoy.errors import InvalidArgumentError, UnimplementedError

STATE_VERSION = 1


@dataclass
class Returned:
    """What a consumer returned to its caller: element numbers per task (DYNAMIC), counts per
    task (OFF). Batches are committed whole; the batch being returned is counted apart."""

    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)

    def commit(self, task_id: int, numbers: tuple[tuple[int, int], ...], count: int) -> None:
        """The first ``count`` elements of a batch of ``task_id`` (numbered ``numbers``, or
        not numbered) were returned."""
        self.counts[task_id] = self.counts.get(task_id, 0) + count
        if not numbers:
            return
        task_ranges = self.ranges.setdefault(task_id, [])
        for start, stop in numbers:
            take = min(count, stop - start)
            if take <= 0:
                break
            _ranges.add(task_ranges, start, start + take)
            count -= take


def saved_state(fingerprint: str, mode: str, point: pb.GetResumePointResponse,
                returned: Returned) -> dict[str, Any]:
    """The plain-data state of a consumer that returned ``returned`` of the iteration
    described by ``point``."""
    tasks = []
    for info in point.tasks:
        task = info.task
        if mode == "DYNAMIC":
            if not task.splits:
                continue  # it read no split: the saved cursor covers it
            consumed = [(s.start, s.stop) for s in task.skip]
            for start, stop in returned.ranges.get(info.task_id, ()):
                _ranges.add(consumed, start, stop)
            tasks.append({"seed": task.seed,
                          "splits": [[a.repetition, [[s.start, s.stop] for s in a.splits],
                                      a.end_of_splits] for a in task.splits],
                          "consumed": [list(r) for r in consumed]})
        else:
            tasks.append({"seed": task.seed, "worker_address": task.worker_address,
                          "consumed": task.skip_count + returned.counts.get(info.task_id, 0)})
    state: dict[str, Any] = {"version": STATE_VERSION, "fingerprint": fingerprint,
                             "mode": mode, "tasks": tasks, "iteration": point.iteration_id,
                             "consumers": max(1, point.consumers)}
    if mode == "DYNAMIC":
        state.update(split_repetition=point.split_repetition,
                     split_cursor=point.split_cursor, split_size=point.split_size)
    return state


def resume_point(state: Any, fingerprint: str, mode: str, shared: bool) -> pb.ResumePoint:
    """The ResumePoint message of a saved ``state``; InvalidArgumentError if it is not one
    of this dataset and mode. ``shared``: the consumers of the saved job resume together."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise InvalidArgumentError(
            "state must be a dict returned by state_dict() of a data service iterator, got "
            f"{type(state).__name__}")
    if state["mode"] != mode:
        raise InvalidArgumentError(
            f"state was saved by a reading with processing mode {state['mode']}, not {mode}")
    if state["fingerprint"] != fingerprint:
        raise InvalidArgumentError(
            "state was saved by a reading of another dataset (its fingerprint differs): the "
            "pipeline must be built the same way, with the same seeds (a shuffle without a "
            "seed, such as list_files(shuffle=True) without seed, differs in every process)")
    consumers = state["consumers"] if shared else 1
    if mode != "DYNAMIC" and consumers > 1:
        raise UnimplementedError(
            f"a reading of a job shared by {consumers} consumers under {mode} cannot be "
            "restored: their reads interleave in each worker's stream, so a count per worker "
            "does not say which elements each consumed; use DYNAMIC sharding")
    if mode != "DYNAMIC":
        return pb.ResumePoint(consumers=consumers, tasks=[pb.ResumeTask(
            seed=t["seed"], worker_address=t["worker_address"], skip_count=t["consumed"])
            for t in state["tasks"]])
    return pb.ResumePoint(
        consumers=consumers,
        split_repetition=state["split_repetition"], split_cursor=state["split_cursor"],
        split_size=state["split_size"],
        tasks=[pb.ResumeTask(
            seed=t["seed"],
            splits=[pb.SplitAnswer(repetition=rep,
                                   splits=[pb.Split(start=a, stop=b) for a, b in splits],
                                   end_of_splits=end) for rep, splits, end in t["splits"]],
            skip=[pb.Split(start=a, stop=b) for a, b in t["consumed"]])
            for t in state["tasks"]])
