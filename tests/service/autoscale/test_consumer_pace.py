"""A consumer's pace counts the elements it takes as it takes each: a batch that arrives in one
report's window and is consumed over the next ones gives each report the consumer's true
time per element (a batch counted on arrival made one report see hundreds of elements in a
fraction of a second and the estimate several times too high)."""

from __future__ import annotations

import pytest

from convoy.data.service._common.pace import ConsumerPace


def test_a_batch_taken_over_two_reports_gives_each_the_consumers_pace() -> None:
    now = [0.0]
    pace = ConsumerPace(clock=lambda: now[0])
    pace.wait_started()
    now[0] = 0.1          # a batch of 20 arrives after 0.1 s
    pace.wait_ended()
    for _ in range(10):   # the consumer takes one every 10 ms
        now[0] += 0.01
        pace.took()
    assert pace.report() == pytest.approx((0.01, 0.1, 0.2))  # 0.1 s busy, 10 taken
    for _ in range(10):
        now[0] += 0.01
        pace.took()
    assert pace.report() == pytest.approx((0.01, 0.0, 0.1))
