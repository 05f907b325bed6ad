"""``convoy status``: a real dispatcher with two worker processes and a running job, and a
real training cluster, read through their read-only status RPCs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy._transport.security import TOKEN_ENV
from convoy.testing import ProcessCluster, TrainingCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SECRET = {TOKEN_ENV: "status-secret-0123456789abcdef"}


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os
    return subprocess.run([sys.executable, "-m", "convoy", "status", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def data_cluster():
    with ProcessCluster(num_workers=2, env=SECRET) as cluster:
        yield cluster


def test_status_json_matches_a_live_data_service(data_cluster, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, SECRET[TOKEN_ENV])
    service = cv.data.service
    dataset = cv.data.Dataset.range(100_000).apply(service.distribute(
        service.ShardingPolicy.DYNAMIC, data_cluster.target, job_name="status-job"))
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(10)]
    assert len(first) == 10
    time.sleep(0.5)  # a heartbeat or two: workers report their buffers

    done = status("--dispatcher", data_cluster.dispatcher.address, "--json", env=SECRET)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    workers = report["workers"]
    assert sorted(port(w["address"]) for w in workers) == sorted(
        port(w.address) for w in data_cluster.workers)
    for worker in workers:
        assert set(worker) >= {"address", "last_heartbeat_s", "tasks", "buffered_elements",
                               "buffered_bytes"}
        assert 0 <= worker["last_heartbeat_s"] < 30
        assert len(worker["tasks"]) == 1
    assert sum(w["buffered_elements"] for w in workers) > 0  # the pipeline runs ahead
    assert len(report["datasets"]) == 1
    (job,) = report["jobs"]
    assert (job["name"], job["policy"]) == ("status-job", "DYNAMIC")
    (iteration,) = job["iterations"]
    assert iteration["consumers"] == 1 and not iteration["finished"]
    assert sorted(iteration["tasks"]) == sorted(t for w in workers for t in w["tasks"])
    assert iteration["splits_handed_out"] > 0
    del iterator


def test_status_table_and_watch_print_each_refresh(data_cluster):
    done = status("--dispatcher", data_cluster.dispatcher.address, "--watch", "0.1",
                  "--count", "2", env=SECRET)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("WORKER") == 2
    for worker in data_cluster.workers:
        assert f":{port(worker.address)}" in done.stdout


def test_status_without_the_secret_is_refused_in_one_line(data_cluster):
    done = status("--dispatcher", data_cluster.dispatcher.address, "--json",
                  env={TOKEN_ENV: "another-secret-0123456789abcdef"})
    assert done.returncode == 1
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.timeout(180)
def test_status_of_a_training_cluster_lists_its_variables():
    with TrainingCluster(num_workers=1, num_ps=2) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                weights = cv.Variable(np.zeros((10, 4), np.float32), name="weights")
                bias = cv.Variable(np.zeros(4, np.float32), name="bias")
            assert weights is not None and bias is not None
            done = status("--cluster", json.dumps(cluster.cluster), "--json")
            assert done.returncode == 0, done.stderr
            tasks = json.loads(done.stdout)["tasks"]
            assert [(t["job"], t["index"]) for t in tasks] == [("ps", 0), ("ps", 1),
                                                               ("worker", 0)]
            assert all("error" not in t for t in tasks), tasks
            variables = {v["name"]: v for t in tasks if t["job"] == "ps"
                         for v in t["variables"]}
            assert any(name.startswith("weights") for name in variables), variables
            assert any(name.startswith("bias") for name in variables), variables
            assert sum(v["bytes"] for v in variables.values()) == (40 + 4) * 4
            assert tasks[2]["functions_running"] == 0
            table = status("--cluster", json.dumps(cluster.cluster))
            assert table.returncode == 0 and "weights" in table.stdout, table.stderr
        finally:
            coordinator.shutdown()
