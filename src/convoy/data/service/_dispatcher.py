"""DispatchServer: the gRPC shell around :class:`DispatcherState`.

Each handler turns a request into an event, applies it under one lock and turns the result
into a response. A background thread collects garbage (silent clients and workers).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from convoy import _rpc
from convoy._security import join_host_port
from convoy.data.service import _dispatcher_state as st
from convoy.data.service import service_pb2 as pb
from convoy.data.service._config import WIRE_COMPRESSIONS as _COMPRESSIONS
from convoy.data.service._config import WIRE_TARGET_WORKERS as _TARGET_WORKERS
from convoy.data.service._config import DispatcherConfig
from convoy.data.service._journal import Journal, LocalStorage
from convoy.data.service._limits import admit
from convoy.data.service._protocol import DISPATCHER, DISPATCHER_METHODS
from convoy.errors import FailedPreconditionError, InvalidArgumentError

log = logging.getLogger(__name__)


def _methods(handler: Any) -> dict[_rpc.Method, Any]:
    return {m: getattr(handler, m.name) for m in DISPATCHER_METHODS}


#: Events that change nothing worth keeping across a restart (only last-seen times).
_EPHEMERAL = (st.ClientHeartbeat,)


class _Handlers:
    """Request -> event -> response, for every dispatcher RPC. Guarded by ``lock``.

    With a journal, every event that changed the state is durable before its answer leaves.
    """

    def __init__(self, journal: Journal | None = None,
                 config: DispatcherConfig | None = None) -> None:
        self.journal = journal
        self.config = config or DispatcherConfig()
        self.state = (journal.recover() if journal
                      else st.DispatcherState(st.fresh_id_base()))
        self.lock = threading.RLock()

    def _apply(self, event: Any) -> Any:
        with self.lock:
            admit(self.config, self.state, event)
            result = self.state.apply(event)
            if self.journal is not None and not isinstance(event, _EPHEMERAL):
                self.journal.append(event, self.state)
            return result

    def collect_garbage(self, now: float, client_timeout: float, worker_timeout: float,
                        since: float = 0.0, iteration_timeout: float | None = None
                        ) -> list[str]:
        """Forget clients and workers silent for their timeouts and since ``since`` (this
        dispatcher's start: after a restart everyone gets a timeout to come back), and
        iterations without clients for ``iteration_timeout``; returns the workers declared
        lost. The event names them, so replay drops the same ones."""
        with self.lock:
            return self._apply(st.CollectGarbage(
                now, client_timeout, worker_timeout,
                self.state.silent_clients(now, client_timeout, since),
                self.state.silent_workers(now, worker_timeout, since), iteration_timeout))

    def RegisterDataset(self, r: pb.RegisterDatasetRequest) -> pb.RegisterDatasetResponse:
        if not r.dataset or not r.fingerprint:
            raise InvalidArgumentError("RegisterDataset needs a dataset and its fingerprint")
        if r.compression not in _COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {list(_COMPRESSIONS)}, got {r.compression!r}")
        dataset_id = self._apply(st.RegisterDataset(
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
        if o.processing_mode not in st.ShardingPolicy.__members__:
            raise InvalidArgumentError(f"unknown processing mode {o.processing_mode!r}")
        if o.num_consumers < 0:
            raise InvalidArgumentError(f"num_consumers must be >= 0, got {o.num_consumers}")
        if o.target_workers not in _TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {list(_TARGET_WORKERS[1:])}, got "
                f"{o.target_workers!r}")
        options = st.JobOptions(o.processing_mode, o.num_consumers, o.target_workers or "AUTO",
                                o.cross_trainer_cache)
        job_id = self._apply(st.GetOrCreateJob(r.dataset_id, r.job_name, options))
        return pb.GetOrCreateJobResponse(job_id=job_id)

    def GetOrCreateIteration(self, r: pb.GetOrCreateIterationRequest
                             ) -> pb.GetOrCreateIterationResponse:
        if r.repetition < 0:
            raise InvalidArgumentError(f"repetition must be >= 0, got {r.repetition}")
        iteration_id, client_id = self._apply(
            st.GetOrCreateIteration(r.job_id, r.repetition, time.time()))
        return pb.GetOrCreateIterationResponse(iteration_id=iteration_id, client_id=client_id)

    def ClientHeartbeat(self, r: pb.ClientHeartbeatRequest) -> pb.ClientHeartbeatResponse:
        view = self._apply(st.ClientHeartbeat(r.client_id, time.time()))
        return pb.ClientHeartbeatResponse(
            tasks=[pb.TaskInfo(task_id=t, worker_address=a) for t, a in view.tasks],
            iteration_finished=view.iteration_finished)

    def ReleaseClient(self, r: pb.ReleaseClientRequest) -> pb.Empty:
        self._apply(st.ReleaseClient(r.client_id))
        return pb.Empty()

    def WorkerHeartbeat(self, r: pb.WorkerHeartbeatRequest) -> pb.WorkerHeartbeatResponse:
        _rpc.check_address(r.worker_address, "worker_address")
        if not r.worker_uid:
            raise InvalidArgumentError("WorkerHeartbeat needs a worker_uid")
        orders = self._apply(st.WorkerHeartbeat(r.worker_address, r.worker_uid,
                                                tuple(r.current_tasks), time.time()))
        return pb.WorkerHeartbeatResponse(
            new_tasks=[_task_def(t) for t in orders.new_tasks],
            tasks_to_delete=orders.tasks_to_delete)

    def TaskFinished(self, r: pb.TaskFinishedRequest) -> pb.Empty:
        self._apply(st.TaskFinished(r.worker_address, r.task_id))
        return pb.Empty()

    def GetSplits(self, r: pb.GetSplitsRequest) -> pb.GetSplitsResponse:
        if not 0 < r.max_splits <= 1024 or r.repetition < 0:
            raise InvalidArgumentError(
                f"GetSplits needs 0 < max_splits <= 1024 and repetition >= 0, got "
                f"{r.max_splits} and {r.repetition}")
        splits, end = self._apply(st.GetSplits(r.iteration_id, r.repetition, r.max_splits))
        return pb.GetSplitsResponse(splits=[pb.Split(start=a, stop=b) for a, b in splits],
                                    end_of_splits=end)


def _task_def(task: st.TaskAssignment) -> pb.TaskDef:
    return pb.TaskDef(task_id=task.task_id, iteration_id=task.iteration_id,
                      dataset_id=task.dataset.dataset_id, dataset=task.dataset.payload,
                      processing_mode=task.processing_mode,
                      compression=task.dataset.compression, worker_index=task.worker_index,
                      num_workers=task.num_workers)


class DispatchServer:
    """The data service's dispatcher: it tracks datasets, jobs, workers and splits; it never
    produces elements itself."""

    def __init__(self, config: DispatcherConfig | None = None, start: bool = True) -> None:
        self._config = config or DispatcherConfig()
        if not isinstance(self._config, DispatcherConfig):
            raise InvalidArgumentError(
                f"config must be a DispatcherConfig, got {type(config).__name__}"
            )
        journal = None
        if self._config.fault_tolerant_mode:
            journal = Journal(LocalStorage(os.path.join(self._config.work_dir, "journal")))
        self._security = self._config.security()
        self._handlers = _Handlers(journal, self._config)
        self._started = time.time()
        self._server: Any = None
        self._port = self._config.port
        self._stopped = threading.Event()
        if start:
            self.start()

    @property
    def target(self) -> str:
        """The address clients use: ``"grpc://<host>:<port>"`` (the host it binds)."""
        return f"grpc://{self._address}"

    @property
    def _address(self) -> str:
        if self._server is None:
            raise FailedPreconditionError("the dispatcher has not been started")
        return join_host_port(self._security.host, self._port)

    def start(self) -> None:
        """Start serving (no-op if already started)."""
        if self._server is not None:
            return
        self._server, self._port = _rpc.serve(DISPATCHER, _methods(self._handlers),
                                              self._config.port, security=self._security)
        threading.Thread(target=self._collect_garbage, name="convoy-dispatcher-gc",
                         daemon=True).start()
        log.info("dispatcher serving at %s", self._address)

    def _collect_garbage(self) -> None:
        config = self._config
        while not self._stopped.wait(config.gc_check_interval_s):
            lost = self._handlers.collect_garbage(time.time(), config.client_timeout_s,
                                                  config.worker_timeout_s, self._started,
                                                  config.iteration_timeout_s)
            for address in lost:
                log.warning("worker %s has not sent a heartbeat for %.0f s: dropped",
                            address, config.worker_timeout_s)

    def join(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self) -> None:
        """Stop serving; in-flight calls are cancelled."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=None).wait()
        if self._handlers.journal is not None:
            with self._handlers.lock:
                self._handlers.journal.close()

    def _num_workers(self) -> int:
        with self._handlers.lock:
            return len(self._handlers.state.workers)

    def __enter__(self) -> DispatchServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass
