"""LocalCluster: the adaptive policy with a clock passed in, and ``adapt`` end to end on real
processes (it grows while the consumer waits, shrinks once it slows, and every element arrives
exactly once); the estimate on a real dispatcher's status and /metrics."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import cloudpickle
import pytest

import convoy as cv
from convoy.data import Dataset
from convoy.data.service import LocalCluster, WorkerConfig, distribute
from convoy.data.service._client.status import dispatcher_status
from convoy.data.service._local_cluster import AdaptPolicy, ThroughputPolicy

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_policy_grows_at_once_when_consumers_wait_and_shrinks_after_the_cooldown() -> None:
    policy = AdaptPolicy(minimum=1, maximum=6, cooldown_s=10.0)
    assert policy.decide(0.0, 1, None, None) is None            # nothing known yet
    assert policy.decide(0.0, 1, 3, 0.01) is None                # more needed, nobody waits
    assert policy.decide(0.0, 1, 9, 0.5) == (6, "scale up: estimate 9, consumers waited "
                                              "50% of the time")  # bounded by the maximum
    assert policy.decide(1.0, 6, 2, 0.0) is None                 # lower: the cool-down starts
    assert policy.decide(6.0, 6, 3, 0.0) is None
    assert policy.decide(9.0, 6, 6, 0.0) is None                 # back up: it starts again
    assert policy.decide(10.0, 6, 2, 0.0) is None
    decision = policy.decide(21.0, 6, 2, 0.0)
    assert decision is not None and decision[0] == 2 and "lower than 6 for 10 s" in decision[1]
    assert policy.decide(21.0, 0, None, None) == (1, "below the minimum 1")


def test_policy_cooldown_goes_on_while_the_estimate_is_unknown() -> None:
    # The case that kept the fleet from shrinking: the estimate turned unknown now and then
    # once demand dropped, and each unknown restarted the cool-down.
    policy = AdaptPolicy(minimum=1, maximum=8, cooldown_s=20.0)
    assert policy.decide(0.0, 4, 1, 0.0) is None                 # lower: the cool-down starts
    assert policy.decide(5.0, 4, None, None) is None
    assert policy.decide(10.0, 4, 1, 0.0) is None
    assert policy.decide(15.0, 4, None, 0.0) is None
    assert policy.decide(20.0, 4, 1, 0.0) == (
        1, "scale down: estimate 1, consumers waited 0% of the time; lower than 4 for 20 s")
    # an unknown estimate does not start one either
    assert policy.decide(30.0, 1, None, None) is None


def test_policy_at_steady_state_makes_no_change() -> None:
    policy = AdaptPolicy(minimum=1, maximum=8, cooldown_s=20.0)
    decisions = [policy.decide(float(now), 3, estimate, 0.0)
                 for now, estimate in enumerate([3, 3, 2, 3, 3, 4, 3, 2, 3] * 20)]
    assert decisions == [None] * len(decisions)


def test_throughput_policy_climbs_while_it_gains_and_backs_off_a_failed_shrink() -> None:
    policy = ThroughputPolicy(minimum=1, maximum=8, cooldown_s=20.0, settle_s=10.0)
    assert policy.decide(0.0, 1, None, 0.9, throughput=None) is None  # nothing measured
    assert policy.decide(0.0, 1, None, 0.9, throughput=200.0) == (
        2, "grow: consumers waited 90% of the time")
    assert policy.decide(5.0, 2, None, 0.5, throughput=300.0) is None  # not settled yet
    assert policy.decide(10.0, 2, None, 0.5, throughput=400.0) == (
        3, "grow on: throughput 400/s, 200/s before")
    assert policy.decide(20.0, 3, None, 0.1, throughput=600.0)[0] == 4  # +50%
    assert policy.decide(30.0, 4, None, 0.0, throughput=620.0) is None  # +3%: steady now
    assert policy.decide(45.0, 4, None, 0.0, throughput=600.0) is None  # within cool-down
    assert policy.decide(50.0, 4, None, 0.0, throughput=600.0) == (
        3, "try shrinking: throughput 600/s")
    assert policy.decide(60.0, 3, None, 0.0, throughput=595.0)[0] == 2  # lost under 3%
    assert policy.decide(70.0, 2, None, 0.3, throughput=400.0) == (
        3, "step back up: throughput 400/s, 595/s before")
    # the next try waits twice the cool-down
    assert policy.decide(100.0, 3, None, 0.0, throughput=600.0) is None
    assert policy.decide(110.0, 3, None, 0.0, throughput=600.0)[0] == 2
    assert policy.decide(110.0, 9, None, 0.0, throughput=600.0) == (8, "above the maximum 8")


def slow(x: Any) -> Any:
    time.sleep(0.005)  # as reading remote storage: waiting, not computing
    return x


def wait_for(what: str, condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_adapt_grows_shrinks_and_delivers_every_element_once() -> None:
    count = 6000
    received: list[int] = []
    errors: list[BaseException] = []
    pace = {"sleep": 0.0}
    with LocalCluster(1, worker_config=WorkerConfig(
            dispatcher_address="localhost:1", heartbeat_interval_ms=200)) as cluster:
        cluster.adapt(minimum=1, maximum=4, interval_s=0.5)

        def consume() -> None:
            try:
                for x in Dataset.range(count).map(slow).apply(
                        distribute("distributed_epoch", cluster.target)):
                    received.append(int(x))
                    if pace["sleep"]:
                        time.sleep(pace["sleep"])
            except BaseException as error:  # noqa: BLE001  # reported by the assertion
                errors.append(error)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        wait_for("scale-up", lambda: any(e[2] > e[1] for e in cluster.events), 60)
        status = dispatcher_status(cluster.target)
        assert status["optimal_workers"] is not None and status["optimal_workers"] > 1
        assert status["jobs"][0]["optimal_workers"] is not None
        pace["sleep"] = 0.01  # 100 elements/s: one worker (200/s) is enough
        wait_for("scale-down", lambda: any(e[2] < e[1] for e in cluster.events), 60)
        pace["sleep"] = 0.0
        consumer.join(120)
        assert not consumer.is_alive() and not errors, errors
        peak = max(e[2] for e in cluster.events)
        assert 2 <= peak <= 4, cluster.events  # within the maximum
    assert sorted(received) == list(range(count))  # nothing lost, nothing repeated


def test_public_names() -> None:
    assert cv.data.service.LocalCluster is LocalCluster
