"""The dispatcher's journal on the S3 test server: the local journal's replay, compaction,
damage and format cases on immutable segment objects; fencing of a second dispatcher; and a
dispatcher SIGKILLed mid-epoch with ``--work-dir s3://...``, every element once under DYNAMIC."""

from __future__ import annotations

import collections
import importlib.util
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle
import pytest

from convoy._base import fs as _fs
from convoy.data import Dataset
from convoy.data.service import distribute
from convoy.data.service._dispatcher.journal import Journal
from convoy.data.service._dispatcher.journal_objects import ObjectStorage
from convoy.data.service._dispatcher_impl import DispatcherImpl
from convoy.errors import AbortedError, DataLossError
from convoy.testing import ProcessCluster, ServerProcess

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).parent


def _local_journal_tests() -> ModuleType:
    """The local journal's tests, for their scenario and helpers."""
    spec = importlib.util.spec_from_file_location(
        "local_journal_tests", HERE / "dispatcher" / "test_journal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


local = _local_journal_tests()


class S3Recorder(local.Recorder):  # type: ignore[misc,name-defined]
    """The local tests' recorder, its journal in objects under ``url``."""

    def __init__(self, url: str, compact_every: int = local.COMPACT_EVERY,
                 restart_every_event: bool = False) -> None:
        self.url = url
        super().__init__(Path("unused"), compact_every, ObjectStorage(url), restart_every_event)

    def _journaled(self) -> None:
        self.snapshots.append(local.durable(self.state.snapshot()))
        if self.restart_every_event:
            self.journal.close()
            self.handlers = DispatcherImpl(Journal(ObjectStorage(self.url), self.compact_every,
                                              local.ID_BASE))
            assert local.durable(self.state.snapshot()) == self.snapshots[-1]


def recover(url: str, compact_every: int = local.COMPACT_EVERY) -> tuple[Journal, dict]:
    journal = Journal(ObjectStorage(url), compact_every, local.ID_BASE)
    return journal, local.durable(journal.recover().snapshot())


def objects(url: str) -> list[str]:
    return _fs.listdir(url)


@pytest.mark.parametrize("compact_every", [local.COMPACT_EVERY, 5])
def test_replay_and_compaction(s3_bucket: str, compact_every: int) -> None:
    url = f"{s3_bucket}/state/journal"
    rec = S3Recorder(url, compact_every)
    local.scenario(rec)
    _, recovered = recover(url, compact_every)
    assert recovered == local.durable(rec.state.snapshot())
    names = objects(url)
    assert "meta" in names
    if compact_every == 5:  # a snapshot, and only the segments after it
        (snapshot,) = [n for n in names if n.endswith(".snapshot")]
        assert all(n > snapshot for n in names if n.endswith(".log"))


def test_restarting_after_every_event_changes_nothing(s3_bucket: str, tmp_path: Path) -> None:
    # the states a straight run goes through are the journal's to keep, not the store's:
    # the straight run journals to a local disk (a third of the test's requests to the store)
    straight = local.Recorder(tmp_path / "straight", 3)
    local.scenario(straight)
    restarted = S3Recorder(f"{s3_bucket}/restarted", 3, restart_every_event=True)
    local.scenario(restarted)
    assert restarted.snapshots == straight.snapshots


def test_an_empty_prefix_recovers_an_empty_state(s3_bucket: str, tmp_path: Path) -> None:
    assert recover(f"{s3_bucket}/never")[1] == local.recover(tmp_path / "never")[1]


def _last_segment(url: str) -> str:
    return f"{url}/{max(n for n in objects(url) if n.endswith('.log'))}"


def test_a_flipped_byte_in_the_last_segment_drops_only_it(s3_bucket: str) -> None:
    url = f"{s3_bucket}/j"
    rec = S3Recorder(url)
    local.scenario(rec)
    last = _last_segment(url)
    data = bytearray(_fs.read_bytes(last))
    data[-6] ^= 0x40
    _fs.atomic_write(last, bytes(data))
    journal, recovered = recover(url)
    assert recovered == rec.snapshots[-2]
    assert not _fs.exists(last)  # the torn tail is cut off


def test_a_damaged_segment_before_whole_ones_is_data_loss(s3_bucket: str) -> None:
    url = f"{s3_bucket}/j"
    local.scenario(S3Recorder(url))
    segments = sorted(n for n in objects(url) if n.endswith(".log"))
    middle = f"{url}/{segments[len(segments) // 2]}"
    data = bytearray(_fs.read_bytes(middle))
    data[14] ^= 0x01
    _fs.atomic_write(middle, bytes(data))
    with pytest.raises(DataLossError, match=f"{url}/log-0"):
        recover(url)


def test_a_journal_of_format_1_is_refused_naming_both_formats(s3_bucket: str) -> None:
    url = f"{s3_bucket}/old"
    _fs.atomic_write(f"{url}/meta", (local.FIXTURE / "meta").read_bytes())
    with pytest.raises(DataLossError, match=f"{url}/meta.*format 1.*format 2"):
        recover(url)


def test_a_second_dispatcher_on_one_work_dir_is_fenced(s3_bucket: str) -> None:
    url = f"{s3_bucket}/shared"
    first = S3Recorder(url)
    local.scenario(first)
    second = DispatcherImpl(Journal(ObjectStorage(url), local.COMPACT_EVERY, local.ID_BASE))
    # the second recovered the first's state; whoever writes next wins the next number
    assert local.durable(second.state.snapshot()) == local.durable(first.state.snapshot())
    event = local.ev.RegisterDataset("fp-other", b"x", "", b"", 1, 1)
    second._apply(event)
    with pytest.raises(AbortedError, match="another dispatcher.*one work_dir"):
        first.handlers._apply(local.ev.RegisterDataset("fp-late", b"y", "", b"", 1, 1))
    with pytest.raises(AbortedError):  # and it stays stopped
        first.handlers._apply(local.ev.RegisterDataset("fp-later", b"z", "", b"", 1, 1))
    assert "fp-other" in {d.fingerprint for d in recover_state(url).datasets.values()}


def recover_state(url: str) -> Any:
    return Journal(ObjectStorage(url), local.COMPACT_EVERY, local.ID_BASE).recover()


# ----- a real dispatcher killed mid-epoch --------------------------------------------------------

#: Enough for a read that outlasts the dispatcher's restart (it is killed a third in).
N = 2000


def slow(x: Any) -> Any:
    time.sleep(0.0005)
    return x


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dispatcher_on_s3_killed_mid_epoch_delivers_every_element_once(
        s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--work-dir", f"{s3_bucket}/state", "--fault-tolerant"]
    counts: collections.Counter[int] = collections.Counter()
    errors: list[BaseException] = []
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        dataset = Dataset.range(N).map(slow).apply(
            distribute("distributed_epoch", cluster.target))

        def consume() -> None:
            try:
                for x in dataset:
                    counts[int(x)] += 1
            except BaseException as error:
                errors.append(error)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        deadline = time.monotonic() + 60
        while sum(counts.values()) < N // 3 and time.monotonic() < deadline:
            assert consumer.is_alive(), errors
            time.sleep(0.01)
        port = cluster.dispatcher.address.rsplit(":", 1)[1]
        cluster.dispatcher.kill()
        cluster.dispatcher = ServerProcess("dispatcher", ["--port", port, *args]).start()
        consumer.join(120)
        assert not consumer.is_alive(), f"hung after {sum(counts.values())} elements"
    assert not errors, errors
    assert not {x: n for x, n in counts.items() if n > 1}, "delivered twice"
    assert sorted(counts) == list(range(N))
    assert any(n.endswith(".log") for n in _fs.listdir(f"{s3_bucket}/state/journal"))
    assert list(tmp_path.iterdir()) == []  # nothing local named s3:


def test_an_unreachable_store_is_a_full_disk_until_it_answers(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the retry budget the dispatcher refuses new work, as on a full disk, and takes
    it again by itself once the store answers (a snapshot is written first)."""
    from convoy.errors import ResourceExhaustedError
    from convoy.testing import free_port

    url = f"{s3_bucket}/flaky"
    rec = S3Recorder(url)
    rec(local.ev.RegisterDataset("fp-a", b"a", "", b"", 1, 1))
    endpoint = _fs.os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setattr(_fs, "ATTEMPTS", 1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ResourceExhaustedError, match="cannot write its journal"):
        rec.handlers._apply(local.ev.RegisterDataset("fp-b", b"b", "", b"", 1, 1))
    assert rec.handlers.journal_error is not None
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    rec.handlers._apply(local.ev.RegisterDataset("fp-c", b"c", "", b"", 1, 1))
    assert rec.handlers.journal_error is None
    fingerprints = {d.fingerprint for d in recover_state(url).datasets.values()}
    assert {"fp-a", "fp-c"} <= fingerprints


@pytest.mark.timeout(120)
def test_a_fenced_dispatcher_process_stops_with_a_clear_error(s3_bucket: str) -> None:
    """Two dispatcher processes on one work_dir: once the second has written, the first's
    next write is refused and it exits non-zero, saying why."""
    from convoy.data.service import register_dataset
    from convoy.errors import ConvoyError

    args = ["--work-dir", f"{s3_bucket}/two", "--fault-tolerant"]
    first = ServerProcess("dispatcher", args).start()
    second = ServerProcess("dispatcher", args).start()
    try:
        register_dataset(f"grpc://{second.address}", Dataset.range(3))
        with pytest.raises(ConvoyError, match="another dispatcher"):
            register_dataset(f"grpc://{first.address}", Dataset.range(4))
        assert first.process is not None
        status = first.process.wait(30)
        assert status != 0
        deadline = time.monotonic() + 10  # its last lines may still be on their way
        while "another dispatcher" not in "".join(first.log):
            assert time.monotonic() < deadline, f"no fencing error in {first.log[-5:]}"
            time.sleep(0.05)
        assert second.process is not None and second.process.poll() is None  # it goes on
        register_dataset(f"grpc://{second.address}", Dataset.range(5))
    finally:
        first.kill()
        second.kill()
