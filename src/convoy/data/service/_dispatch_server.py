"""DispatchServer: the gRPC shell around :class:`~._dispatcher_impl.DispatcherImpl`, with
the background thread that collects garbage (silent clients and workers)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._transport import rpc as _rpc
from convoy._transport.security import LOOPBACK
from convoy.data.service._common.server_config import DispatcherConfig
from convoy.data.service._common.wire import (
    DISPATCHER,
    DISPATCHER_METHODS,
)
from convoy.data.service._dispatch_metrics import dispatcher_stats
from convoy.data.service._dispatcher_impl import DispatcherImpl, open_journal
from convoy.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)

log = logging.getLogger(__name__)


class DispatchServer(_rpc.ServerBase):
    """The data service's dispatcher: it tracks datasets, jobs, workers and splits; it never
    produces elements itself."""

    service = DISPATCHER

    def __init__(self, config: DispatcherConfig | None = None, start: bool = True) -> None:
        self._config = config or DispatcherConfig()
        if not isinstance(self._config, DispatcherConfig):
            raise InvalidArgumentError(
                f"config must be a DispatcherConfig, got {type(config).__name__}"
            )
        super().__init__(self._config.port, security=self._config.security())
        self._handlers = DispatcherImpl(open_journal(self._config), self._config)
        self._started = time.time()
        self._stopped = threading.Event()
        self._metrics: monitoring.MetricsServer | None = None
        if start:
            self.start()

    @property
    def target(self) -> str:
        """The address clients use: ``"grpc://<host>:<port>"`` (the host it binds)."""
        return f"grpc://{self._address}"

    @property
    def _address(self) -> str:
        if not self.started:
            raise FailedPreconditionError("the dispatcher has not been started")
        return self.bound_address

    def _methods(self) -> Mapping[_rpc.Method, Callable[[Any], Any]]:
        return {m: getattr(self._handlers, m.name) for m in DISPATCHER_METHODS}

    def _on_start(self) -> None:
        monitoring.add_readiness_check(self._check_name, self._not_ready)
        monitoring.export("dispatcher")
        monitoring.DISPATCHER.watch(self, lambda: dispatcher_stats(self._handlers))
        if self._config.metrics_port is not None:
            self._metrics = monitoring.serve(self._config.metrics_port,
                                             self._config.host or LOOPBACK)
        _threads.start("convoy-dispatcher-gc", self._collect_garbage, restart=True)
        log.info("dispatcher serving at %s", self._address)

    def _collect_garbage(self) -> None:
        config = self._config
        while not self._stopped.wait(config.gc_check_interval_s):
            try:
                lost = self._handlers.collect_garbage(
                    time.time(), config.client_timeout_s, config.worker_timeout_s,
                    self._started, config.iteration_timeout_s)
            except (UnavailableError, AbortedError):
                if self._handlers.closed:
                    return  # stopping, or fenced (the server stops: see ``error``)
                raise
            for address in lost:
                log.warning("worker %s lost: no heartbeat for %.0f s; its DYNAMIC tasks go "
                            "to other workers", address, config.worker_timeout_s)

    @property
    def error(self) -> AbortedError | None:
        """Why this dispatcher stopped taking calls for good (another dispatcher wrote its
        journal: fencing); its command then exits non-zero. None: it did not."""
        return self._handlers.fenced

    def _on_stop(self) -> None:
        self._stopped.set()
        self._handlers.close()
        monitoring.remove_readiness_check(self._check_name)
        monitoring.DISPATCHER.forget(self)
        if self._metrics is not None:
            self._metrics.close()

    @property
    def _check_name(self) -> str:
        return f"dispatcher {id(self):x}"

    def _not_ready(self) -> str | None:
        """Why this dispatcher is not ready (None: it serves and can write its journal)."""
        if self._stopped.is_set() or not self.started:
            return "not serving"
        if self._handlers.fenced is not None:
            return str(self._handlers.fenced)
        return self._handlers.journal_error

    def _num_workers(self) -> int:
        with self._handlers.lock:
            return len(self._handlers.state.workers)

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass
