"""map (sequential and parallel) and filter."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from itertools import starmap
from typing import Any

from convoy.data._core._op import (
    AUTOTUNE,
    Node,
    Op,
    PassNode,
    SameSpecOp,
    element_caller,
    first_element_spec,
)
from convoy.data._core._options import PIPELINE_DETERMINISTIC

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The process-wide thread pool that runs parallel map calls."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(8, 2 * (os.cpu_count() or 1)),
                                       thread_name_prefix="convoy-map")
        return _pool


def _mapped(fn: Callable[..., Any], upstream: Iterator[Any]) -> Iterator[Any]:
    """``fn`` over ``upstream`` in a C-level loop, unpacking tuples as tf.data does.

    Whether to unpack is decided on the first element; every element of a dataset has the
    same structure.
    """
    for first in upstream:
        if type(first) is tuple:
            yield fn(*first)
            yield from starmap(fn, upstream)
        else:
            yield fn(first)
            yield from map(fn, upstream)
        return


class _RecoverableMap:
    """``fn`` over ``upstream``, one call per ``next``, that outlives an error of ``fn``.

    A generator is over once it raises; this iterator is not, so ``ignore_errors`` can skip
    a failed call and read on from the same upstream, even one that cannot be rebuilt from a
    saved state (DYNAMIC splits). ``upstream_failed`` tells an error of the upstream (which
    may have ended it) from an error of ``fn``.
    """

    __slots__ = ("fn", "upstream", "unpack", "upstream_failed")

    def __init__(self, fn: Callable[..., Any], upstream: Iterator[Any]) -> None:
        self.fn = fn
        self.upstream = upstream
        self.unpack: bool | None = None
        self.upstream_failed = False

    def __iter__(self) -> _RecoverableMap:
        return self

    def __next__(self) -> Any:
        try:
            element = next(self.upstream)
        except StopIteration:
            raise
        except BaseException:
            self.upstream_failed = True
            raise
        if self.unpack is None:
            self.unpack = type(element) is tuple
        return self.fn(*element) if self.unpack else self.fn(element)


class MapOp(Op):
    def __init__(self, input: Op, fn: Callable[..., Any], num_parallel_calls: int | None,
                 deterministic: bool | None) -> None:
        self.inputs = (input,)
        self.fn = fn
        if num_parallel_calls == AUTOTUNE:
            num_parallel_calls = os.cpu_count() or 1
        self.parallelism = num_parallel_calls or 0
        self.deterministic = deterministic

    def cardinality(self) -> int:
        return self.input.cardinality()

    def static_spec(self) -> Any:
        return first_element_spec(self)

    def iterator(self, state: Any, key: int) -> Node:
        if self.parallelism <= 0:
            input = self.input.iterator(state, key)
            return PassNode(input, _mapped(self.fn, input.gen))
        return self._parallel_iterator(state, key)

    def recoverable_iterator(self, state: Any, key: int) -> Node:
        """An iterator that reads on after a call of ``fn`` raised (for ``ignore_errors``)."""
        if self.parallelism <= 0:
            input = self.input.iterator(state, key)
            return PassNode(input, _RecoverableMap(self.fn, input.gen))
        return self._parallel_iterator(state, key)

    def _parallel_iterator(self, state: Any, key: int) -> Node:
        state = state or {"input": None, "pending": []}
        deterministic = self.deterministic
        if deterministic is None:  # the pipeline's Options.deterministic, else True
            deterministic = PIPELINE_DETERMINISTIC.get() is not False
        return ParallelMapNode(self.input.iterator(state["input"], key), self.fn,
                               self.parallelism, deterministic, state["pending"])


class ParallelMapNode(Node):
    """Keeps up to ``parallelism`` calls in flight on the shared pool.

    Its state is the input's position plus the inputs of calls not yet returned, which a
    restored node submits again.
    """

    __slots__ = ("input", "pending")

    def __init__(self, input: Node, fn: Callable[..., Any], parallelism: int,
                 deterministic: bool, pending_inputs: list[Any]) -> None:
        self.input = input
        call = element_caller(fn)
        submit = shared_pool().submit
        self.pending: deque[tuple[Any, Future[Any]]] = deque(
            (x, submit(call, x)) for x in pending_inputs
        )
        self.gen = self._run(call, submit, parallelism, deterministic)

    def _run(self, call: Callable[[Any], Any], submit: Callable[..., Future[Any]],
             parallelism: int, deterministic: bool) -> Iterator[Any]:
        pending = self.pending
        for x in self.input.gen:
            pending.append((x, submit(call, x)))
            if len(pending) >= parallelism:
                yield self._take(deterministic)
        while pending:
            yield self._take(deterministic)

    def _take(self, deterministic: bool) -> Any:
        pending = self.pending
        if not deterministic and not pending[0][1].done():  # the first call to finish
            wait([future for _, future in pending], return_when=FIRST_COMPLETED)
            for i, (_, future) in enumerate(pending):
                if future.done():
                    del pending[i]
                    return future.result()
        # Taken off before its result is read: a call that raised is consumed, so the
        # state after the error (ignore_errors resumes from it) does not run it again.
        return pending.popleft()[1].result()

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "pending": [x for x, _ in self.pending]}

    def close(self) -> None:
        for _, future in self.pending:
            future.cancel()
        self.input.close()


class FilterOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op, predicate: Callable[..., Any]) -> None:
        self.inputs = (input,)
        self.predicate = predicate

    def iterator(self, state: Any, key: int) -> Node:
        input = self.input.iterator(state, key)
        return PassNode(input, filter(element_caller(self.predicate), input.gen))
