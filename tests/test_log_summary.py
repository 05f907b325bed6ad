"""convoy._base.log_summary: repeated failures in one line per period, and the logs the
dispatcher writes for an operator (workers registered, jobs created, clients gone)."""

from __future__ import annotations

import logging

import pytest

import convoy as cv
from convoy._base.log_summary import RepeatedFailures
from convoy.testing import InProcessCluster

log = logging.getLogger("convoy.test_log_summary")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_the_first_failure_is_logged_then_one_line_per_period(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("convoy._base.log_summary.time.monotonic", lambda: now[0])
    caplog.set_level(logging.INFO, logger=log.name)
    failures = RepeatedFailures(log, "heartbeat to D", period_s=10.0)
    failures.failed("refused")
    for _ in range(24):  # 24 more within 8 s: no line each
        now[0] += 8 / 24
        failures.failed("refused")
    assert messages(caplog) == ["heartbeat to D failed: refused"]
    now[0] = 110.5
    failures.failed("still refused")
    assert messages(caplog)[-1] == ("heartbeat to D failed 25 times in the last 10 s: "
                                    "still refused")
    failures.succeeded()
    assert messages(caplog)[-1] == "heartbeat to D succeeded again after 26 failures"
    failures.succeeded()  # nothing more to say
    failures.failed("again")
    assert messages(caplog)[-2:] == ["heartbeat to D succeeded again after 26 failures",
                                     "heartbeat to D failed: again"]


@pytest.mark.timeout(60)
def test_the_dispatcher_logs_workers_jobs_and_clients(caplog):
    caplog.set_level(logging.INFO, logger="convoy.data.service")
    with InProcessCluster(num_workers=1) as cluster:
        service = cv.data.service
        dataset = cv.data.Dataset.range(20).apply(service.distribute(
            service.ShardingPolicy.DYNAMIC, cluster.target, job_name="logged"))
        assert sorted(int(x) for x in dataset) == list(range(20))
    lines = messages(caplog)
    assert any(line.startswith("worker ") and line.endswith(" registered") for line in lines)
    assert any("job" in line and "'logged'" in line and "created" in line for line in lines)
    assert any("finished" in line for line in lines), lines
    assert any("released its iteration" in line for line in lines), lines
