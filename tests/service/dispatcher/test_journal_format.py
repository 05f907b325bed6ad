"""The journal's record format: plain JSON, every kind round-trips, anything else is refused."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.data.service._dispatcher.journal_format import (
    decode_event,
    decode_meta,
    decode_snapshot,
    encode_event,
    encode_meta,
    encode_snapshot,
)

#: One event of each kind, with values that JSON cannot hold as they are.
SAMPLES = [
    ev.RegisterDataset("fp", b"\x00\xff\x80 not text", "AUTO", b"", -1, 7, "my-id"),
    ev.GetOrCreateJob("1000", "train", ev.JobOptions(ShardingPolicy.DYNAMIC, 2, "ANY", "trainer")),
    ev.GetOrCreateJob("1000", "", ev.JobOptions(ShardingPolicy.FILE), ("w1:1", "[::1]:5050")),
    ev.GetOrCreateIteration(2001, 3, 1.5),
    ev.ClientHeartbeat(2002, 1e9),
    ev.ReleaseClient(2002),
    ev.WorkerHeartbeat("w1:1", "uid-\u00e9", (2004, 2005), 0.0),
    ev.WorkerHeartbeat("w1:1", "u", (2004, 2005), 2.5, (2005,)),
    ev.TaskFinished("[::1]:5050", 2004),
    ev.GetSplits(2003, 0, 16),
    ev.GetSplits(2003, 2, 8, 2004, "uid-\u00e9", 17),
    ev.CollectGarbage(100.0, 30.0, 60.0),
    ev.CollectGarbage(100.0, 30.0, 60.0, (2002,), ("w1:1", "w2:2"), float("inf"), True),
    ev.WorkerLost("w1:1", "uid-\u00e9"),
    ev.StartSave("/saves/\u00e9", "1000", "SNAPPY", 1 << 61),
    ev.AssignSaveStream("/saves/\u00e9", 0, "w1:1", "uid-\u00e9"),
    ev.GetSaveSplit("/saves/\u00e9", 0, "w1:1", 2, 17),
    ev.SaveStreamDone("/saves/\u00e9", 0, "w1:1", "ValueError: \u00e9"),
]


def test_the_samples_cover_every_kind() -> None:
    assert {type(event) for event in SAMPLES} == set(ev.EVENTS.values())


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_kind_round_trips(event: Any) -> None:
    assert decode_event(encode_event(event)) == event


def test_records_are_plain_json() -> None:
    assert encode_event(ev.TaskFinished("w1:1", 7)) == (
        b'{"kind":"TaskFinished","address":"w1:1","task_id":7}')
    plain = json.loads(encode_event(SAMPLES[0]))
    assert plain["kind"] == "RegisterDataset" and plain["payload"] == "AP+AIG5vdCB0ZXh0"
    assert json.loads(encode_event(SAMPLES[1]))["options"] == {
        "processing_mode": "DYNAMIC", "num_consumers": 2, "target_workers": "ANY",
        "cross_trainer_cache": "trainer"}


def test_a_field_added_with_a_default_reads_older_records() -> None:
    assert decode_event(b'{"kind":"RegisterDataset","fingerprint":"f","payload":"",'
                        b'"compression":"","element_spec":"","cardinality":1,'
                        b'"num_split_units":1}').requested_id == ""
    assert decode_event(b'{"kind":"WorkerHeartbeat","address":"a:1","uid":"u",'
                        b'"current_tasks":[7],"now":1}') == ev.WorkerHeartbeat(
        "a:1", "u", (7,), 1.0, ())
    assert decode_event(b'{"kind":"GetSplits","iteration_id":3,"repetition":0,'
                        b'"max_splits":8}') == ev.GetSplits(3, 0, 8, 0, "", 0)
    assert not decode_event(b'{"kind":"CollectGarbage","now":1,"client_timeout":1,'
                            b'"worker_timeout":1}').keep_dynamic
    # jobs from before static sharding have no worker list
    job = decode_event(b'{"kind":"GetOrCreateJob","dataset_id":"1","job_name":"",'
                       b'"options":{"processing_mode":"OFF"}}')
    assert job == ev.GetOrCreateJob("1", "", ev.JobOptions(ShardingPolicy.OFF), ())
    plain = json.loads(encode_snapshot(busy_state(), 1))
    for record in plain["state"]["jobs"]:
        del record["worker_addresses"]
    restored, _ = decode_snapshot(json.dumps(plain).encode())
    assert all(j.worker_addresses == () for j in restored.jobs.values())


def test_a_worker_list_is_a_list_of_strings() -> None:
    assert json.loads(encode_event(SAMPLES[2]))["worker_addresses"] == ["w1:1", "[::1]:5050"]
    with pytest.raises(ValueError, match=r"worker_addresses\[0\]: expected <class 'str'>"):
        decode_event(b'{"kind":"GetOrCreateJob","dataset_id":"1","job_name":"",'
                     b'"options":{"processing_mode":"FILE"},"worker_addresses":[1]}')


def _finite_floats(cls: type) -> hs.SearchStrategy[Any]:
    finite = hs.floats(allow_nan=False)
    hints = typing.get_type_hints(cls)
    return hs.builds(cls, **{name: finite if kind is float else hs.none() | finite
                             for name, kind in hints.items() if kind in (float, float | None)})


@given(hs.one_of(*[_finite_floats(cls) for cls in ev.EVENTS.values()]))
def test_any_event_round_trips(event: Any) -> None:
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize("data, match", [
    (b"\x80\x04\x95\x10", "not a JSON record"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"kind":"Forget"}', "unknown record kind 'Forget'"),
    (b'{"address":"w1:1","task_id":7}', "unknown record kind None"),
    (b'{"kind":"TaskFinished","address":"w1:1"}', "TaskFinished: missing field 'task_id'"),
    (b'{"kind":"TaskFinished","address":"w1:1","task_id":7,"x":1}', r"unknown fields \['x'\]"),
    (b'{"kind":"TaskFinished","address":"w1:1","task_id":7.0}', "task_id: expected <class 'int'>"),
    (b'{"kind":"TaskFinished","address":"w1:1","task_id":true}', "task_id: expected"),
    (b'{"kind":"ReleaseClient","client_id":null}', "client_id: expected"),
    (b'{"kind":"GetOrCreateIteration","job_id":1,"repetition":0,"now":"1"}', "now: expected"),
    (b'{"kind":"WorkerHeartbeat","address":"a","uid":"u","current_tasks":[1,"2"],"now":0}',
     r"current_tasks\[1\]: expected"),
    (b'{"kind":"RegisterDataset","fingerprint":"f","payload":"not base64!","compression":"",'
     b'"element_spec":"","cardinality":1,"num_split_units":1}', "payload: expected"),
    (b'{"kind":"GetOrCreateJob","dataset_id":"1","job_name":"","options":{"mode":"OFF"}}',
     r"options: unknown fields \['mode'\]"),
])
def test_decoding_refuses_what_it_does_not_know(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_event(data)


def busy_state() -> st.DispatcherState:
    """A state with something in every record and index: finished, lost and idle ones too."""
    state = st.DispatcherState(5000)
    for address in ("w1:1", "w2:2", "w3:3"):
        state.apply(ev.WorkerHeartbeat(address, "u", (), 0.0))
    dataset = state.apply(ev.RegisterDataset("fp", b"\x00\x01", "", b"\xfe", 50, 50))
    job = state.apply(ev.GetOrCreateJob(dataset, "named", ev.JobOptions(ShardingPolicy.DYNAMIC)))
    static = state.apply(ev.GetOrCreateJob(dataset, "", ev.JobOptions(ShardingPolicy.DATA),
                                           ("w2:2", "w1:1")))
    state.apply(ev.GetOrCreateIteration(static, 0, 0.5))
    running, _ = state.apply(ev.GetOrCreateIteration(job, 0, 1.0))
    done, client = state.apply(ev.GetOrCreateIteration(job, 1, 2.0))
    for address, task_id in state.iterations[done].tasks.items():
        state.apply(ev.TaskFinished(address, task_id))
    state.apply(ev.ReleaseClient(client))
    idle, idle_client = state.apply(ev.GetOrCreateIteration(job, 2, 2.5))
    state.apply(ev.ReleaseClient(idle_client))
    state.apply(ev.GetSplits(running, 0, 5))
    state.apply(ev.GetSplits(running, 0, 5, state.iterations[running].tasks["w2:2"], "u", 4))
    state.apply(ev.TaskFinished("w1:1", state.iterations[running].tasks["w1:1"]))
    state.apply(ev.CollectGarbage(10.0, 1e9, 1e9, (), ("w3:3",), 100.0))
    return state


def test_the_state_round_trips_through_a_snapshot() -> None:
    state = busy_state()
    restored, generation = decode_snapshot(encode_snapshot(state, 7))
    assert generation == 7
    assert restored.snapshot() == state.snapshot()
    assert any(t.finished and t.worker_address == "w3:3" for t in restored.tasks.values())
    assert any(i.idle_since == 10.0 for i in restored.iterations.values())
    assert any(i.finished and not i.tasks for i in restored.iterations.values())
    (answer,) = [t.last_splits for t in restored.tasks.values() if t.last_splits]
    assert answer == ev.SplitsAnswer("u", 4, 0, [(i, i + 1) for i in range(5, 10)], False)
    # and both go on alike
    for copy in (state, restored):
        copy.apply(ev.WorkerHeartbeat("w3:3", "u2", (), 20.0))
        copy.apply(ev.CollectGarbage(200.0, 1e9, 1e9, (), (), 100.0))
    assert restored.snapshot() == state.snapshot()


def test_snapshots_of_another_format_or_inconsistent_are_refused() -> None:
    plain = json.loads(encode_snapshot(busy_state(), 1))
    with pytest.raises(ValueError, match="format 1, but this version of convoy reads format 2"):
        decode_snapshot(json.dumps({**plain, "format": 1}).encode())
    plain["state"]["iterations"] = []
    with pytest.raises(ValueError, match="inconsistent state"):
        decode_snapshot(json.dumps(plain).encode())


def test_meta_round_trips() -> None:
    assert decode_meta(encode_meta(123_456_000_002_000)) == 123_456_000_002_000
    with pytest.raises(ValueError, match="format None"):
        decode_meta(b'{"id_base":2000}')
