"""The worker's part of distributed_save: when idle, it asks the dispatcher for a stream of a
save, writes it (asking for its splits one by one) and reports the stream's end.

The writing itself (:func:`~convoy.data.service._worker.snapshot_stream.write_stream`) is in
the worker wing; this shell makes the dispatcher calls around it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from convoy._transport import rpc as _rpc
from convoy.data._persistence import _distributed_snapshot as layout
from convoy.data.service import service_pb2 as pb
from convoy.data.service._worker.snapshot_stream import StreamStopped, write_stream
from convoy.errors import ConvoyError

log = logging.getLogger(__name__)

#: How often an idle worker asks the dispatcher for a stream of a distributed save to write.
SNAPSHOT_POLL_S = 0.5


class SaveStreams:
    """Writes the streams of distributed saves the dispatcher gives one worker, one at a time.

    ``call(method, request)`` calls the dispatcher once; ``stopped()`` says the worker stops.
    """

    def __init__(self, call: Callable[[str, Any], Any], address: str, uid: str,
                 timeout_s: float, stopped: Callable[[], bool]) -> None:
        self._call = call
        self._address = address
        self._uid = uid
        self._timeout_s = timeout_s
        self._stopped = stopped

    def loop(self) -> None:
        """Ask for a stream when idle and write it, until the worker stops."""
        while not self._stopped():
            try:
                found = self._call("GetSnapshotStream", pb.GetSnapshotStreamRequest(
                    worker_address=self._address, worker_uid=self._uid))
            except ConvoyError:
                found = None
            if found is None or not found.found:
                time.sleep(SNAPSHOT_POLL_S)
                continue
            self._write(found)

    def _write(self, found: pb.GetSnapshotStreamResponse) -> None:
        numbers = itertools.count(1)
        stopped = self._stopped

        def splits(repetition: int) -> Iterator[tuple[int, int]]:
            while True:
                request = pb.GetSnapshotSplitRequest(
                    path=found.path, stream_index=found.stream_index,
                    worker_address=self._address, repetition=repetition,
                    request_number=next(numbers))
                answer = _rpc.retry(
                    functools.partial(self._call, "GetSnapshotSplit", request),
                    self._timeout_s, f"worker {self._address} asking for splits of a save",
                    stopped)
                if answer.end_of_splits:
                    return
                yield answer.split.start, answer.split.stop

        error = ""
        try:
            write_stream(found.path, found.stream_index, found.dataset, found.compression,
                         found.seed, splits, stopped, self._uid)
        except StreamStopped:
            return
        except Exception as failure:  # noqa: BLE001 - the save fails, the worker goes on
            if stopped():
                return
            error = f"{type(failure).__name__}: {failure}"
            log.warning("stream %d of the save at %s failed: %s", found.stream_index,
                        found.path, error)
            layout.mark(found.path, layout.ERROR_FILE, error)
        request = pb.SnapshotStreamDoneRequest(
            path=found.path, stream_index=found.stream_index, worker_address=self._address,
            error=error)
        try:
            answer = _rpc.retry(functools.partial(self._call, "SnapshotStreamDone", request),
                                self._timeout_s,
                                f"worker {self._address} finishing a stream of a save",
                                stopped)
        except ConvoyError:
            return
        if answer.snapshot_done:
            layout.mark(found.path, layout.DONE_FILE)
