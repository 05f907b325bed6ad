"""A fault-tolerant dispatcher's ``work_dir``, written by an earlier version of the same journal
format, restores the same state: its datasets, jobs, iteration, task and split cursor; one of an
older format is refused, naming both formats."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from convoy._transport import rpc as _rpc
from convoy.data.service import DispatcherConfig, DispatchServer
from convoy.data.service import service_pb2 as pb
from convoy.errors import DataLossError

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _maker() -> ModuleType:
    """The script that wrote the fixture (for its helpers, not to run it again)."""
    spec = importlib.util.spec_from_file_location(
        "make_work_dir_journal", FIXTURES / "make_work_dir_journal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _known_fields(restored: Any, expected: Any) -> Any:
    """``restored`` without the record fields added since the fixture was written; each must
    hold its empty default (records of an earlier version get the defaults)."""
    if isinstance(restored, dict) and isinstance(expected, dict):
        added = {key: restored[key] for key in restored.keys() - expected.keys()}
        if all(isinstance(key, str) and not key.isdigit() for key in added):
            assert not any(added.values()), f"fields added since the fixture: {added}"
            return {key: _known_fields(value, expected[key])
                    for key, value in restored.items() if key in expected}
    return restored


def test_a_work_dir_of_an_earlier_version_restores_the_same_state(tmp_path: Path) -> None:
    maker = _maker()
    shutil.copytree(FIXTURES / "work-dir-journal", tmp_path / "work")
    expected = json.loads((FIXTURES / "work-dir-journal.json").read_text())
    server = DispatchServer(DispatcherConfig(work_dir=str(tmp_path / "work"),
                                             fault_tolerant_mode=True))
    try:
        restored = maker.durable(maker.plain(server._handlers.state.snapshot()))
        restored = _known_fields(json.loads(json.dumps(restored, sort_keys=True)), expected)
        assert restored == expected
        (iteration,) = expected["iterations"].values()
        (task_id,) = iteration["tasks"].values()
        assert iteration["split_cursor"] == 12
        client = _rpc.Client(server.target.removeprefix("grpc://"),
                             "convoy.data.service.Dispatcher", maker.METHODS)
        try:
            def splits(number: int) -> list[tuple[int, int]]:
                answer = client.call("GetSplits", pb.GetSplitsRequest(
                    iteration_id=iteration["iteration_id"], repetition=0, max_splits=4,
                    task_id=task_id, worker_uid="worker-a", request_number=number,
                    incarnation=1))
                return [(split.start, split.stop) for split in answer.splits]

            # a request answered before the restart gets its answer again; the next one
            # goes on from the cursor
            assert splits(3) == [(8, 9), (9, 10), (10, 11), (11, 12)]
            assert splits(4) == [(12, 13), (13, 14), (14, 15), (15, 16)]
        finally:
            client.close()
    finally:
        server.stop()


def test_a_work_dir_of_journal_format_1_is_refused(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "work-dir-journal-format-1", tmp_path / "work")
    with pytest.raises(DataLossError, match="format 1, but this version of convoy reads "
                                            "format 2 only"):
        DispatchServer(DispatcherConfig(work_dir=str(tmp_path / "work"),
                                        fault_tolerant_mode=True))
