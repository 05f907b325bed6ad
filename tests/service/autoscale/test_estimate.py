"""The worker estimate (TensorFlow's auto-scaler) against hand-computed cases and cases ported
from TensorFlow's ``tensorflow/core/data/service/auto_scaler_test.cc``; clocks passed in."""

from __future__ import annotations

import pytest

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.pace import ConsumerPace
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.estimate import (
    WorkerEstimate,
    bounded,
    without_outliers,
    workers_needed,
)
from convoy.data.service._dispatcher.state import DispatcherState

pytestmark = pytest.mark.timeout(30)


def test_consumption_over_mean_throughput_rounded_up() -> None:
    # 600/s demanded; tasks at 200/s each: exactly 3
    assert workers_needed([600.0], [200.0, 200.0]) == 3
    # two consumers 250 + 350 = 600 over a mean of (150 + 250) / 2 = 200: 3
    assert workers_needed([250.0, 350.0], [150.0, 250.0]) == 3
    # 601/s over 200/s: 3.005, rounded up to 4
    assert workers_needed([601.0], [200.0]) == 4
    # tiny demand still needs one
    assert workers_needed([1.0], [1000.0]) == 1
    assert workers_needed([], [200.0]) is None
    assert workers_needed([100.0], []) is None


def test_outliers_replaced_by_the_median() -> None:
    # mean 32.5, sample sd 45: 100 is beyond mean + 1 sd (77.5), so it becomes the median
    # (the upper one of 10, 10, 10, 100: 10); the others stay
    assert without_outliers([10.0, 10.0, 10.0, 100.0]) == [10.0, 10.0, 10.0, 10.0]
    # throughputs 200, 200, 200, 2000: the odd worker counts as 200, so 600/s needs 3
    assert workers_needed([600.0], [200.0, 200.0, 200.0, 2000.0]) == 3
    assert without_outliers([5.0]) == [5.0]


def test_growth_bounded_as_tensorflow() -> None:
    assert bounded(50, 2) == 8        # at most 4x the workers there are
    assert bounded(5000, 1000) == 1500  # at most 500 more
    assert bounded(3, 0) == 3         # no worker yet counts as one: up to 4
    assert bounded(0, 5) == 1


def test_reports_expire_and_jobs_take_the_largest() -> None:
    estimate = WorkerEstimate(ttl_s=10.0)
    estimate.report_consumer(1, 10, 100, 1 / 600, waited_s=0.5, elapsed_s=1.0, now=0.0)
    estimate.report_task(1, 10, 7, 1 / 200, now=0.0)
    estimate.report_consumer(2, 20, 101, 1 / 100, waited_s=0.0, elapsed_s=1.0, now=0.0)
    estimate.report_task(2, 20, 8, 1 / 200, now=0.0)
    assert estimate.job_estimate(1, now=1.0) == 3
    assert estimate.job_estimate(2, now=1.0) == 1
    assert estimate.fleet_estimate(workers=1, now=1.0) == 3
    assert estimate.wait_fraction(now=1.0) == 0.5
    assert estimate.fleet_estimate(workers=1, now=20.0) is None  # all reports stale


def test_a_blocked_task_keeps_its_last_time_while_its_worker_heartbeats() -> None:
    # The broken case: once the consumer slowed, the tasks filled their buffers and measured
    # nothing; their reports expired, the estimate became unknown, and the fleet never shrank.
    estimate = WorkerEstimate(ttl_s=10.0)
    estimate.report_task(1, 10, 7, 1 / 200, now=0.0)
    for now in range(1, 31):  # blocked: heartbeats without a measurement
        estimate.report_consumer(1, 10, 100, 1 / 100, waited_s=0.0, elapsed_s=1.0, now=now)
        estimate.report_task(1, 10, 7, 0.0, now=now)
    assert estimate.fleet_estimate(workers=4, now=30.0) == 1
    # the worker went silent: its task stops counting after the ttl
    estimate.report_consumer(1, 10, 100, 1 / 100, waited_s=0.0, elapsed_s=1.0, now=40.5)
    assert estimate.fleet_estimate(workers=4, now=40.5) is None


def test_a_released_consumer_stops_counting_at_once() -> None:
    estimate = WorkerEstimate()
    estimate.report_task(1, 10, 7, 1 / 200, now=0.0)
    estimate.report_consumer(1, 10, 100, 1 / 600, waited_s=0.5, elapsed_s=1.0, now=0.0)
    estimate.report_consumer(1, 10, 101, 1 / 200, waited_s=0.0, elapsed_s=1.0, now=0.0)
    assert estimate.job_estimate(1, now=0.0) == 4
    estimate.forget_consumer(100)
    assert estimate.job_estimate(1, now=0.0) == 1
    assert estimate.wait_fraction(now=0.0) == 0.0


# ----- ported from auto_scaler_test.cc (times in seconds; one iteration unless named) -----
def _one_iteration(task_times: list[float], consumer_times: list[float]) -> int | None:
    estimate = WorkerEstimate()
    for task_id, seconds in enumerate(task_times):
        estimate.report_task(1, 10, task_id, seconds, now=0.0)
    for client_id, seconds in enumerate(consumer_times):
        estimate.report_consumer(1, 10, client_id, seconds, 0.0, 1.0, now=0.0)
    return estimate.iteration_estimate(10, now=0.0)


def test_tensorflow_expected_estimates() -> None:
    assert _one_iteration([], []) is None                         # InitialState
    assert _one_iteration([], [10e-6]) is None                    # NoRegisteredWorkers
    assert _one_iteration([10e-6], []) is None                    # NoRegisteredConsumers
    assert _one_iteration([0.2], [0.025]) == 8                    # ExpectedEstimate1
    assert _one_iteration([0.2, 0.15], [0.025, 0.05]) == 11       # ExpectedEstimate2
    assert _one_iteration([0.1, 0.2], [0.01, 0.02]) == 20         # ExpectedEstimate3


def test_tensorflow_outliers_replaced() -> None:
    # RemoveOutliersTPT: a consumer at 2,000,000/s counts as the median, 500/s: 1333.3 / 12.5
    assert _one_iteration([0.08], [500e-9, 3e-3, 2e-3]) == 107
    # RemoveOutliersPT: a task at 1,000,000/s counts as the median, 14.29/s: 3333.3 / 13.69
    assert _one_iteration([0.08, 0.07, 1e-6], [300e-6]) == 244


def test_tensorflow_the_largest_iteration_and_the_growth_bounds() -> None:
    # MultipleIterationsAutoScalerTest.GetOptimalNumberOfWorkersExpectedEstimate2: the
    # largest of 8, 11 and 20, whatever the job of each iteration
    estimate = WorkerEstimate()
    for iteration, job, tasks, consumers in ((0, 1, [0.2], [0.025]),
                                             (1, 1, [0.2, 0.15], [0.025, 0.05]),
                                             (2, 2, [0.1, 0.2], [0.01, 0.02])):
        for task_id, seconds in enumerate(tasks):
            estimate.report_task(job, iteration, 100 * iteration + task_id, seconds, now=0.0)
        for client_id, seconds in enumerate(consumers):
            estimate.report_consumer(job, iteration, 100 * iteration + client_id, seconds,
                                     0.0, 1.0, now=0.0)
    assert estimate.job_estimate(1, now=0.0) == 11
    assert estimate.job_estimate(2, now=0.0) == 20
    assert estimate.fleet_estimate(workers=20, now=0.0) == 20
    # UpdateOptimalNumberOfWorkersMetric...: within 4x, 4x, 500 more, 100k at most
    assert bounded(50, 15) == 50
    assert bounded(10, 2) == 8
    assert bounded(10_000, 1000) == 1500
    assert bounded(200_000, 99_700) == 100_000


def test_state_takes_reports_from_heartbeats() -> None:
    state = DispatcherState()
    dataset = state.apply(ev.RegisterDataset("f", b"ds", "", b"", -1, 4))
    job = state.apply(ev.GetOrCreateJob(dataset, "", ev.JobOptions(ShardingPolicy.DYNAMIC)))
    for address in ("w1:1", "w2:1"):
        state.apply(ev.WorkerHeartbeat(address, "u-" + address, (), now=0.0))
    _, client = state.apply(ev.GetOrCreateIteration(job, 0, now=0.0))
    assert state.optimal_workers(now=0.0) is None
    tasks = sorted(state.tasks)
    state.apply(ev.WorkerHeartbeat("w1:1", "u-w1:1", (tasks[0],), now=1.0,
                                   processing=((tasks[0], 5_000_000),)))
    state.apply(ev.WorkerHeartbeat("w2:1", "u-w2:1", (tasks[1],), now=1.0,
                                   processing=((tasks[1], 5_000_000),)))
    state.apply(ev.ClientHeartbeat(client, now=1.0, target_time_s=1 / 500, waited_s=0.3,
                                   elapsed_s=1.0))
    # 500/s over 200/s per task: 2.5, so 3 (within 4 x 2 workers)
    assert state.optimal_workers(now=1.0, job_id=job) == 3
    assert state.optimal_workers(now=1.0) == 3
    assert state.optimal_workers(now=30.0) is None  # the reports went stale


def test_consumer_pace_with_a_clock() -> None:
    now = [0.0]
    pace = ConsumerPace(clock=lambda: now[0])
    pace.wait_started()
    now[0] = 0.4          # waited 0.4 s for a batch of 10
    pace.wait_ended(10)
    now[0] = 1.0          # then spent 0.6 s on them: 60 ms each
    target, waited, elapsed = pace.report()
    assert (target, waited, elapsed) == pytest.approx((0.06, 0.4, 1.0))
    pace.wait_started()
    now[0] = 1.5          # a wait in progress counts up to the report
    assert pace.report() == pytest.approx((0.0, 0.5, 0.5))


def test_the_gauge_has_a_sample_only_once_known() -> None:
    from convoy import monitoring

    def gauge(*stats: monitoring.DispatcherStats) -> list[float]:
        families = {f.name: f for f in monitoring._dispatcher_families(list(stats))}
        return [sample.value for sample in families["convoy_data_optimal_workers"].samples]

    assert gauge(monitoring.DispatcherStats()) == []
    assert gauge(monitoring.DispatcherStats(optimal_workers=3)) == [3]


def test_heartbeats_with_reports_round_trip_through_the_journal_format() -> None:
    from convoy.data.service._dispatcher.journal_format import decode_event, encode_event

    for event in (ev.WorkerHeartbeat("w:1", "u", (5,), 1.5, processing=((5, 4_999_999),)),
                  ev.ClientHeartbeat(3, 1.5, target_time_s=0.0017, waited_s=0.25,
                                     elapsed_s=1.0)):
        assert decode_event(encode_event(event)) == event
