"""DispatcherImpl: the dispatcher's request handlers, TensorFlow's ``DispatcherImpl``.

Each handler turns a request into an event, applies it to :class:`DispatcherState` under one
lock (journaling it first when the dispatcher is fault tolerant) and turns the result into a
response. :class:`~._dispatch_server.DispatchServer` is the gRPC shell that serves them.
One handler per method of the dispatcher's service, sharing that lock, journal and state:
one concept, longer than most modules.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from convoy import monitoring
from convoy._base import fs as _fs
from convoy._transport import rpc as _rpc
from convoy.data._persistence import _distributed_snapshot as layout
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.config import WIRE_COMPRESSIONS as _COMPRESSIONS
from convoy.data.service._common.config import WIRE_TARGET_WORKERS as _TARGET_WORKERS
from convoy.data.service._common.config import policy_from_name, policy_name
from convoy.data.service._common.server_config import DispatcherConfig
from convoy.data.service._common.static_policy import check_listed_worker
from convoy.data.service._common.wire import (
    WORKER,
    WORKER_METHODS,
)
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.journal import Journal, LocalStorage
from convoy.data.service._dispatcher.journal_objects import COMPACT_EVERY as OBJECT_COMPACT_EVERY
from convoy.data.service._dispatcher.journal_objects import ObjectStorage
from convoy.data.service._dispatcher.limits import admit
from convoy.data.service._dispatcher.runs import awaited_consumers
from convoy.data.service._dispatcher.shares import EqualShares, ShareReport
from convoy.data.service._dispatcher.state import DispatcherState, fresh_id_base
from convoy.data.service._status import status, task_splits
from convoy.errors import (
    AbortedError,
    ConvoyError,
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnavailableError,
)

log = logging.getLogger(__name__)

#: The events of reads (and saves) in progress: while the journal cannot be written they are
#: refused as "unavailable", which their callers retry (the read waits), not as new work.
_READS_IN_PROGRESS = (ev.GetSplits, ev.ClientHeartbeat, ev.WorkerHeartbeat, ev.ReleaseClient,
                      ev.GetSaveSplit, ev.SaveStreamDone, ev.AssignSaveStream)
#: The events whose answers are splits: none is answered while the journal lacks the state.
_ANSWERS_SPLITS = (ev.GetSplits, ev.GetSaveSplit)

#: How long the dispatcher waits for a worker that a consumer reported unreachable to answer
#: its ping: a worker that answers at all is alive (a busy one is left to ``worker_timeout_ms``).
PING_TIMEOUT_S = 5.0


def worker_gone(address: str, uid: str, security: Any) -> bool:
    """Whether the worker process ``uid`` at ``address`` is gone: its address refuses
    connections, or another process answers there. Any other failure (no answer in time, an
    older worker without PingWorker) is no proof: the worker may be alive."""
    client = _rpc.Client(address, WORKER, WORKER_METHODS, security)
    try:
        answer = client.call("PingWorker", pb.PingWorkerRequest(), timeout=PING_TIMEOUT_S)
    except UnavailableError:
        return True
    except ConvoyError:
        return False
    finally:
        client.close()
    return bool(answer.worker_uid) and answer.worker_uid != uid


class DispatcherImpl:
    """Request -> event -> response, for every dispatcher RPC. Guarded by ``lock``.

    With a journal, every event that changed more than a last-seen time is durable before its
    answer leaves.
    """

    def __init__(self, journal: Journal | None = None,
                 config: DispatcherConfig | None = None) -> None:
        self.journal = journal
        self.config = config or DispatcherConfig()
        self.worker_addresses = self.config.worker_addresses or ()  # the fixed list, if any
        self.state = _recover(journal) if journal else DispatcherState(fresh_id_base())
        self.lock = threading.RLock()
        self.closed = False
        self.started = time.time()
        #: Why the journal cannot be written (a full disk, say): durable events are refused
        #: until a snapshot of the state can be written again. None: it can.
        self.journal_error: str | None = None
        #: Why this dispatcher stopped for good: another one wrote its journal (fencing)
        self.fenced: AbortedError | None = None
        #: worker address -> (elements, bytes) its tasks buffer, as its last heartbeat said
        self.buffered: dict[str, tuple[int, int]] = {}
        self.checking: set[str] = set()  # workers being pinged after a consumer's report
        self.shares = EqualShares()  # not journaled: a restart forgets them
        #: ``(address, uid) -> bool``: whether that worker process is gone (a ping, by default)
        self.worker_gone: Callable[[str, str], bool] = (
            lambda address, uid: worker_gone(address, uid, self.config.security()))

    def _apply(self, event: ev.Event, keep: bool = False) -> Any:
        """Apply ``event``, durably. If the journal cannot be written, the event is refused
        (:meth:`_refusal`) before or after it changed the state (a snapshot then writes it),
        unless ``keep``: then it is applied anyway and goes into the next snapshot."""
        with self.lock:
            if self.fenced is not None:
                raise self.fenced
            if self.closed:
                raise UnavailableError("the dispatcher is stopping")
            admit(self.config, self.state, event)
            journal = self.journal
            durable = journal is not None and self.state.is_durable(event)
            if journal is not None and not self._caught_up(journal, event, durable):
                if not keep:
                    raise self._refusal(event)
                durable = False
            result = self.state.apply(event)
            if durable and journal is not None and not self._write(
                    journal, lambda: journal.append(event, self.state)) and not keep:
                raise self._refusal(event)
            return result

    def _caught_up(self, journal: Journal, event: ev.Event, durable: bool) -> bool:
        """Whether the journal holds the whole state before ``event``: after a failed write,
        a snapshot must be written first. No answer leaves (a split asked again, say) while
        the journal lacks the state behind it."""
        if self.journal_error is None or not (durable or isinstance(event, _ANSWERS_SPLITS)):
            return True
        return self._write(journal, lambda: journal.compact(self.state))

    def _write(self, journal: Journal, write: Callable[[], None]) -> bool:
        """Run ``write``; False if the journal cannot be written (said once, when it starts
        failing; and once when it is written again)."""
        started = time.perf_counter()
        try:
            write()
        except AbortedError as error:  # fenced: another dispatcher owns the journal now
            self.fenced, self.closed = error, True
            raise
        except OSError as error:
            monitoring.JOURNAL_WRITE_FAILURES.inc()
            if self.journal_error is None:
                where = error.filename or journal.storage.where(f"log-{journal.generation}")
                self.journal_error = (f"cannot write its journal {where}: "
                                      f"{error.strerror or error}")
                log.error("the dispatcher %s; it refuses new work (reads in progress wait) "
                          "until space is freed under its work_dir", self.journal_error)
            return False
        monitoring.JOURNAL_WRITE_SECONDS.observe(time.perf_counter() - started)
        if self.journal_error is not None:
            log.warning("the dispatcher writes its journal again: it takes new work, reads "
                        "in progress go on")
            self.journal_error = None
        return True

    def _refusal(self, event: ev.Event) -> ConvoyError:
        """The error that refuses ``event`` while the journal cannot be written: calls of
        reads in progress wait (they retry "unavailable"), new work is refused."""
        message = f"the dispatcher {self.journal_error}"
        if isinstance(event, _READS_IN_PROGRESS):
            return UnavailableError(f"{message}; retry once space is freed under its work_dir")
        return ResourceExhaustedError(
            f"{message}; it refuses new work until space is freed under its work_dir")

    def close(self) -> None:
        """Take no more events; close the journal."""
        with self.lock:
            self.closed = True
            if self.journal is not None:
                self.journal.close()

    def collect_garbage(self, now: float, client_timeout: float, worker_timeout: float,
                        since: float = 0.0, iteration_timeout: float | None = None
                        ) -> list[str]:
        """Forget clients and workers silent for their timeouts and since ``since`` (this
        dispatcher's start: after a restart everyone gets a timeout to come back), and
        iterations without clients for ``iteration_timeout``; returns the workers declared
        lost. The event names them, so replay drops the same ones."""
        with self.lock:
            clients = self.state.silent_clients(now, client_timeout, since)
            workers = self.state.silent_workers(now, worker_timeout, since)
            lost: list[str] = self._apply(ev.CollectGarbage(
                now, client_timeout, worker_timeout, clients, workers, iteration_timeout,
                adopt=True), keep=True)
        for client_id in clients:
            log.info("client %d silent for %.0f s: released", client_id, client_timeout)
        return lost

    def RegisterDataset(self, r: pb.RegisterDatasetRequest) -> pb.RegisterDatasetResponse:
        if not r.dataset or not r.fingerprint:
            raise InvalidArgumentError("RegisterDataset needs a dataset and its fingerprint")
        if r.compression not in _COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {list(_COMPRESSIONS)}, got {r.compression!r}")
        dataset_id = self._apply(ev.RegisterDataset(
            r.fingerprint, r.dataset, r.compression, r.element_spec, r.cardinality,
            r.num_split_units, r.dataset_id))
        return pb.RegisterDatasetResponse(dataset_id=dataset_id)

    def GetDatasetInfo(self, r: pb.GetDatasetInfoRequest) -> pb.GetDatasetInfoResponse:
        with self.lock:
            record = self.state.dataset(r.dataset_id)
        return pb.GetDatasetInfoResponse(element_spec=record.element_spec,
                                         compression=record.compression,
                                         cardinality=record.cardinality)

    def GetOrCreateJob(self, r: pb.GetOrCreateJobRequest) -> pb.GetOrCreateJobResponse:
        o = r.options
        mode = policy_from_name(o.processing_mode)
        if o.num_consumers < 0:
            raise InvalidArgumentError(f"num_consumers must be >= 0, got {o.num_consumers}")
        if o.target_workers not in _TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {list(_TARGET_WORKERS[1:])}, got "
                f"{o.target_workers!r}")
        # The job keeps whether its readers use the cache, not which trainer asked first.
        options = ev.JobOptions(mode, o.num_consumers, o.target_workers or "AUTO",
                                ev.CACHE_ENABLED if o.cross_trainer_cache else "")
        with self.lock:
            before = len(self.state.jobs)
            job_id = self._apply(ev.GetOrCreateJob(r.dataset_id, r.job_name, options,
                                                   self.worker_addresses,
                                                   coordinated_rules=True))
            created = len(self.state.jobs) > before
        if created:
            log.info("job %d%s created: dataset %s, %s", job_id,
                     f" ({r.job_name!r})" if r.job_name else "", r.dataset_id,
                     options.describe())
        return pb.GetOrCreateJobResponse(job_id=job_id)

    def GetOrCreateIteration(self, r: pb.GetOrCreateIterationRequest
                             ) -> pb.GetOrCreateIterationResponse:
        if r.repetition < 0:
            raise InvalidArgumentError(f"repetition must be >= 0, got {r.repetition}")
        resume = _resume_point(r.resume) if r.HasField("resume") else None
        with self.lock:  # one lock, so the iteration is read as the event left it
            iteration_id, client_id = self._apply(
                ev.GetOrCreateIteration(r.job_id, r.repetition, time.time(), resume))
            iteration = self.state.iterations[iteration_id]
            if iteration.failure:
                raise FailedPreconditionError(iteration.failure)
            finished = iteration.finished
            awaited = awaited_consumers(iteration) if iteration.resume_awaiting else ""
        if resume is not None and awaited:
            log.info("job %d: client %d resumes iteration %d, which waits for %s",
                     r.job_id, client_id, iteration_id, awaited)
        return pb.GetOrCreateIterationResponse(iteration_id=iteration_id, client_id=client_id,
                                               iteration_finished=finished)

    def GetResumePoint(self, r: pb.GetResumePointRequest) -> pb.GetResumePointResponse:
        with self.lock:
            iteration, tasks = self.state.resume_point(r.client_id)
            return pb.GetResumePointResponse(
                split_repetition=iteration.split_repetition,
                split_cursor=iteration.split_cursor, split_size=iteration.split_size,
                consumers=sum(c.iteration_id == iteration.iteration_id
                              for c in self.state.clients.values()),
                iteration_id=iteration.iteration_id,
                tasks=[pb.ResumeTaskInfo(task_id=t.task_id, task=_resume_task_message(t))
                       for t in tasks])

    def Share(self, r: pb.ShareRequest) -> pb.ShareResponse:
        report = ShareReport(
            key=r.key, world_size=r.world_size, rank=r.rank, workers=r.workers,
            worker=r.worker, pad=r.pad, fetched=r.fetched, yielded=r.yielded, wants=r.wants,
            exhausted=r.exhausted, given=tuple(r.given), given_start=r.given_start,
            received=r.received, done=r.done, first=r.first, full=r.full, error=r.error,
            timeout_s=r.timeout_ms / 1000, now=time.monotonic(), reader=r.reader,
            generation=r.generation, allowed=r.allowed, settled=r.settled, mixed=r.mixed,
            discarded=tuple(r.discarded), candidates=tuple(r.candidates), frozen=r.frozen,
            total=r.total, share=r.share, claims=tuple(r.claims), gifts=tuple(r.gifts),
            firsts=tuple(r.firsts))
        with self.lock:
            answer = self.shares.report(report)
        return pb.ShareResponse(allowed=answer.allowed, settled=answer.settled,
                                give=answer.give, pad=answer.pad, receive=answer.receive,
                                elements=answer.elements, more=answer.more,
                                share=answer.share, padded=answer.padded, ready=answer.ready,
                                claims=answer.claims, discard=answer.discard)

    def ClientHeartbeat(self, r: pb.ClientHeartbeatRequest) -> pb.ClientHeartbeatResponse:
        settled = tuple((run.task_id, run.incarnation) for run in r.settled)
        view = self._apply(ev.ClientHeartbeat(r.client_id, time.time(), settled,
                                              _received(r.received),
                                              r.target_processing_time_s, r.waited_s,
                                              r.elapsed_s))
        return pb.ClientHeartbeatResponse(
            tasks=[pb.TaskInfo(task_id=t.task_id, worker_address=t.worker_address,
                               incarnation=t.incarnation, held=t.held, held_for=t.held_for)
                   for t in view.tasks],
            iteration_finished=view.iteration_finished, iteration_failed=view.failure)

    def ReleaseClient(self, r: pb.ReleaseClientRequest) -> pb.Empty:
        self._apply(ev.ReleaseClient(r.client_id, _received(r.received)))
        log.info("client %d released its iteration", r.client_id)
        return pb.Empty()

    def WorkerHeartbeat(self, r: pb.WorkerHeartbeatRequest) -> pb.WorkerHeartbeatResponse:
        _rpc.check_address(r.worker_address, "worker_address")
        if not r.worker_uid:
            raise InvalidArgumentError("WorkerHeartbeat needs a worker_uid")
        check_listed_worker(self.worker_addresses, r.worker_address)
        monitoring.HEARTBEATS.labels("received").inc()
        with self.lock:
            known = self.state.workers.get(r.worker_address)
            ending = [task for t in r.finished_tasks
                      if (task := self.state.tasks.get(t)) is not None and not task.finished]
            orders = self._apply(ev.WorkerHeartbeat(r.worker_address, r.worker_uid,
                                                    tuple(r.current_tasks), time.time(),
                                                    tuple(r.finished_tasks),
                                                    tuple((p.task_id,
                                                           round(p.seconds_per_element * 1e9))
                                                          for p in r.processing)))
            self.buffered[r.worker_address] = (r.buffered_elements, r.buffered_bytes)
            finished = {(iteration.job_id, iteration.iteration_id) for task in ending
                        if (iteration := self.state.iterations.get(task.iteration_id))
                        is not None and self.state.iteration_finished(iteration)}
        for job_id, iteration_id in sorted(finished):
            log.info("job %d: iteration %d finished", job_id, iteration_id)
        if known is None:
            log.info("worker %s registered", r.worker_address)
        elif known.uid != r.worker_uid:
            log.info("worker %s re-registered (a new process): its tasks run again",
                     r.worker_address)
        return pb.WorkerHeartbeatResponse(
            new_tasks=[_task_def(t) for t in orders.new_tasks],
            tasks_to_delete=orders.tasks_to_delete, paused_tasks=orders.paused)

    def GetSplits(self, r: pb.GetSplitsRequest) -> pb.GetSplitsResponse:
        if not 0 < r.max_splits <= 1024 or r.repetition < 0:
            raise InvalidArgumentError(
                f"GetSplits needs 0 < max_splits <= 1024 and repetition >= 0, got "
                f"{r.max_splits} and {r.repetition}")
        if not r.task_id or not r.worker_uid or r.request_number <= 0:
            raise InvalidArgumentError(
                f"GetSplits needs a task_id, a worker_uid and a request_number > 0, got "
                f"{r.task_id}, {r.worker_uid!r} and {r.request_number}")
        event = ev.GetSplits(r.iteration_id, r.repetition, r.max_splits, r.task_id,
                             r.worker_uid, r.request_number, r.incarnation)
        splits, end = self._apply(event)  # the state counts the splits handed out
        return pb.GetSplitsResponse(splits=[pb.Split(start=a, stop=b) for a, b in splits],
                                    end_of_splits=end)

    def GetStatus(self, r: pb.GetStatusRequest) -> pb.GetStatusResponse:
        now = time.time()
        with self.lock:
            for gone in self.buffered.keys() - self.state.workers.keys():
                del self.buffered[gone]
            return status(self.state, now, self.buffered, now - self.started)
    def ReportUnreachableWorker(self, r: pb.ReportUnreachableWorkerRequest
                                ) -> pb.ReportUnreachableWorkerResponse:
        """A consumer cannot reach a worker: check for ourselves (outside the lock) and, if
        it is gone, declare it lost now rather than after ``worker_timeout_ms``."""
        address = r.worker_address
        _rpc.check_address(address, "worker_address")
        with self.lock:
            worker = self.state.workers.get(address)
            if worker is None or address in self.checking:
                return pb.ReportUnreachableWorkerResponse()
            uid = worker.uid
            self.checking.add(address)
        try:
            gone = self.worker_gone(address, uid)
        finally:
            with self.lock:
                self.checking.discard(address)
        lost = gone and bool(self._apply(ev.WorkerLost(address, uid), keep=True))
        if lost:
            log.warning("worker %s refuses connections (reported by client %d reading task "
                        "%d): declared lost, its DYNAMIC tasks adopted", address, r.client_id,
                        r.task_id)
        return pb.ReportUnreachableWorkerResponse(declared_lost=lost)

    def DeregisterWorker(self, r: pb.DeregisterWorkerRequest) -> pb.Empty:
        """A worker leaves (it drained): its unfinished tasks are adopted at once."""
        _rpc.check_address(r.worker_address, "worker_address")
        if self._apply(ev.WorkerLost(r.worker_address, r.worker_uid, left=True), keep=True):
            log.info("worker %s deregistered: its unfinished DYNAMIC tasks are adopted",
                     r.worker_address)
        return pb.Empty()


    # ----- distributed_save ----------------------------------------------------------------
    def Snapshot(self, r: pb.SnapshotRequest) -> pb.Empty:
        if not r.path:
            raise InvalidArgumentError("Snapshot needs a path")
        self._apply(ev.StartSave(r.path, r.dataset_id, r.compression,
                                 random.SystemRandom().randrange(1, 1 << 62)))
        log.info("distributed save of dataset %s to %s started", r.dataset_id, r.path)
        return pb.Empty()

    def GetSnapshotStream(self, r: pb.GetSnapshotStreamRequest
                          ) -> pb.GetSnapshotStreamResponse:
        with self.lock:
            live = {(a, w.uid) for a, w in self.state.workers.items()}
            found = self.state.snapshots.pick_stream(r.worker_address, r.worker_uid, live)
            if found is None:
                return pb.GetSnapshotStreamResponse()
            path, index = found
            save = self._apply(ev.AssignSaveStream(path, index, r.worker_address,
                                                   r.worker_uid))
            payload = self.state.dataset(save.dataset_id).payload
        log.info("worker %s writes stream %d of the save at %s", r.worker_address, index, path)
        return pb.GetSnapshotStreamResponse(
            found=True, path=path, stream_index=index, dataset=payload,
            compression=save.compression, seed=save.seed + index)

    def GetSnapshotSplit(self, r: pb.GetSnapshotSplitRequest) -> pb.GetSnapshotSplitResponse:
        if r.request_number <= 0 or r.repetition < 0:
            raise InvalidArgumentError(
                f"GetSnapshotSplit needs request_number > 0 and repetition >= 0, got "
                f"{r.request_number} and {r.repetition}")
        split, end = self._apply(ev.GetSaveSplit(r.path, r.stream_index, r.worker_address,
                                                 r.repetition, r.request_number))
        if split is None:
            return pb.GetSnapshotSplitResponse(end_of_splits=end)
        return pb.GetSnapshotSplitResponse(split=pb.Split(start=split[0], stop=split[1]))

    def SnapshotStreamDone(self, r: pb.SnapshotStreamDoneRequest
                           ) -> pb.SnapshotStreamDoneResponse:
        done = self._apply(ev.SaveStreamDone(r.path, r.stream_index, r.worker_address,
                                             r.error))
        if r.error:
            log.warning("stream %d of the save at %s failed: %s", r.stream_index, r.path,
                        r.error)
        if done:
            log.info("the distributed save at %s is done", r.path)
            _mark_done(r.path)
        return pb.SnapshotStreamDoneResponse(snapshot_done=done)


def _mark_done(path: str) -> None:
    """Writes the save's ``DONE`` here, as TensorFlow's dispatcher does, so that a worker lost
    right after its last stream cannot leave the save unmarked. The worker told the save is done
    writes it too (the write is atomic and idempotent): the path may not be reachable from
    the dispatcher."""
    try:
        layout.mark(path, layout.DONE_FILE)
    except OSError as error:
        log.warning("could not mark the distributed save at %s done from the dispatcher (%s); "
                    "its last worker marks it", path, error)


def _received(ranges: Any) -> tuple[tuple[int, int, int], ...]:
    received = tuple((r.task_id, r.start, r.stop) for r in ranges)
    if any(start < 0 or stop < start for _, start, stop in received):
        raise InvalidArgumentError("received ranges need 0 <= start <= stop")
    return received


def _resume_point(m: pb.ResumePoint) -> ev.ResumePoint:
    if min(m.split_cursor, m.split_size, m.split_repetition) < 0:
        raise InvalidArgumentError("a resume point needs split_cursor, split_size and "
                                   "split_repetition >= 0")
    return ev.ResumePoint(m.split_repetition, m.split_cursor, m.split_size, tuple(
        ev.ResumeTask(t.seed, t.worker_address, tuple(
            ev.SplitsAnswer("", 0, a.repetition, [(s.start, s.stop) for s in a.splits],
                            a.end_of_splits) for a in t.splits),
            _received_ranges(t.skip), t.skip_count)
        for t in m.tasks), max(1, m.consumers), m.round_index)


def _received_ranges(ranges: Any) -> tuple[tuple[int, int], ...]:
    received = tuple((r.start, r.stop) for r in ranges)
    if any(start < 0 or stop < start for start, stop in received):
        raise InvalidArgumentError("skipped ranges need 0 <= start <= stop")
    return received


def _resume_task_message(task: ev.TaskRecord) -> pb.ResumeTask:
    """What a saved reading keeps of ``task``: its seed, its worker, its split answers and
    the skip it started with."""
    return pb.ResumeTask(
        seed=task.seed or task.task_id, worker_address=task.worker_address,
        splits=[pb.SplitAnswer(repetition=a.repetition,
                               splits=[pb.Split(start=x, stop=y) for x, y in a.splits],
                               end_of_splits=a.end_of_splits) for a in task.split_log],
        skip=[pb.Split(start=a, stop=b) for a, b in task.resumed],
        skip_count=task.skip_count)


def _task_def(task: ev.TaskAssignment) -> pb.TaskDef:
    return pb.TaskDef(task_id=task.task_id, iteration_id=task.iteration_id,
                      dataset_id=task.dataset.dataset_id, dataset=task.dataset.payload,
                      processing_mode=policy_name(task.processing_mode),
                      compression=task.dataset.compression, worker_index=task.worker_index,
                      num_workers=task.num_workers, incarnation=task.incarnation,
                      skip=[pb.Split(start=a, stop=b) for a, b in task.skip],
                      cross_trainer_cache=task.cross_trainer_cache,
                      num_consumers=task.num_consumers, seed=task.seed,
                      skip_count=task.skip_count)


def _recover(journal: Journal) -> DispatcherState:
    """The state ``journal`` holds, its replay summed up in the log."""
    try:
        state = journal.recover()
    except OSError as error:
        raise _disk_error(error, journal.storage.where("meta")) from None
    if journal.generation or journal.records:
        splits = sum(task_splits(task) for task in state.tasks.values())
        log.info("journal %s replayed (snapshot %d and %d events after it): %d datasets, "
                 "%d jobs, %d iterations, %d tasks, %d splits handed out, %d workers and %d "
                 "clients to hear from again", journal.storage.where(""), journal.generation,
                 journal.records, len(state.datasets), len(state.jobs), len(state.iterations),
                 len(state.tasks), splits, len(state.workers), len(state.clients))
    return state


def open_journal(config: DispatcherConfig) -> Journal | None:
    """The journal of a fault-tolerant dispatcher (None otherwise), or an error naming the
    file or directory it could not write."""
    if not config.fault_tolerant_mode:
        return None
    assert config.work_dir is not None  # the config checks it
    directory = os.path.join(config.work_dir, "journal")
    try:
        if _fs.is_url(directory):  # immutable objects, created only if absent (fencing)
            return Journal(ObjectStorage(directory), OBJECT_COMPACT_EVERY)
        return Journal(LocalStorage(directory))
    except OSError as error:
        raise _disk_error(error, directory) from None


def _disk_error(error: OSError, where: str) -> ConvoyError:
    why = error.strerror or str(error)
    return ResourceExhaustedError(
        f"the dispatcher cannot write its journal {error.filename or where}: {why}")
