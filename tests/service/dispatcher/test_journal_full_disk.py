"""A full disk under the dispatcher's journal: new work is refused with ResourceExhaustedError
naming the journal's path, the dispatcher reports itself not ready, and it takes work again
(with a journal that holds everything) once space is freed."""

from __future__ import annotations

import errno

import pytest

from convoy import monitoring
from convoy._transport import rpc as _rpc
from convoy.data.service import DispatcherConfig, DispatchServer
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
from convoy.data.service._dispatcher.journal import LocalStorage
from convoy.errors import ResourceExhaustedError

pytestmark = pytest.mark.timeout(60)


def register(client: _rpc.Client, fingerprint: str) -> str:
    response = client.call("RegisterDataset", pb.RegisterDatasetRequest(
        dataset=b"payload-" + fingerprint.encode(), fingerprint=fingerprint, cardinality=-1,
        num_split_units=-1))
    return response.dataset_id


def test_a_full_disk_refuses_new_work_and_reports_not_ready(tmp_path, monkeypatch):
    config = DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = DispatchServer(config)
    client = _rpc.Client(dispatcher.target.removeprefix("grpc://"), DISPATCHER,
                         DISPATCHER_METHODS)
    try:
        first = register(client, "a")
        assert not any("dispatcher" in reason for reason in monitoring.readiness())
        journal = dispatcher._handlers.journal
        assert journal is not None

        def full(*args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as disk_full:
            disk_full.setattr(type(journal._log), "write", full)
            disk_full.setattr(LocalStorage, "replace", full)
            with pytest.raises(ResourceExhaustedError, match=r"journal .*log-\d+.*No space"):
                register(client, "b")
            reasons = [r for r in monitoring.readiness() if r.startswith("dispatcher")]
            assert len(reasons) == 1 and "No space left on device" in reasons[0], reasons
            with pytest.raises(ResourceExhaustedError, match="No space left on device"):
                register(client, "c")  # still refused: nothing more is taken
            # reads still answer
            client.call("GetStatus", pb.GetStatusRequest())

        # space is freed: the next request writes a snapshot first, then is taken
        third = register(client, "c")
        assert not any(r.startswith("dispatcher") for r in monitoring.readiness())
    finally:
        client.close()
        dispatcher.stop()

    restarted = DispatchServer(config)
    try:
        datasets = restarted._handlers.state.datasets
        assert {first, third} <= set(datasets)
        assert {d.fingerprint for d in datasets.values()} >= {"a", "c"}
    finally:
        restarted.stop()
