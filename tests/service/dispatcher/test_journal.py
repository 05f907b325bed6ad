"""The dispatcher journal: replay, compaction, torn tails, damage, crashes mid-compaction.

No network: events are applied through the dispatcher's own request handlers
(``DispatcherImpl``), which journals every event that changes more than a last-seen time into
``Journal(LocalStorage(tmp_path))``, and a second ``Journal`` over the same directory must
recover a state whose ``snapshot()`` is equal but for last-seen times.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.data.service._dispatcher.journal import COMPACT_EVERY, Journal, LocalStorage
from convoy.data.service._dispatcher.journal_format import encode_event
from convoy.data.service._dispatcher_impl import DispatcherImpl
from convoy.data.tfrecord import TFRecordWriter, read_records
from convoy.errors import DataLossError, NotFoundError

#: Every kind of event that changes the dispatcher's state (client heartbeats only touch a
#: last-seen time and are not journaled; worker heartbeats only when they register a worker).
JOURNALED_EVENTS = {"RegisterDataset", "GetOrCreateJob", "GetOrCreateIteration",
                    "WorkerHeartbeat", "TaskFinished", "GetSplits", "ReleaseClient",
                    "CollectGarbage", "ClientHeartbeat"}

#: A journal written at format 1 by the scenario below (compacted every 20 records). Never
#: regenerate it: it proves that what was written then is still read.
FIXTURE = Path(__file__).parents[1] / "fixtures" / "journal-format-1"

#: A journal written at format 1 with the fields added since (numbered split requests and
#: the answers kept for them, ends reported in heartbeats, collections that keep DYNAMIC
#: iterations): the scenario below compacted every 25 records, then two collections that
#: forget idle iterations after 50 s. Never regenerate it either.
FIXTURE_ANSWERS = Path(__file__).parents[1] / "fixtures" / "journal-format-1-answers"

#: Ids start here in these tests (a real new journal draws its base at random).
ID_BASE = 2000


def durable(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A state's snapshot without last-seen times, which a restart need not keep."""
    snapshot = copy.deepcopy(snapshot)
    for name in ("workers", "clients"):
        for record in snapshot[name].values():
            record.pop("last_seen")
    return snapshot


class Recorder:
    """A dispatcher's state and journal in ``directory``, driven like the dispatcher drives
    them; ``snapshots[k]`` is the durable state after the k-th journaled record (``[0]``: as
    recovered). With ``restart_every_event`` the journal is closed and recovered after every
    record."""

    def __init__(self, directory: Path, compact_every: int = COMPACT_EVERY,
                 storage: LocalStorage | None = None, restart_every_event: bool = False) -> None:
        self.directory = directory
        self.compact_every = compact_every
        self.restart_every_event = restart_every_event
        self.handlers = DispatcherImpl(Journal(storage or LocalStorage(directory), compact_every,
                                          ID_BASE))
        self.snapshots = [durable(self.state.snapshot())]

    @property
    def state(self) -> st.DispatcherState:
        return self.handlers.state

    @property
    def journal(self) -> Journal:
        assert self.handlers.journal is not None
        return self.handlers.journal

    def _position(self) -> tuple[int, int]:
        return self.journal.generation, self.journal.records

    def __call__(self, event: Any) -> Any:
        before = self._position()
        result = self.handlers._apply(event)  # raises, unjournaled, for a bad request
        if self._position() != before:
            self._journaled()
        return result

    def collect_garbage(self, now: float, client_timeout: float,
                        worker_timeout: float) -> list[str]:
        """What the dispatcher's garbage-collection thread does every interval."""
        lost = self.handlers.collect_garbage(now, client_timeout, worker_timeout)
        self._journaled()
        return lost

    def _journaled(self) -> None:
        self.snapshots.append(durable(self.state.snapshot()))
        if self.restart_every_event:
            self.journal.close()
            self.handlers = DispatcherImpl(Journal(LocalStorage(self.directory), self.compact_every,
                                              ID_BASE))
            assert durable(self.state.snapshot()) == self.snapshots[-1]

    def log_path(self) -> Path:
        return self.directory / f"log-{self.journal.generation}"


def recover(directory: Path, compact_every: int = COMPACT_EVERY) -> tuple[Journal, dict]:
    """The journal over ``directory`` and the durable state it recovers."""
    journal = Journal(LocalStorage(directory), compact_every, ID_BASE)
    return journal, durable(journal.recover().snapshot())


def scenario(rec: Recorder) -> None:
    """A realistic run that makes every kind of state change, checking each did happen."""
    # datasets: a new one, the same one again (same id), one with a requested id
    source = ev.RegisterDataset("fp-range", b"range(400)", "AUTO", b"spec", 400, 400)
    dataset = rec(source)
    assert rec(source) == dataset
    files = rec(ev.RegisterDataset("fp-files", b"files", "", b"", 6, 6, "my-files"))
    assert files == "my-files"
    # two workers register
    rec(ev.WorkerHeartbeat("w1:1", "w1-a", (), 1.0))
    rec(ev.WorkerHeartbeat("w2:2", "w2-a", (), 1.0))
    # a shared DYNAMIC job read by two consumers; an anonymous OFF job
    dynamic = rec(ev.GetOrCreateJob(dataset, "shared", ev.JobOptions(ShardingPolicy.DYNAMIC)))
    assert rec(ev.GetOrCreateJob(dataset, "shared",
                                 ev.JobOptions(ShardingPolicy.DYNAMIC))) == dynamic
    off = rec(ev.GetOrCreateJob(files, "", ev.JobOptions(ShardingPolicy.OFF)))
    epoch, first = rec(ev.GetOrCreateIteration(dynamic, 0, 2.0))
    assert rec(ev.GetOrCreateIteration(dynamic, 0, 2.0))[0] == epoch
    copies, _ = rec(ev.GetOrCreateIteration(off, 0, 2.5))
    # the workers pick their tasks up
    for address, uid in (("w1:1", "w1-a"), ("w2:2", "w2-a")):
        assert len(rec(ev.WorkerHeartbeat(address, uid, (), 3.0)).new_tasks) == 2
    # a request the state refuses changes nothing and is not journaled
    records = len(rec.snapshots)
    with pytest.raises(NotFoundError):
        rec(ev.TaskFinished("w1:1", 999_999))
    assert len(rec.snapshots) == records
    # splits of repetition 0 ...
    for _ in range(3):
        splits, end = rec(ev.GetSplits(epoch, 0, 8))
        assert len(splits) == 8 and not end
    # ... a late worker joins the unfinished iterations ...
    late = rec(ev.WorkerHeartbeat("w3:3", "w3-a", (), 4.0))
    assert sorted(t.iteration_id for t in late.new_tasks) == sorted([epoch, copies])
    # ... a repeat() in the pipeline asks for repetition 1, which starts the source again,
    # and a straggler of repetition 0 is told it has ended
    assert rec(ev.GetSplits(epoch, 1, 8)) == ([(i, i + 1) for i in range(8)], False)
    assert rec(ev.GetSplits(epoch, 0, 8)) == ([], True)
    for _ in range(4):
        rec(ev.GetSplits(epoch, 1, 8))
    assert rec.state.iterations[epoch].split_cursor == 40
    # a restarted worker (same address, new process) is given its unfinished OFF task again
    # at once; its DYNAMIC task runs again once both clients have reported what they got
    restarted = rec(ev.WorkerHeartbeat("w2:2", "w2-b", (), 5.0))
    assert len(restarted.new_tasks) == 1 and rec.state.workers["w2:2"].uid == "w2-b"
    current = (restarted.new_tasks[0].task_id,)
    rerun = rec.state.iterations[epoch].tasks["w2:2"]
    clients = sorted(c for c, r in rec.state.clients.items() if r.iteration_id == epoch)
    assert rec.state.tasks[rerun].awaiting == clients and len(clients) == 2
    rec(ev.ClientHeartbeat(clients[0], 5.5, ((rerun, 2),), ((rerun, 0, 10),)))
    assert rec(ev.WorkerHeartbeat("w2:2", "w2-b", current, 5.6)).new_tasks == []
    rec(ev.ClientHeartbeat(clients[1], 5.7, ((rerun, 2),), ((rerun, 12, 20), (rerun, 10, 11))))
    (again,) = rec(ev.WorkerHeartbeat("w2:2", "w2-b", current, 5.8)).new_tasks
    assert (again.task_id, again.incarnation, again.skip) == (rerun, 2, ((0, 11), (12, 20)))
    # the run's requests are numbered per task: sent again, a request gets the same answer
    answer = rec(ev.GetSplits(epoch, 1, 8, rerun, "w2-b", 1, 2))
    records = len(rec.snapshots)
    assert rec(ev.GetSplits(epoch, 1, 8, rerun, "w2-b", 1, 2)) == answer
    assert len(rec.snapshots) == records
    # tasks finish: the OFF iteration ends, the DYNAMIC one waits for w2
    for address, task_id in rec.state.iterations[copies].tasks.items():
        rec(ev.TaskFinished(address, task_id))
    assert rec.state.iteration_finished(rec.state.iterations[copies])
    for address in ("w1:1", "w3:3"):
        rec(ev.TaskFinished(address, rec.state.iterations[epoch].tasks[address]))
    # the next epoch of the shared job, then consumers leave
    second_epoch, keeper = rec(ev.GetOrCreateIteration(dynamic, 1, 6.0))
    rec(ev.ReleaseClient(first))
    # w1 and w2 keep heartbeating, w3 falls silent; a client is silent for too long
    for address, uid in (("w1:1", "w1-a"), ("w2:2", "w2-b")):
        mine = tuple(t.task_id for t in rec.state.tasks.values()
                     if t.worker_address == address and not t.finished)
        rec(ev.WorkerHeartbeat(address, uid, mine, 90.0))
    assert rec.collect_garbage(100.0, 94.0, 30.0) == ["w3:3"]
    assert set(rec.state.workers) == {"w1:1", "w2:2"} and set(rec.state.clients) == {keeper}
    # the new epoch hands out its first splits
    assert rec(ev.GetSplits(second_epoch, 0, 8))[0] == [(i, i + 1) for i in range(8)]
    # a numbered request is answered once: sent again (its answer was lost), it gets the
    # same splits, and nothing more is journaled
    task = rec.state.iterations[second_epoch].tasks["w1:1"]
    answer = rec(ev.GetSplits(second_epoch, 0, 8, task, "w1-a", 1))
    assert answer == ([(i, i + 1) for i in range(8, 16)], False)
    records = len(rec.snapshots)
    assert rec(ev.GetSplits(second_epoch, 0, 8, task, "w1-a", 1)) == answer
    assert len(rec.snapshots) == records
    # w1 reports the end of its task in a heartbeat, which acknowledges it
    mine = tuple(t.task_id for t in rec.state.tasks.values()
                 if t.worker_address == "w1:1" and not t.finished)
    assert rec(ev.WorkerHeartbeat("w1:1", "w1-a", mine, 101.0, (task,))).tasks_to_delete == [
        task]
    assert rec.state.tasks[task].finished


def journaled_kinds(directory: Path) -> set[str]:
    kinds = set()
    for path in directory.glob("log-*"):
        kinds |= {json.loads(record)["kind"] for record, _ in read_records(path)}
    return kinds


# ----- replay ------------------------------------------------------------------------------------


def test_replay_restores_every_kind_of_state_change(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    scenario(rec)
    rec.journal.close()
    assert journaled_kinds(tmp_path) == JOURNALED_EVENTS
    _, recovered = recover(tmp_path)
    assert recovered == durable(rec.state.snapshot())


def test_every_prefix_of_the_journal_replays_to_the_state_after_it(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run")
    scenario(rec)
    rec.journal.close()
    log = rec.log_path().read_bytes()
    ends = [0] + [end for _, end in read_records(rec.log_path())]
    assert len(ends) == len(rec.snapshots)
    for count, end in enumerate(ends):
        prefix = tmp_path / f"prefix-{count}"
        prefix.mkdir()
        (prefix / "log-0").write_bytes(log[:end])
        shutil.copy(tmp_path / "run" / "meta", prefix / "meta")
        assert recover(prefix)[1] == rec.snapshots[count], f"after {count} records"


@pytest.mark.parametrize("compact_every", [5, 3, 1])
def test_replay_across_compactions(tmp_path: Path, compact_every: int) -> None:
    rec = Recorder(tmp_path, compact_every=compact_every)
    scenario(rec)
    records = len(rec.snapshots) - 1
    assert rec.journal.generation == records // compact_every >= 1
    assert rec.journal.records == records % compact_every
    rec.journal.close()
    # only the meta file, the snapshot and the current log are left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["meta", "snapshot", f"log-{rec.journal.generation}"])
    journal, recovered = recover(tmp_path, compact_every)
    assert recovered == durable(rec.state.snapshot())
    assert (journal.generation, journal.records) == (rec.journal.generation,
                                                     rec.journal.records)


def test_a_single_compaction(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, compact_every=5)
    rec(ev.RegisterDataset("fp", b"range(10)", "", b"", 10, 10))
    for second in range(1, 7):  # a worker restarted every second
        rec(ev.WorkerHeartbeat("w1:1", f"u{second}", (), float(second)))
    assert (rec.journal.generation, rec.journal.records) == (1, 2)
    rec.journal.close()
    assert recover(tmp_path, 5)[1] == durable(rec.state.snapshot()) == rec.snapshots[7]
    assert rec.state.workers["w1:1"].uid == "u6"


@pytest.mark.parametrize("compact_every", [3, COMPACT_EVERY])
def test_restarting_after_every_event_changes_nothing(tmp_path: Path,
                                                      compact_every: int) -> None:
    """Recovering, then appending to the recovered journal (and compacting on schedule) gives
    the same states as one uninterrupted run."""
    straight = Recorder(tmp_path / "straight", compact_every)
    scenario(straight)
    restarted = Recorder(tmp_path / "restarted", compact_every, restart_every_event=True)
    scenario(restarted)
    assert restarted.snapshots == straight.snapshots


def test_an_empty_work_dir_recovers_an_empty_state(tmp_path: Path) -> None:
    empty = st.DispatcherState().snapshot()
    assert recover(tmp_path / "never" / "created")[1] == empty
    assert recover(tmp_path / "never" / "created")[1] == empty  # an empty log is fine too
    (tmp_path / "empty").mkdir()
    journal, recovered = recover(tmp_path / "empty")
    assert recovered == empty and (journal.generation, journal.records) == (0, 0)


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE_ANSWERS])
def test_a_journal_of_format_1_is_refused_naming_both_formats(tmp_path: Path,
                                                             fixture: Path) -> None:
    """The fixtures were written at format 1 (every kind of record, split answers, reported
    ends). Format 2 keeps finished iterations as tombstones and forgets abandoned ones, so
    replaying format 1 under its rules would hand out other ids than its dispatcher did: it
    is refused, naming both formats, and left as it was."""
    shutil.copytree(fixture, tmp_path / "journal")
    check_data_loss(tmp_path / "journal", "meta", 0,
                    "format 1, but this version of convoy reads format 2 only")


# ----- torn tails and damage ----------------------------------------------------------------------


def finished_run(tmp_path: Path, compact_every: int) -> tuple[Recorder, bytes, int]:
    """A run whose current log holds at least one record; returns it, the log's bytes and the
    offset where its last record starts."""
    rec = Recorder(tmp_path / "run", compact_every)
    scenario(rec)
    if rec.journal.records == 0:
        rec(ev.WorkerHeartbeat("w1:1", "w1-c", (), 101.0))  # a restart: journaled
    rec.journal.close()
    log = rec.log_path().read_bytes()
    ends = [0] + [end for _, end in read_records(rec.log_path())]
    assert ends[-1] == len(log)
    return rec, log, ends[-2]


def check_damaged_tail(tmp_path: Path, rec: Recorder, name: str, damaged: bytes,
                       last_start: int, compact_every: int) -> None:
    """A journal whose log ``name`` is ``damaged``: it recovers the state before the last
    record, cuts the log back to the whole records, and takes new records afterwards."""
    directory = tmp_path / "damaged"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(rec.directory, directory)
    (directory / name).write_bytes(damaged)
    journal = Journal(LocalStorage(directory), compact_every)
    state = journal.recover()
    assert durable(state.snapshot()) == rec.snapshots[-2]
    assert (directory / name).stat().st_size == last_start
    event = ev.WorkerHeartbeat("w9:9", "w9-a", (), 200.0)
    state.apply(event)
    journal.append(event, state)
    journal.close()
    assert recover(directory, compact_every)[1] == durable(state.snapshot())
    assert "w9:9" in state.workers


@pytest.mark.parametrize("compact_every", [COMPACT_EVERY, 7])
def test_a_log_torn_at_every_byte_of_its_last_record(tmp_path: Path, compact_every: int,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    rec, log, last_start = finished_run(tmp_path, compact_every)
    name = rec.log_path().name
    assert len(log) - last_start > 12 + 4  # a header, some data and a footer to tear
    caplog.set_level(logging.WARNING)
    for cut in range(last_start, len(log)):
        check_damaged_tail(tmp_path, rec, name, log[:cut], last_start, compact_every)
    warnings = [r.getMessage() for r in caplog.records if "torn tail" in r.getMessage()]
    assert len(warnings) == len(log) - last_start - 1  # all but the cut at a record's start
    assert f"{name}: cutting off a torn tail at offset {last_start}" in warnings[0]


@pytest.mark.parametrize("compact_every", [COMPACT_EVERY, 7])
def test_a_corrupt_byte_in_the_last_record_drops_only_that_record(
        tmp_path: Path, compact_every: int) -> None:
    rec, log, last_start = finished_run(tmp_path, compact_every)
    name = rec.log_path().name
    for position in range(last_start, len(log)):
        damaged = bytearray(log)
        damaged[position] ^= 0x5A
        check_damaged_tail(tmp_path, rec, name, bytes(damaged), last_start, compact_every)


def damaged_copy(tmp_path: Path, rec: Recorder, name: str, data: bytes) -> Path:
    directory = tmp_path / "damaged"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(rec.directory, directory)
    (directory / name).write_bytes(data)
    return directory


def check_data_loss(directory: Path, name: str, offset: int, match: str = "") -> None:
    """Recovering ``directory`` stops with DataLossError naming the file and offset, and
    leaves the file as it was."""
    before = (directory / name).read_bytes()
    with pytest.raises(DataLossError, match=match) as error:
        Journal(LocalStorage(directory)).recover()
    assert f"{directory / name}, record at offset {offset}:" in str(error.value)
    assert (directory / name).read_bytes() == before


@pytest.mark.parametrize("part", ["length", "length CRC", "data", "data CRC"])
def test_a_damaged_record_before_whole_ones_is_data_loss(tmp_path: Path, part: str) -> None:
    rec, log, _ = finished_run(tmp_path, COMPACT_EVERY)
    starts = [0] + [end for _, end in read_records(rec.log_path())]
    start, end = starts[5], starts[6]
    position = {"length": start + 2, "length CRC": start + 9, "data": start + 20,
                "data CRC": end - 2}[part]
    damaged = bytearray(log)
    damaged[position] ^= 0x5A
    name = rec.log_path().name
    directory = damaged_copy(tmp_path, rec, name, bytes(damaged))
    check_data_loss(directory, name, start, "whole records after it")


def append_record(path: Path, record: bytes) -> int:
    """Append a whole (CRC-valid) record to the log at ``path``; returns its offset."""
    offset = path.stat().st_size
    with TFRecordWriter(path, append=True) as writer:
        writer.write(record)
    return offset


@pytest.mark.parametrize("record, match", [
    (b'{"kind":"ForgetEverything"}', "unknown record kind 'ForgetEverything'"),
    (b'{"kind":"TaskFinished","address":"w1:1","task_id":"7"}', "task_id: expected"),
    (b'{"kind":"ReleaseClient","client_id":1,"reason":"x"}', r"unknown fields \['reason'\]"),
    (b"\x80\x04\x95 a pickle", "not a JSON record"),
], ids=["unknown kind", "wrong type", "unknown field", "a pickle"])
def test_an_unreadable_whole_record_is_data_loss(tmp_path: Path, record: bytes,
                                                 match: str) -> None:
    """Not a torn tail: the record is whole, just not one this journal knows. Also in the
    middle of the log."""
    rec, _, _ = finished_run(tmp_path, COMPACT_EVERY)
    offset = append_record(rec.log_path(), record)
    check_data_loss(rec.directory, rec.log_path().name, offset, match)
    append_record(rec.log_path(), encode_event(ev.ReleaseClient(1)))
    check_data_loss(rec.directory, rec.log_path().name, offset, match)


def test_an_event_whose_replay_fails_is_data_loss(tmp_path: Path) -> None:
    rec, _, _ = finished_run(tmp_path, COMPACT_EVERY)
    offset = append_record(rec.log_path(), encode_event(ev.TaskFinished("w1:1", 999_999)))
    check_data_loss(rec.directory, rec.log_path().name, offset,
                    "replaying TaskFinished failed: NotFoundError: Task 999999 not found")


def test_a_damaged_snapshot_is_data_loss(tmp_path: Path) -> None:
    rec, _, _ = finished_run(tmp_path, 7)
    snapshot = (rec.directory / "snapshot").read_bytes()
    for position in (3, 40, len(snapshot) // 2, len(snapshot) - 1):
        damaged = bytearray(snapshot)
        damaged[position] ^= 0x5A
        directory = damaged_copy(tmp_path, rec, "snapshot", bytes(damaged))
        check_data_loss(directory, "snapshot", 0, "corrupted record")
    record = next(read_records(rec.directory / "snapshot"))[0]
    with TFRecordWriter(rec.directory / "snapshot") as writer:
        writer.write(record.replace(b'"format":2', b'"format":1'))
    check_data_loss(rec.directory, "snapshot", 0,
                    "format 1, but this version of convoy reads format 2")


def test_a_journal_of_another_format_is_data_loss(tmp_path: Path) -> None:
    """One written before the journal had a meta file (it pickled its events) is refused, not
    taken for an empty journal."""
    (tmp_path / "id_base").write_text("2000")
    (tmp_path / "log-0").write_bytes(b"")
    with pytest.raises(DataLossError, match=r"meta is missing beside \['log-0', 'id_base'\]"):
        Journal(LocalStorage(tmp_path)).recover()
    assert not (tmp_path / "meta").exists()


# ----- crashes in the middle of a compaction ----------------------------------------------------


class Crash(Exception):
    """The dispatcher process dies here."""


class CrashingStorage(LocalStorage):
    """Local storage that dies at the first compaction, after writing the snapshot (before
    the new log is opened) or before the old log is removed."""

    def __init__(self, directory: Path, when: str) -> None:
        super().__init__(directory)
        self.when = when

    def replace(self, name: str, records: list[bytes]) -> None:
        super().replace(name, records)
        if self.when == "after the snapshot" and name == "snapshot":
            raise Crash

    def remove(self, name: str) -> None:
        if self.when == "before removing the old log":
            raise Crash
        super().remove(name)


@pytest.mark.parametrize("when", ["after the snapshot", "before removing the old log"])
def test_a_crash_in_the_middle_of_a_compaction(tmp_path: Path, when: str) -> None:
    rec = Recorder(tmp_path, compact_every=5, storage=CrashingStorage(tmp_path, when))
    with pytest.raises(Crash):
        scenario(rec)
    # the event that triggered the compaction is in the snapshot (its answer never left)
    assert (tmp_path / "log-0").exists() and (tmp_path / "snapshot").exists()
    journal = Journal(LocalStorage(tmp_path), 5)
    state = journal.recover()
    assert durable(state.snapshot()) == durable(rec.state.snapshot())
    assert (journal.generation, journal.records) == (1, 0)
    assert not (tmp_path / "log-0").exists()  # the old log, all in the snapshot, is removed
    # the recovered journal goes on: it appends, compacts, and recovers again
    for second in range(6):
        event = ev.WorkerHeartbeat("w9:9", "w9-a", (), 200.0 + second)
        state.apply(event)
        journal.append(event, state)
    assert (journal.generation, journal.records) == (2, 1)
    journal.close()
    assert recover(tmp_path, 5)[1] == durable(state.snapshot())


# ----- what is not journaled ---------------------------------------------------------------------


def test_garbage_collection_replays_as_it_happened(tmp_path: Path) -> None:
    """Client heartbeats are not journaled, so which clients a collection found silent is: a
    consumer that kept heartbeating is still known after a restart, a silent one is not."""
    rec = Recorder(tmp_path)
    dataset = rec(ev.RegisterDataset("fp", b"range(10)", "", b"", 10, 10))
    job = rec(ev.GetOrCreateJob(dataset, "", ev.JobOptions(ShardingPolicy.DYNAMIC)))
    _, alive = rec(ev.GetOrCreateIteration(job, 0, 0.0))
    _, silent = rec(ev.GetOrCreateIteration(job, 0, 0.0))
    rec(ev.ClientHeartbeat(alive, 90.0))
    assert rec.collect_garbage(100.0, 50.0, 30.0) == []
    assert set(rec.state.clients) == {alive}
    rec.journal.close()
    _, recovered = recover(tmp_path)
    assert set(recovered["clients"]) == {alive}
    assert recovered == durable(rec.state.snapshot())


def test_heartbeats_that_only_move_last_seen_are_not_journaled(tmp_path: Path) -> None:
    """Only a worker's first heartbeat and those of a new process at its address are. After a
    restart the journal knows an old last-seen time, and the dispatcher counts its own start
    as everyone's last heartbeat: each worker gets a timeout to come back."""
    rec = Recorder(tmp_path)
    for address in ("w1:1", "w2:2"):
        rec(ev.WorkerHeartbeat(address, "a", (), 0.0))
    records = rec.journal.records
    for second in range(1, 100):
        rec(ev.WorkerHeartbeat("w1:1", "a", (), float(second)))
        rec(ev.WorkerHeartbeat("w2:2", "a", (), float(second)))
    assert rec.journal.records == records
    rec(ev.WorkerHeartbeat("w1:1", "b", (), 100.0))  # a new process
    assert rec.journal.records == records + 1
    rec.journal.close()
    # the dispatcher restarts at 200
    handlers = DispatcherImpl(Journal(LocalStorage(tmp_path), id_base=ID_BASE))
    assert {a: w.last_seen for a, w in handlers.state.workers.items()} == {"w1:1": 100.0,
                                                                          "w2:2": 0.0}
    assert handlers.collect_garbage(229.0, 60.0, 30.0, since=200.0) == []
    handlers._apply(ev.WorkerHeartbeat("w1:1", "b", (), 225.0))
    assert handlers.collect_garbage(231.0, 60.0, 30.0, since=200.0) == ["w2:2"]
    assert set(handlers.state.workers) == {"w1:1"}


def test_dispatchers_started_afresh_never_reuse_ids(tmp_path: Path) -> None:
    """Ids held by clients and workers of a lost dispatcher must not name a new one's
    objects (they would read the wrong data); a fault-tolerant one keeps its ids."""
    fresh = {DispatcherImpl().state.next_id for _ in range(20)}
    assert len(fresh) == 20
    first = Journal(LocalStorage(tmp_path / "a")).recover().next_id
    assert Journal(LocalStorage(tmp_path / "a")).recover().next_id == first
    assert Journal(LocalStorage(tmp_path / "b")).recover().next_id != first
