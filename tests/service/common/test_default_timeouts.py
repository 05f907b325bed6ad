"""The default timeouts are ordered so that the failure table's promises hold."""

from __future__ import annotations

from convoy.data.service import DispatcherConfig, WorkerConfig
from convoy.data.service._client.options import timeout_s
from convoy.data.service._common import server_config as sc


def test_a_consumer_waits_longer_than_the_dispatcher_takes_to_declare_a_worker_lost() -> None:
    dispatcher = DispatcherConfig()
    worker = WorkerConfig(dispatcher_address="localhost:5050")
    consumer_s = timeout_s(None)
    assert consumer_s > dispatcher.worker_timeout_s + 2 * worker.heartbeat_interval_s
    # a silent consumer is forgotten only after it would have given up by itself
    assert dispatcher.client_timeout_s > consumer_s
    assert (dispatcher.iteration_timeout_s or float("inf")) >= dispatcher.client_timeout_s


def test_the_defaults_tensorflow_users_know_are_kept_where_they_break_no_promise() -> None:
    assert DispatcherConfig().worker_timeout_s == 60.0
    assert DispatcherConfig().iteration_timeout_s == 300.0
    assert WorkerConfig(dispatcher_address="localhost:5050").dispatcher_timeout_s == 3600.0
    assert sc.DEFAULT_CONSUMER_TIMEOUT_MS == 90_000
