"""The one thread hand-off: order, bounds, end, errors, cancellation and timeouts."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy._transport.channel import Channel, Closed

pytestmark = pytest.mark.timeout(30)


def test_items_arrive_in_order_then_closed() -> None:
    channel: Channel[int] = Channel("numbers", max_items=2)
    producer = threading.Thread(target=lambda: ([channel.put(i) for i in range(100)],
                                                channel.close()))
    producer.start()
    assert list(channel) == list(range(100))
    producer.join()
    assert channel.ended


def test_error_reaches_the_consumer_after_the_items_before_it() -> None:
    channel: Channel[int] = Channel("numbers", items=[1, 2])
    channel.fail(ValueError("broken pipeline"))
    assert channel.get(timeout=1) == 1
    assert channel.get_many(10, timeout=1) == [2]
    with pytest.raises(ValueError, match="broken pipeline"):
        channel.get(timeout=1)


def test_a_full_channel_blocks_put_until_a_take() -> None:
    channel: Channel[int] = Channel("numbers", max_items=1, items=[0])
    with pytest.raises(TimeoutError, match="numbers: still full after 0.05 s"):
        channel.put(1, timeout=0.05)
    threading.Timer(0.05, channel.get).start()
    assert channel.put(1, timeout=5)
    assert channel.snapshot() == [1]


def test_size_bound_admits_one_oversized_item_into_an_empty_channel() -> None:
    channel: Channel[bytes] = Channel("buffers", max_size=10, size_of=len)
    assert channel.put(b"x" * 100, timeout=0)  # alone: never stuck behind its own size
    with pytest.raises(TimeoutError):
        channel.put(b"y", timeout=0.01)
    assert channel.get_many(5, max_size=1, timeout=0) == [b"x" * 100]


def test_size_counts_the_items_waiting() -> None:
    channel: Channel[bytes] = Channel("bytes", size_of=len)
    assert channel.size == 0
    channel.put(b"abc")
    channel.put(b"de")
    assert channel.size == 5
    assert channel.get() == b"abc"
    assert channel.size == 2
    channel.cancel()  # drops what waits
    assert channel.size == 0


def test_get_many_respects_counts_and_sizes() -> None:
    channel: Channel[bytes] = Channel("buffers", size_of=len, items=[b"ab", b"cd", b"ef"])
    assert channel.get_many(10, max_size=3, timeout=0) == [b"ab", b"cd"]
    assert channel.get_many(10, max_size=3, timeout=0) == [b"ef"]
    assert channel.get_many(10, timeout=0.01) == []  # nothing in time: empty, not an error


def test_get_times_out_naming_the_channel() -> None:
    channel: Channel[int] = Channel("elements of task 7")
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="elements of task 7: nothing arrived within 0.05 s"):
        channel.get(timeout=0.05)
    assert time.monotonic() - start < 2


def test_cancel_drops_items_and_wakes_a_blocked_producer() -> None:
    channel: Channel[int] = Channel("numbers", max_items=1, items=[0])
    refused = []
    producer = threading.Thread(target=lambda: refused.append(channel.put(1, timeout=5)))
    producer.start()
    time.sleep(0.05)
    channel.cancel()
    producer.join(timeout=5)
    assert refused == [False]
    assert not channel.wait_for_room(timeout=0)
    with pytest.raises(Closed, match="cancelled"):
        channel.get(timeout=0)
    assert len(channel) == 0 and channel.cancelled and channel.ended


def test_a_bound_by_size_needs_a_size_function() -> None:
    with pytest.raises(ValueError, match="size_of"):
        Channel("x", max_size=10)


@settings(max_examples=50, deadline=None)
@given(items=st.lists(st.integers(), max_size=60), capacity=st.integers(1, 8),
       batch=st.integers(1, 8), fail=st.booleans())
def test_every_item_arrives_once_in_order_whatever_the_bounds(items: list[int], capacity: int,
                                                             batch: int, fail: bool) -> None:
    channel: Channel[int] = Channel("numbers", max_items=capacity)

    def produce() -> None:
        for item in items:
            assert channel.put(item, timeout=10)
        if fail:
            channel.fail(RuntimeError("end"))
        else:
            channel.close()

    producer = threading.Thread(target=produce)
    producer.start()
    received: list[int] = []
    error = None
    while True:
        try:
            received.extend(channel.get_many(batch, timeout=10))
        except Closed:
            break
        except RuntimeError as raised:
            error = raised
            break
    producer.join(timeout=10)
    assert received == items
    assert (error is not None) == fail


def test_put_back_goes_in_front_and_counts_towards_the_bounds() -> None:
    channel: Channel[int] = Channel("numbers", max_items=3)
    channel.put(3)
    channel.put(4)
    assert channel.put_back([1, 2])
    assert len(channel) == 4  # beyond the bound: a producer waits until it is drained
    with pytest.raises(TimeoutError):
        channel.put(5, timeout=0.01)
    assert channel.get_many(10) == [1, 2, 3, 4]


def test_drain_cancels_and_returns_what_was_waiting() -> None:
    channel: Channel[int] = Channel("numbers")
    channel.put(1)
    channel.put(2)
    assert channel.drain() == [1, 2]
    assert channel.cancelled and not channel.put(3) and not channel.put_back([4])


def test_put_back_after_the_last_item_was_taken_is_refused() -> None:
    channel: Channel[int] = Channel("numbers")
    channel.put(1)
    channel.close()
    assert channel.get_many(5) == [1]
    assert not channel.put_back([1])
