"""Background threads that never die silently.

Every thread convoy starts goes through :func:`start`. An unexpected exception in one is
logged with its traceback, then one of three things happens, chosen where it starts:

- ``restart=True``: the thread runs its target again after a bounded backoff (a loop whose
  every pass stands alone: a collector, a poller, an accept loop);
- ``on_error``: its owner hears the error and fails what the thread served (a reading, a
  task, a stream), so the error reaches whoever waits on it;
- neither: the process turns not-live (``/healthz`` fails) and exits with
  :data:`EXIT_THREAD_FAILED`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: The exit status of a process one of whose threads failed with no one to tell.
EXIT_THREAD_FAILED = 70
#: A restarted thread waits this long after its first failure, doubling to MAX_BACKOFF_S.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
#: Tests: the first thread whose name starts with this variable's value fails as it starts.
FAULT_ENV = "CONVOY_TEST_THREAD_FAULT"

_dead: list[str] = []  # why this process is not live, if it is not
_injected: set[str] = set()
_lock = threading.Lock()


class InjectedFault(RuntimeError):
    """The failure a test injects into a thread (see :data:`FAULT_ENV`)."""


def not_live() -> str | None:
    """Why this process is not live (a thread failed with no one to tell); None: it is."""
    with _lock:
        return _dead[0] if _dead else None


def start(name: str, target: Callable[..., Any], *args: Any, restart: bool = False,
          on_error: Callable[[BaseException], None] | None = None) -> threading.Thread:
    """Start daemon thread ``name`` running ``target(*args)``, supervised as the module
    says."""
    thread = threading.Thread(target=_supervise, name=name, daemon=True,
                              args=(name, target, args, restart, on_error))
    thread.start()
    return thread


def _supervise(name: str, target: Callable[..., Any], args: tuple[Any, ...], restart: bool,
               on_error: Callable[[BaseException], None] | None) -> None:
    delay = FIRST_BACKOFF_S
    while True:
        began = time.monotonic()
        try:
            _maybe_inject(name)
            target(*args)
            return
        except Exception as error:  # noqa: BLE001 - the point: none goes unseen
            failure = error
        log.error("thread %s failed: %s: %s", name, type(failure).__name__, failure,
                  exc_info=failure)
        if restart:
            if time.monotonic() - began > 2 * MAX_BACKOFF_S:
                delay = FIRST_BACKOFF_S  # it ran a good while: a new run of failures
            log.warning("thread %s restarts in %.1f s", name, delay)
            time.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
        elif on_error is not None:
            _tell(name, on_error, failure)
            return
        else:
            _fail_process(name, failure)
            return


def _tell(name: str, on_error: Callable[[BaseException], None], error: BaseException) -> None:
    try:
        on_error(error)
    except Exception as failure:  # noqa: BLE001 - the owner failed to hear it: fatal
        log.exception("thread %s: its owner failed to take its error", name)
        _fail_process(name, failure)


def _fail_process(name: str, error: BaseException) -> None:
    with _lock:
        _dead.append(f"thread {name} failed: {type(error).__name__}: {error}")
    log.critical("thread %s failed and no one can take over its work: the process exits "
                 "(status %d)", name, EXIT_THREAD_FAILED)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_THREAD_FAILED)


def _maybe_inject(name: str) -> None:
    wanted = os.environ.get(FAULT_ENV)
    if not wanted or not name.startswith(wanted):
        return
    with _lock:
        if wanted in _injected:
            return
        _injected.add(wanted)
    raise InjectedFault(f"a failure injected into thread {name}")
