"""Unit tests of the cross-trainer cache's sliding window: no threads, no network."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from convoy.data.service._worker.trainer_window import TrainerWindow
from convoy.errors import InvalidArgumentError


def ten_bytes(element: Any) -> int:
    return 10


def pull(window: TrainerWindow, trainer: str, elements: list[int]) -> list[int]:
    """What ``trainer`` gets: cached elements if any, else ``elements`` pulled and appended."""
    cached = window.read(trainer, 100, 1 << 20)
    if cached:
        return cached
    window.append(trainer, elements)
    return elements


def test_a_second_trainer_reads_what_the_first_pulled():
    window = TrainerWindow(1000, ten_bytes)
    assert pull(window, "A", [0, 1, 2]) == [0, 1, 2]
    assert window.at_head("A") and not window.at_head("B")
    assert window.read("B", 2, 1 << 20) == [0, 1]
    assert window.read("B", 10, 1 << 20) == [2]
    assert window.at_head("B")
    assert window.stats().produced == 3


def test_a_trainer_never_gets_an_element_twice():
    window = TrainerWindow(1000, ten_bytes)
    pull(window, "A", [0, 1])
    assert window.read("A", 10, 1 << 20) == []
    window.append("A", [2])
    assert window.read("A", 10, 1 << 20) == []
    assert window.read("B", 10, 1 << 20) == [0, 1, 2]


def test_reads_stop_near_max_bytes():
    window = TrainerWindow(1000, ten_bytes)
    window.append("A", list(range(10)))
    assert window.read("B", 100, 25) == [0, 1, 2]  # at least one, then until the bytes pass
    assert window.read("B", 100, 1) == [3]


def test_the_window_evicts_the_oldest_beyond_its_bound():
    window = TrainerWindow(50, ten_bytes)
    window.append("A", list(range(8)))
    stats = window.stats()
    assert (stats.cached_elements, stats.cached_bytes, stats.produced) == (5, 50, 8)
    assert window.read("B", 100, 1 << 20) == [3, 4, 5, 6, 7]


def test_a_slow_trainer_skips_ahead_and_is_counted():
    window = TrainerWindow(30, ten_bytes)
    window.append("A", [0, 1])
    assert window.read("B", 1, 1 << 20) == [0]
    window.append("A", [2, 3, 4])  # 0 and 1 leave; B's next (1) is gone
    assert window.read("B", 100, 1 << 20) == [2, 3, 4]
    assert window.skipped("B") == 1
    assert window.stats().skipped == {"B": 1}
    assert window.stats().total_skipped == 1


def test_a_new_trainer_starts_at_the_oldest_cached_element_and_counts_what_it_missed():
    window = TrainerWindow(20, ten_bytes)
    window.append("A", [0, 1, 2, 3])
    assert window.read("late", 100, 1 << 20) == [2, 3]
    assert window.skipped("late") == 2


def test_an_element_larger_than_the_window_is_refused():
    window = TrainerWindow(5, ten_bytes)
    with pytest.raises(InvalidArgumentError,
                       match="element size is larger than the cross-trainer cache size in "
                             "bytes. Got element size: 10 and cache size: 5"):
        window.append("A", [0])
    assert window.stats().produced == 0


def test_appending_needs_the_trainer_at_the_head():
    window = TrainerWindow(1000, ten_bytes)
    window.append("A", [0])
    with pytest.raises(InvalidArgumentError, match="before reading its cached elements"):
        window.append("B", [1])


def test_the_bound_must_be_positive():
    with pytest.raises(InvalidArgumentError, match="max_bytes must be >= 1, got 0"):
        TrainerWindow(0, ten_bytes)


@settings(max_examples=200, deadline=None)
@given(max_bytes=hs.integers(10, 200),
       steps=hs.lists(hs.tuples(hs.sampled_from("ABC"), hs.integers(1, 6)), max_size=60))
def test_each_trainer_reads_an_increasing_run_of_the_produced_elements(max_bytes, steps):
    """Whatever the interleaving: the window never holds more than its bound, every trainer
    gets elements in production order without repeats, and what it neither got nor will get
    is exactly what it skipped."""
    window = TrainerWindow(max_bytes, ten_bytes)
    got: dict[str, list[int]] = {"A": [], "B": [], "C": []}
    for trainer, count in steps:
        fresh = list(range(window.end, window.end + count))
        got[trainer] += pull(window, trainer, fresh)
        assert window.stats().cached_bytes <= max_bytes
    for trainer, elements in got.items():
        assert elements == sorted(set(elements))
        rest = window.read(trainer, 10_000, 1 << 30)  # what is still cached for it
        missed = set(range(window.end)) - set(elements) - set(rest)
        assert len(missed) == window.skipped(trainer)
