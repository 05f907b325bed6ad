"""The dispatcher journal: replay, compaction, torn and corrupt tails, crashes mid-compaction.

No network: events are applied through the dispatcher's own request shell (``_Handlers``), which
journals every event but client heartbeats into ``Journal(LocalStorage(tmp_path))``, and a
second ``Journal`` over the same directory must recover a state whose ``snapshot()`` is equal.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from convoy.data.service import _dispatcher_state as st
from convoy.data.service._dispatcher import _Handlers
from convoy.data.service._journal import COMPACT_EVERY, Journal, LocalStorage
from convoy.data.tfrecord import read_records
from convoy.errors import NotFoundError

#: Every kind of event that changes the dispatcher's state (client heartbeats only touch a
#: last-seen time and are not journaled).
JOURNALED_EVENTS = {"RegisterDataset", "GetOrCreateJob", "GetOrCreateIteration",
                    "WorkerHeartbeat", "TaskFinished", "GetSplits", "ReleaseClient",
                    "CollectGarbage"}


#: Ids start here in these tests (a real new journal draws its base at random).
ID_BASE = 2000


class Recorder:
    """A dispatcher's state and journal in ``directory``, driven like the dispatcher drives
    them; ``snapshots[k]`` is the state after the k-th journaled record (``[0]``: as recovered).
    With ``restart_every_event`` the journal is closed and recovered after every record."""

    def __init__(self, directory: Path, compact_every: int = COMPACT_EVERY,
                 storage: LocalStorage | None = None, restart_every_event: bool = False) -> None:
        self.directory = directory
        self.compact_every = compact_every
        self.restart_every_event = restart_every_event
        self.handlers = _Handlers(Journal(storage or LocalStorage(directory), compact_every,
                                          ID_BASE))
        self.snapshots = [self.state.snapshot()]

    @property
    def state(self) -> st.DispatcherState:
        return self.handlers.state

    @property
    def journal(self) -> Journal:
        assert self.handlers.journal is not None
        return self.handlers.journal

    def __call__(self, event: Any) -> Any:
        result = self.handlers._apply(event)  # raises, unjournaled, for a bad request
        if not isinstance(event, st.ClientHeartbeat):
            self._journaled()
        return result

    def collect_garbage(self, now: float, client_timeout: float,
                        worker_timeout: float) -> list[str]:
        """What the dispatcher's garbage-collection thread does every interval."""
        lost = self.handlers.collect_garbage(now, client_timeout, worker_timeout)
        self._journaled()
        return lost

    def _journaled(self) -> None:
        self.snapshots.append(self.state.snapshot())
        if self.restart_every_event:
            self.journal.close()
            self.handlers = _Handlers(Journal(LocalStorage(self.directory), self.compact_every,
                                              ID_BASE))
            assert self.state.snapshot() == self.snapshots[-1]

    def log_path(self) -> Path:
        return self.directory / f"log-{self.journal.generation}"


def recover(directory: Path, compact_every: int = COMPACT_EVERY) -> tuple[Journal, dict]:
    journal = Journal(LocalStorage(directory), compact_every, ID_BASE)
    return journal, journal.recover().snapshot()


def scenario(rec: Recorder) -> None:
    """A realistic run that makes every kind of state change, checking each did happen."""
    # datasets: a new one, the same one again (same id), one with a requested id
    source = st.RegisterDataset("fp-range", b"range(400)", "AUTO", b"spec", 400, 400)
    dataset = rec(source)
    assert rec(source) == dataset
    files = rec(st.RegisterDataset("fp-files", b"files", "", b"", 6, 6, "my-files"))
    assert files == "my-files"
    # two workers register
    rec(st.WorkerHeartbeat("w1:1", "w1-a", (), 1.0))
    rec(st.WorkerHeartbeat("w2:2", "w2-a", (), 1.0))
    # a shared DYNAMIC job read by two consumers; an anonymous OFF job
    dynamic = rec(st.GetOrCreateJob(dataset, "shared", st.JobOptions("DYNAMIC")))
    assert rec(st.GetOrCreateJob(dataset, "shared", st.JobOptions("DYNAMIC"))) == dynamic
    off = rec(st.GetOrCreateJob(files, "", st.JobOptions("OFF")))
    epoch, first = rec(st.GetOrCreateIteration(dynamic, 0, 2.0))
    assert rec(st.GetOrCreateIteration(dynamic, 0, 2.0))[0] == epoch
    copies, _ = rec(st.GetOrCreateIteration(off, 0, 2.5))
    # the workers pick their tasks up
    for address, uid in (("w1:1", "w1-a"), ("w2:2", "w2-a")):
        assert len(rec(st.WorkerHeartbeat(address, uid, (), 3.0)).new_tasks) == 2
    # a request the state refuses changes nothing and is not journaled
    records = len(rec.snapshots)
    with pytest.raises(NotFoundError):
        rec(st.TaskFinished("w1:1", 999_999))
    assert len(rec.snapshots) == records
    # splits of repetition 0 ...
    for _ in range(3):
        splits, end = rec(st.GetSplits(epoch, 0, 8))
        assert len(splits) == 8 and not end
    # ... a late worker joins the unfinished iterations ...
    late = rec(st.WorkerHeartbeat("w3:3", "w3-a", (), 4.0))
    assert sorted(t.iteration_id for t in late.new_tasks) == sorted([epoch, copies])
    # ... a repeat() in the pipeline asks for repetition 1, which starts the source again,
    # and a straggler of repetition 0 is told it has ended
    assert rec(st.GetSplits(epoch, 1, 8)) == ([(i, i + 1) for i in range(8)], False)
    assert rec(st.GetSplits(epoch, 0, 8)) == ([], True)
    for _ in range(4):
        rec(st.GetSplits(epoch, 1, 8))
    assert rec.state.iterations[epoch].split_cursor == 40
    # a restarted worker (same address, new process) is given its unfinished tasks again
    restarted = rec(st.WorkerHeartbeat("w2:2", "w2-b", (), 5.0))
    assert len(restarted.new_tasks) == 2 and rec.state.workers["w2:2"].uid == "w2-b"
    # tasks finish: the OFF iteration ends, the DYNAMIC one waits for w2
    for address, task_id in rec.state.iterations[copies].tasks.items():
        rec(st.TaskFinished(address, task_id))
    assert rec.state.iteration_finished(rec.state.iterations[copies])
    for address in ("w1:1", "w3:3"):
        rec(st.TaskFinished(address, rec.state.iterations[epoch].tasks[address]))
    # the next epoch of the shared job, then consumers leave
    second_epoch, keeper = rec(st.GetOrCreateIteration(dynamic, 1, 6.0))
    rec(st.ReleaseClient(first))
    # w1 and w2 keep heartbeating, w3 falls silent; a client is silent for too long
    for address, uid in (("w1:1", "w1-a"), ("w2:2", "w2-b")):
        mine = tuple(t.task_id for t in rec.state.tasks.values()
                     if t.worker_address == address and not t.finished)
        rec(st.WorkerHeartbeat(address, uid, mine, 90.0))
    assert rec.collect_garbage(100.0, 95.0, 30.0) == ["w3:3"]
    assert set(rec.state.workers) == {"w1:1", "w2:2"} and set(rec.state.clients) == {keeper}
    # the new epoch hands out its first splits
    assert rec(st.GetSplits(second_epoch, 0, 8))[0] == [(i, i + 1) for i in range(8)]


def journaled_kinds(directory: Path) -> set[str]:
    kinds = set()
    for path in directory.glob("log-*"):
        kinds |= {type(pickle.loads(record)).__name__ for record, _ in read_records(path)}
    return kinds


# ----- replay ------------------------------------------------------------------------------------


def test_replay_restores_every_kind_of_state_change(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    scenario(rec)
    rec.journal.close()
    assert journaled_kinds(tmp_path) == JOURNALED_EVENTS
    _, recovered = recover(tmp_path)
    assert recovered == rec.state.snapshot()


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
        (prefix / "id_base").write_bytes((tmp_path / "run" / "id_base").read_bytes())
        assert recover(prefix)[1] == rec.snapshots[count], f"after {count} records"


@pytest.mark.parametrize("compact_every", [5, 3, 1])
def test_replay_across_compactions(tmp_path: Path, compact_every: int) -> None:
    rec = Recorder(tmp_path, compact_every=compact_every)
    scenario(rec)
    records = len(rec.snapshots) - 1
    assert rec.journal.generation == records // compact_every >= 1
    assert rec.journal.records == records % compact_every
    rec.journal.close()
    # only the snapshot and the current log are left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["id_base", "snapshot", f"log-{rec.journal.generation}"])
    journal, recovered = recover(tmp_path, compact_every)
    assert recovered == rec.state.snapshot()
    assert (journal.generation, journal.records) == (rec.journal.generation,
                                                     rec.journal.records)


def test_a_single_compaction(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, compact_every=5)
    rec(st.RegisterDataset("fp", b"range(10)", "", b"", 10, 10))
    for second in range(1, 7):
        rec(st.WorkerHeartbeat("w1:1", "u", (), float(second)))
    assert (rec.journal.generation, rec.journal.records) == (1, 2)
    rec.journal.close()
    assert recover(tmp_path, 5)[1] == rec.state.snapshot() == rec.snapshots[7]
    assert rec.state.workers["w1:1"].last_seen == 6.0


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


# ----- torn and corrupt tails --------------------------------------------------------------------


def finished_run(tmp_path: Path, compact_every: int) -> tuple[Recorder, bytes, int]:
    """A run whose current log holds at least one record; returns it, the log's bytes and the
    offset where its last record starts."""
    rec = Recorder(tmp_path / "run", compact_every)
    scenario(rec)
    if rec.journal.records == 0:
        rec(st.WorkerHeartbeat("w1:1", "w1-a", (), 101.0))
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
    assert state.snapshot() == rec.snapshots[-2]
    assert (directory / name).stat().st_size == last_start
    event = st.WorkerHeartbeat("w9:9", "w9-a", (), 200.0)
    state.apply(event)
    journal.append(event, state)
    journal.close()
    assert recover(directory, compact_every)[1] == state.snapshot()
    assert "w9:9" in state.workers


@pytest.mark.parametrize("compact_every", [COMPACT_EVERY, 7])
def test_a_log_torn_at_every_byte_of_its_last_record(tmp_path: Path,
                                                     compact_every: int) -> None:
    rec, log, last_start = finished_run(tmp_path, compact_every)
    name = rec.log_path().name
    assert len(log) - last_start > 12 + 4  # a header, some data and a footer to tear
    for cut in range(last_start, len(log)):
        check_damaged_tail(tmp_path, rec, name, log[:cut], last_start, compact_every)


@pytest.mark.parametrize("compact_every", [COMPACT_EVERY, 7])
def test_a_corrupt_byte_in_the_last_record_drops_only_that_record(
        tmp_path: Path, compact_every: int) -> None:
    rec, log, last_start = finished_run(tmp_path, compact_every)
    name = rec.log_path().name
    for position in range(last_start, len(log)):
        damaged = bytearray(log)
        damaged[position] ^= 0x5A
        check_damaged_tail(tmp_path, rec, name, bytes(damaged), last_start, compact_every)


# ----- crashes in the middle of a compaction ----------------------------------------------------


class Crash(Exception):
    """The dispatcher process dies here."""


class CrashingStorage(LocalStorage):
    """Local storage that dies at the first compaction, after writing the snapshot (before
    the new log is opened) or before the old log is removed."""

    def __init__(self, directory: Path, when: str) -> None:
        super().__init__(directory)
        self.when = when

    def replace(self, name: str, data: bytes) -> None:
        super().replace(name, data)
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
    assert state.snapshot() == rec.state.snapshot()
    assert (journal.generation, journal.records) == (1, 0)
    assert not (tmp_path / "log-0").exists()  # the old log, all in the snapshot, is removed
    # the recovered journal goes on: it appends, compacts, and recovers again
    for second in range(6):
        event = st.WorkerHeartbeat("w9:9", "w9-a", (), 200.0 + second)
        state.apply(event)
        journal.append(event, state)
    assert (journal.generation, journal.records) == (2, 1)
    journal.close()
    assert recover(tmp_path, 5)[1] == state.snapshot()


# ----- what is not journaled ---------------------------------------------------------------------


def test_garbage_collection_replays_as_it_happened(tmp_path: Path) -> None:
    """Client heartbeats are not journaled, so which clients a collection found silent is: a
    consumer that kept heartbeating is still known after a restart, a silent one is not."""
    rec = Recorder(tmp_path)
    dataset = rec(st.RegisterDataset("fp", b"range(10)", "", b"", 10, 10))
    job = rec(st.GetOrCreateJob(dataset, "", st.JobOptions("DYNAMIC")))
    _, alive = rec(st.GetOrCreateIteration(job, 0, 0.0))
    _, silent = rec(st.GetOrCreateIteration(job, 0, 0.0))
    rec(st.ClientHeartbeat(alive, 90.0))
    assert rec.collect_garbage(100.0, 50.0, 30.0) == []
    assert set(rec.state.clients) == {alive}
    rec.journal.close()
    _, recovered = recover(tmp_path)
    assert set(recovered["clients"]) == {alive}
    # all the same but the unjournaled last-seen time
    recovered["clients"][alive]["last_seen"] = 90.0
    assert recovered == rec.state.snapshot()


def test_dispatchers_started_afresh_never_reuse_ids(tmp_path: Path) -> None:
    """Ids held by clients and workers of a lost dispatcher must not name a new one's
    objects (they would read the wrong data); a fault-tolerant one keeps its ids."""
    fresh = {_Handlers().state.next_id for _ in range(20)}
    assert len(fresh) == 20
    first = Journal(LocalStorage(tmp_path / "a")).recover().next_id
    assert Journal(LocalStorage(tmp_path / "a")).recover().next_id == first
    assert Journal(LocalStorage(tmp_path / "b")).recover().next_id != first
