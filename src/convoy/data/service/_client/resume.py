"""A consumer's saved position: what it returned to its caller, and how a new reading resumes.

The saved state is plain data and self-contained: the dataset's fingerprint, the processing
mode and, under DYNAMIC, the iteration's split cursor and, per task, its seed, its split answers
in request order and the element numbers the consumer returned. Restoring creates a new job
whose iteration starts at the saved cursor and runs each saved task again: replaying its split
answers with its seed, the pipeline makes the same elements under the same numbers, and the
returned ones are skipped. Under OFF the state is each worker's seed and count of elements
returned, by worker address.

A coordinated read saves the round its consumer returns next; every consumer of the job saves
the same one when they stop in step. Restoring starts a new job whose consumers read on from
that round. Under OFF each worker's task skips the elements its rounds before it dealt out (the
saved task's count, plus ``num_consumers`` per round it served), so a deterministic pipeline
continues with the elements the saved reading would have read next, on the same workers; under
DYNAMIC the tasks start a fresh pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import ranges as _ranges
from convoy.data.service._common.coordinated import rounds_served
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


def coordinated_state(fingerprint: str, mode: str, point: pb.GetResumePointResponse,
                      rounds: tuple[int, list[int]], returned: Returned,
                      consumer: tuple[int, int]) -> dict[str, Any]:
    """The plain-data state of consumer ``consumer`` (its index, and the number of consumers)
    of a coordinated read that started at round ``rounds[0]`` over the task list ``rounds[1]``
    and returned ``returned`` of the iteration described by ``point``."""
    first_round, order = rounds
    round_index = first_round + sum(returned.counts.values())
    tasks = []
    if mode != "DYNAMIC":
        for info in point.tasks:
            consumed = info.task.skip_count
            if info.task_id in order:
                position = order.index(info.task_id)
                served = (rounds_served(position, len(order), round_index)
                          - rounds_served(position, len(order), first_round))
                consumed += served * consumer[1]
            tasks.append({"seed": info.task.seed, "worker_address": info.task.worker_address,
                          "consumed": consumed})
    return {"version": STATE_VERSION, "fingerprint": fingerprint, "mode": mode,
            "tasks": tasks, "iteration": point.iteration_id, "consumers": consumer[1],
            "round": round_index, "consumer_index": consumer[0]}


def resume_point(state: Any, fingerprint: str, mode: str, shared: bool,
                 consumer: tuple[int, int] | None = None) -> pb.ResumePoint:
    """The ResumePoint message of a saved ``state``; InvalidArgumentError if it is not one
    of this dataset and mode. ``shared``: the consumers of the saved job resume together.
    ``consumer``: the index and number of consumers of a coordinated read."""
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
    if ("round" in state) != (consumer is not None):
        saved_by = "a coordinated read" if "round" in state else "a read without num_consumers"
        raise InvalidArgumentError(
            f"state was saved by {saved_by}: restore it into an iterator read the same way")
    if consumer is not None:
        return _coordinated_point(state, consumer)
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


def _coordinated_point(state: dict[str, Any], consumer: tuple[int, int]) -> pb.ResumePoint:
    """The ResumePoint of a coordinated read's state, restored by consumer ``consumer``."""
    if state["consumers"] != consumer[1]:
        raise InvalidArgumentError(
            f"state was saved by a coordinated read of num_consumers={state['consumers']}, "
            f"not {consumer[1]}")
    if state["consumer_index"] != consumer[0]:
        raise InvalidArgumentError(
            f"state was saved by consumer_index {state['consumer_index']}, not {consumer[0]}: "
            f"each consumer restores its own state")
    # the consumers wait for one another at every round: the iteration need not hold for them
    return pb.ResumePoint(consumers=1, round_index=state["round"], tasks=[pb.ResumeTask(
        seed=t["seed"], worker_address=t["worker_address"], skip_count=t["consumed"])
        for t in state["tasks"]])
