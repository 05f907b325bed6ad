"""cache: the first complete pass is recorded (in memory or in a file) and replayed after."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from typing import IO, Any

from convoy._base import fs as _fs
from convoy.data._core._op import Node, Op, SameSpecOp
from convoy.data._sources._basic import RangeIterNode
from convoy.errors import FailedPreconditionError


class CacheOp(SameSpecOp):
    """Replays its input from memory (``filename == ""``) or from ``filename``'s cache file.

    A pass that stops early records nothing; the memory cache is not pickled with the graph,
    but the state of an iterator replaying it holds its elements, so it restores anywhere.
    """

    passes_elements = True

    def __init__(self, input: Op, filename: str) -> None:
        self.inputs = (input,)
        self.filename = filename
        self._memory: list[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memory": None}

    @property
    def path(self) -> str:
        return f"{self.filename}.convoy-cache"

    def cardinality(self) -> int:
        return self.input.cardinality()

    def _complete(self) -> bool:
        return self._memory is not None if not self.filename else _fs.exists(self.path)

    def iterator(self, state: Any, key: int) -> Node:
        if state is None:
            state = {"mode": "read" if self._complete() else "fill", "input": None,
                     "position": 0, "elements": []}
        if state["mode"] == "fill" and self.filename and self._complete():
            # The saved pass has since finished its file (and renamed it): what it had still
            # to yield is in the cache file, at the same position as in its partial file.
            return _FileReadNode(self.path, state["position"])
        if state["mode"] == "read":
            if not self.filename:
                elements = state.get("elements") or self._memory or []
                if self._memory is None:  # restored where the cache is empty (a new process)
                    self._memory = elements
                return _MemoryReadNode(elements, state["position"])
            return _FileReadNode(self.path, state["position"])
        input = self.input.iterator(state["input"], key)
        if not self.filename:
            return _MemoryFillNode(self, input, state["elements"])
        return _FileFillNode(self, input, state["position"])


class _MemoryReadNode(Node):
    __slots__ = ("_elements", "_indices")

    def __init__(self, elements: list[Any], position: int) -> None:
        self._elements = elements
        self._indices = RangeIterNode(range(len(elements)), position)
        self.gen = map(elements.__getitem__, self._indices.gen)

    def state_dict(self) -> Any:
        return {"mode": "read", "position": self._indices.state_dict(),
                "elements": list(self._elements)}


class _MemoryFillNode(Node):
    __slots__ = ("input", "elements")

    def __init__(self, op: CacheOp, input: Node, elements: list[Any]) -> None:
        self.input = input
        self.elements = list(elements)
        self.gen = self._run(op)

    def _run(self, op: CacheOp) -> Iterator[Any]:
        record = self.elements.append
        for element in self.input.gen:
            record(element)
            yield element
        op._memory = self.elements

    def state_dict(self) -> Any:
        return {"mode": "fill", "input": self.input.state_dict(), "elements": list(self.elements)}

    def close(self) -> None:
        self.input.close()


class _FileReadNode(Node):
    __slots__ = ("file",)

    def __init__(self, path: str, position: int) -> None:
        self.file: IO[bytes] = _fs.open_file(path, "rb")
        self.file.seek(position)
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        load = pickle.load
        file = self.file
        while True:
            try:
                element = load(file)
            except EOFError:
                return
            yield element

    def state_dict(self) -> Any:
        return {"mode": "read", "position": self.file.tell()}

    def close(self) -> None:
        self.file.close()


class _FileFillNode(Node):
    """Writes the partial cache file, opened on the first ``next``: building a node (as
    ``iter(ds)`` does before ``load_state_dict``) must not truncate a file being resumed."""

    __slots__ = ("input", "file", "position", "end")

    def __init__(self, op: CacheOp, input: Node, position: int) -> None:
        self.input = input
        self.file: IO[bytes] | None = None
        self.position = position  # where writing starts
        self.end: int | None = None  # the file's size once it is complete
        self.gen = self._run(op)

    def _run(self, op: CacheOp) -> Iterator[Any]:
        if _fs.is_url(op.path):  # an object appears whole at close: no partial file
            if self.position:
                raise FailedPreconditionError(
                    f"cache: a pass filling {op.path} cannot resume midway (objects cannot "
                    "be appended to); start the pass again")
            file = self.file = _fs.open_file(op.path, "wb")
        else:
            partial = op.path + ".partial"
            file = self.file = open(partial, "r+b" if self.position else "wb")  # noqa: SIM115
            file.truncate(self.position)
            file.seek(self.position)
        dump = pickle.dump
        for element in self.input.gen:
            dump(element, file, protocol=pickle.HIGHEST_PROTOCOL)
            yield element
        self.end = file.tell()
        file.close()
        if not _fs.is_url(op.path):
            os.replace(partial, op.path)

    def state_dict(self) -> Any:
        if self.end is not None:  # complete, and read by a consumer that buffers (shuffle)
            return {"mode": "read", "position": self.end}
        if self.file is None:
            return {"mode": "fill", "input": self.input.state_dict(), "position": self.position}
        self.file.flush()
        return {"mode": "fill", "input": self.input.state_dict(), "position": self.file.tell()}

    def close(self) -> None:
        if self.file is not None:
            discard = getattr(self.file, "discard", None)
            if self.end is None and discard is not None:
                discard()  # an unfinished pass leaves no cache object behind
            else:
                self.file.close()
        self.input.close()
