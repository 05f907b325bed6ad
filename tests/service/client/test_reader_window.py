"""The consumer's side of a reader's window: when the elements it hands out count as returned.

A :class:`~convoy.data.service._client_reader.Reader` built without opening it (no threads, no
calls): batches go straight into its results channel, as its reader threads put them."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from convoy._transport import rpc as _rpc
from convoy.data.service._client import reader_events as ev
from convoy.data.service._client.coordinated_reader_state import ReadRounds
from convoy.data.service._client.options import read_options
from convoy.data.service._client_reader import Reader
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
from convoy.errors import DeadlineExceededError


def coordinated_reader(window: int) -> Reader:
    options = read_options(processing_mode="parallel_epochs", service="grpc://localhost:1",
                           job_name="window", consumer_index=0, num_consumers=2,
                           max_buffered_elements=window)
    dispatcher = _rpc.Client("localhost:1", DISPATCHER, DISPATCHER_METHODS)
    return Reader(options, dispatcher, client_id=1)


def test_a_batch_handed_out_to_its_last_element_frees_the_window_at_once() -> None:
    """A coordinated consumer one request ahead of another (whose answer was lost with its
    worker process) must ask the new process for its next rounds while the program waits on
    the other consumer: else neither moves (the rounds stalled until their timeout)."""
    reader = coordinated_reader(window=4)  # two rounds per request
    state = reader._state
    reader._apply(ev.HeartbeatView((ev.ListedTask(7, "w:1"),), False))
    for start in (0, 2):  # two answers: the window is full
        (read,) = reader._apply(ev.NextRead(0.0))
        assert read == ReadRounds(7, "w:1", 2, round_index=start)
        reader._apply(ev.ElementsArrived(7, 2))
        assert reader.results.put((7, (), [start, start + 1]))
    assert reader._apply(ev.NextRead(0.0)) == (ev.Wait(None),)
    elements = reader.elements()
    try:
        assert [next(elements), next(elements)] == [0, 1]  # no call for the third yet
        assert state.unreturned == 2
        (read,) = reader._apply(ev.NextRead(0.0))
        assert read == ReadRounds(7, "w:1", 2, round_index=4)
    finally:
        reader.close()


# ----- the consumer's wait -----------------------------------------------------------------------

def anonymous_reader(timeout_ms: int) -> Reader:
    options = read_options(processing_mode="distributed_epoch", service="grpc://localhost:1",
                           dispatcher_timeout_ms=timeout_ms)
    dispatcher = _rpc.Client("localhost:1", DISPATCHER, DISPATCHER_METHODS)
    return Reader(options, dispatcher, client_id=1)


@pytest.mark.timeout(20)
def test_a_consumer_whose_reading_no_longer_moves_fails_naming_what_it_waited_for() -> None:
    """Nothing comes back (here: no reader thread runs): after twice dispatcher_timeout_ms
    the consumer's wait ends in an error rather than hanging."""
    reader = anonymous_reader(timeout_ms=200)
    reader._apply(ev.HeartbeatView((ev.ListedTask(7, "w:1"),), False))
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError,
                       match=r"nor from any worker for .* waiting for elements of job "
                             r"\(anonymous\) from the data service \(tasks: 7 on w:1\)"):
        next(reader.elements())
    assert time.monotonic() - started >= 0.4


@pytest.mark.timeout(20)
def test_a_consumer_waits_for_a_slow_pipeline_as_long_as_the_service_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    reader = anonymous_reader(timeout_ms=200)
    answering = threading.Event()

    def heartbeats() -> None:  # the dispatcher answers; the elements take their time
        while not answering.wait(0.05):
            reader._apply(ev.HeartbeatView((ev.ListedTask(7, "w:1"),), False))

    thread = threading.Thread(target=heartbeats, daemon=True)
    thread.start()
    threading.Timer(1.5, reader.results.put, args=((7, (), ["late"]),)).start()
    try:
        with caplog.at_level(logging.WARNING):
            assert next(reader.elements()) == "late"
    finally:
        answering.set()
        reader.close()
    assert any("Still waiting for elements of job (anonymous)" in r.getMessage()
               for r in caplog.records)
