"""The bound on the bytes one worker buffers across its tasks (``max_buffered_bytes``), and
paused tasks: their producers wait, re-checking that they were not stopped."""

from __future__ import annotations

import time
from collections.abc import Callable

import cloudpickle
import numpy as np

import convoy as cv
from convoy.data.service._worker.task import BufferBudget, Task

ROW = 64 << 10  # bytes of one element


def task(task_id: int, budget: BufferBudget) -> Task:
    dataset = cv.data.Dataset.range(10_000).map(lambda _: np.zeros(ROW // 8, np.float64))
    return Task(task_id, cloudpickle.dumps(dataset._op), None, None, budget=budget)


def reaches(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s"
        time.sleep(0.02)


def settled(value: Callable[[], int], timeout_s: float = 10.0) -> int:
    """``value()`` once it stops changing for 0.3 s."""
    deadline = time.monotonic() + timeout_s
    last = value()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = value()
        if now == last:
            return now
        last = now
    raise AssertionError(f"still changing after {timeout_s} s: {last}")


def test_tasks_together_buffer_about_the_bound_and_go_on_when_read() -> None:
    budget = BufferBudget(1 << 20)
    tasks = [task(1, budget), task(2, budget)]
    for t in tasks:
        t.start()
    try:
        reaches(lambda: budget.used >= 1 << 20)
        # ... and no further: each producer may overshoot by the element it holds
        assert settled(lambda: budget.used) <= (1 << 20) + 2 * ROW
        # The bound holds 16 rows, shared as the producers raced for it: one task holds at
        # least 8 (which one is up to the scheduler).
        fuller = max(tasks, key=lambda t: t.buffered[0])
        taken = fuller.take(8, 1 << 30, 5.0)
        assert taken is not None and len(taken) == 8
        reaches(lambda: budget.used >= 1 << 20)  # refilled up to the bound
        assert settled(lambda: budget.used) <= (1 << 20) + 2 * ROW
    finally:
        for t in tasks:
            t.stop()
    assert budget.used == 0  # stopped tasks leave the budget


def test_a_paused_task_produces_nothing_new_and_resumes() -> None:
    budget = BufferBudget(1 << 30)
    t = task(1, budget)
    t.paused = True
    t.start()
    try:
        time.sleep(0.3)
        assert budget.used == 0 and t.take(1, 1 << 30, 0.1) == []
        t.paused = False
        taken = t.take(1, 1 << 30, 5.0)
        assert taken is not None and len(taken) == 1
    finally:
        t.stop()


def test_a_stopped_producer_waiting_for_room_ends() -> None:
    budget = BufferBudget(1)
    t = task(1, budget)
    t.start()
    settled(lambda: budget.used)
    t.stop()
    assert t.stopped and t.take(1, 1 << 30, 0.1) is None
