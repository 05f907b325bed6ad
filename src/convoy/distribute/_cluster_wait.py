"""The chief waits for its training cluster to come up, so its tasks may start in any order.

On Kubernetes every pod starts at once; a chief whose parameter servers are not listening yet
would fail at its first variable. Before its first use of them, the chief asks every ps and
worker for its ``Status`` until each answers (any answer but "unavailable" counts: an older
server or a refused secret is up, and its first real call says what is wrong), logging whom
it waits for, up to a timeout that ends in an error naming the tasks still missing.
"""

from __future__ import annotations

import logging
import os
import time

from convoy import errors
from convoy._transport import rpc as _rpc
from convoy.distribute._wire import PS_SERVICE, STATUS, WORKER_SERVICE, encode
from convoy.distribute.cluster import ClusterSpec

log = logging.getLogger(__name__)

#: The variable that sets how long a chief waits for its cluster, in seconds.
TIMEOUT_ENV = "CONVOY_CLUSTER_START_TIMEOUT_S"
#: ... by default.
DEFAULT_TIMEOUT_S = 300.0
#: While waiting, it says whom it waits for this often.
LOG_EVERY_S = 10.0
_PROBE_TIMEOUT_S = 2.0


def start_timeout(timeout_s: float | None) -> float:
    """``timeout_s``, else ``$CONVOY_CLUSTER_START_TIMEOUT_S``, else the default."""
    if timeout_s is None:
        text = os.environ.get(TIMEOUT_ENV)
        if not text:
            return DEFAULT_TIMEOUT_S
        try:
            timeout_s = float(text)
        except ValueError:
            raise errors.InvalidArgumentError(
                f"${TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
        raise errors.InvalidArgumentError(
            f"cluster_start_timeout_s must be a number of seconds >= 0, got {timeout_s!r}")
    return float(timeout_s)


def wait_for_cluster(spec: ClusterSpec, timeout_s: float) -> None:
    """Return once every ps and worker of ``spec`` answers; UnavailableError naming those
    that did not after ``timeout_s``."""
    missing = {(job, index): spec.task_address(job, index)
               for job in ("ps", "worker") if job in spec.jobs
               for index in spec.task_indices(job)}
    clients = {task: _rpc.Client(address, PS_SERVICE if task[0] == "ps" else WORKER_SERVICE,
                                 [STATUS]) for task, address in missing.items()}
    started = time.monotonic()
    said = float("-inf")
    try:
        while True:
            for task in list(missing):
                if _answers(clients[task]):
                    del missing[task]
            if not missing:
                if said > float("-inf"):
                    log.info("the training cluster is up after %.1f s",
                             time.monotonic() - started)
                return
            waited = time.monotonic() - started
            names = ", ".join(f"{job}:{index} at {address}"
                              for (job, index), address in sorted(missing.items()))
            if waited >= timeout_s:
                raise errors.UnavailableError(
                    f"the training cluster did not come up within {timeout_s:.0f} s: "
                    f"{names} never answered; start them (or check their addresses), or "
                    f"wait longer with ${TIMEOUT_ENV} or cluster_start_timeout_s")
            if time.monotonic() - said >= LOG_EVERY_S:
                log.info("waiting for %d task%s of the training cluster (%.0f s so far): %s",
                         len(missing), "" if len(missing) == 1 else "s", waited, names)
                said = time.monotonic()
            time.sleep(min(0.5, max(0.0, timeout_s - waited)))
    finally:
        for client in clients.values():
            client.close()


def _answers(client: _rpc.Client) -> bool:
    try:
        client.call("Status", encode(None), timeout=_PROBE_TIMEOUT_S)
    except _rpc.RETRYABLE:
        return False
    except errors.ConvoyError:
        return True  # up, but refuses this call (an older server, another secret)
    return True
