"""The dataset graph: ops (what to compute) and the iterator nodes they build (how to walk it).

An :class:`Op` is an immutable, picklable description of one dataset transformation with its
input ops. ``op.iterator(state, key)`` builds a :class:`Node`: a live iterator whose ``gen``
attribute is a plain Python iterator (often a C builtin such as ``map``), so a chain of
stateless ops costs no Python frame per element. Every node can describe its position with
``state_dict()``; an op rebuilds an equal node from that state, which is how iterators are
checkpointed. State is only read between two ``next`` calls of the outermost iterator, when
every generator is suspended at a ``yield``.

``key`` names one iteration of the dataset; ops that draw randomness (shuffle, list_files)
derive their seed from it, so ``repeat()`` reshuffles each epoch and a restored iterator draws
the same numbers as the original.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from convoy._values.nest import spec_from_value

if TYPE_CHECKING:
    from convoy.data._core._rows import RowNode, RowSource
    from convoy.data._dataset import Dataset

INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2
AUTOTUNE = -1
SHARD_HINT = -1

_KEY_MOD = (1 << 61) - 1


_SEEDS: contextvars.ContextVar[random.Random | None] = contextvars.ContextVar(
    "convoy_seeds", default=None)


def draw_seed() -> int:
    """A seed for an op given none: fresh randomness, or inside :func:`seeded` the next
    number of a fixed sequence."""
    return (_SEEDS.get() or random.SystemRandom()).getrandbits(63)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Ops built or unpickled inside draw their seeds from ``seed``: a data service task run
    again draws what it drew the first time, so it produces the same elements in order."""
    token = _SEEDS.set(random.Random(seed))
    try:
        yield
    finally:
        _SEEDS.reset(token)


def derive_key(key: int, index: int) -> int:
    """A key for the ``index``-th sub-iteration of the iteration named ``key``."""
    return (key * 1_000_003 + index + 1) % _KEY_MOD


class Node:
    """A live iterator over an op: ``gen`` yields the elements, ``state_dict`` the position."""

    __slots__ = ("gen",)

    gen: Iterator[Any]

    def state_dict(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement state_dict()")

    def close(self) -> None:
        """Release threads or files; the default has none."""


class PassNode(Node):
    """A node that buffers nothing between yields: its state is its input's state."""

    __slots__ = ("input",)

    def __init__(self, input: Node, gen: Iterator[Any]) -> None:
        self.input = input
        self.gen = gen

    def state_dict(self) -> Any:
        return self.input.state_dict()

    def close(self) -> None:
        self.input.close()


class Op:
    """One node of the dataset graph. Subclasses set ``inputs`` and implement ``iterator``."""

    inputs: tuple[Op, ...] = ()
    #: True for sources whose passes can be empty while later ones are not (the data service:
    #: another consumer may have taken a whole shared iteration).
    remote = False
    #: True when every element is one of the input's elements, unchanged (fewer, reordered or
    #: repeated): a walk asking what made an element looks through such ops.
    passes_elements = False

    def reads_remote(self) -> bool:
        """Whether this op or any op upstream of it is a remote source."""
        return self.remote or any(op.reads_remote() for op in self.inputs)

    def iterator(self, state: Any, key: int) -> Node:
        raise NotImplementedError(f"{type(self).__name__} must implement iterator()")

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def static_spec(self) -> Any:
        """The element spec, or None when unknown.

        Derived from the inputs' specs without running anything, except that ops whose
        elements come from a Python function read it off their first element
        (:func:`first_element_spec`), so the ops after them still derive theirs: a batch
        after a map has a leading ``None``, not the size of its first batch.
        """
        return None

    def row_source(self) -> RowSource | None:
        """The arrays this op's elements are rows of, when it can hand them on as row
        numbers (see :mod:`convoy.data._core._rows`); None otherwise, the default."""
        return None

    def row_iterator(self, state: Any, key: int) -> RowNode:
        """A row stream over this op's elements; only where ``row_source()`` is not None."""
        raise NotImplementedError(f"{type(self).__name__} has no row stream")

    def with_inputs(self, inputs: tuple[Op, ...]) -> Op:
        """A copy of this op reading from other inputs (used to swap a pipeline's source)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.inputs = inputs
        return clone

    @property
    def input(self) -> Op:
        return self.inputs[0]


class SameSpecOp(Op):
    """An op whose elements fit its first input's spec."""

    def static_spec(self) -> Any:
        return self.inputs[0].static_spec()


def upstream(op: Op) -> Iterator[Op]:
    """``op`` and every op upstream of it, depth first (an op reached twice comes twice)."""
    yield op
    for input in op.inputs:
        yield from upstream(input)


def replaced(op: Op, replace: Callable[[Op], Op | None]) -> Op:
    """The graph of ``op`` with each op for which ``replace`` returns one replaced by it (and
    nothing upstream of a replaced op visited)."""
    new = replace(op)
    if new is not None:
        return new
    inputs = tuple(replaced(input, replace) for input in op.inputs)
    if all(a is b for a, b in zip(inputs, op.inputs)):
        return op
    return op.with_inputs(inputs)


def through_passing(op: Op) -> Op:
    """The first op at or upstream of ``op`` that does not pass its elements on unchanged."""
    while op.passes_elements:
        op = op.input
    return op


# The public face wrapping an op (convoy.data.Dataset), registered when its module is
# imported: ops that hand datasets to user functions (window, load's reader_func) build them
# through as_dataset, as the face's module imports every op module. The face is typed by a
# type-only import: at run time ops never import it.
_FACE: list[type[Dataset]] = []


def register_face(face: type[Dataset]) -> None:
    """Make ``face(op)`` what :func:`as_dataset` builds (called once, by the face's module)."""
    _FACE[:] = [face]


def face() -> type[Dataset]:
    """The registered face: the class of datasets (``convoy.data.Dataset``)."""
    return _FACE[0]


def as_dataset(op: Op) -> Dataset:
    """``op`` wrapped in the public face, a ``convoy.data.Dataset``."""
    return _FACE[0](op)


# Set while deriving a spec that must not run anything (see derived_spec).
_DERIVING: contextvars.ContextVar[bool] = contextvars.ContextVar("convoy_deriving",
                                                                 default=False)


def first_element_spec(op: Op) -> Any:
    """The spec of ``op``'s first element (None if it has none), read by running it; None
    inside :func:`derived_spec`."""
    if _DERIVING.get():
        return None
    node = op.iterator(None, derive_key(0, 0))
    try:
        for element in node.gen:
            return spec_from_value(element)
        return None
    finally:
        node.close()


def derived_spec(op: Op) -> Any:
    """``op.static_spec()`` where it is known without running anything (no function is
    called for a first element), else None: what an iterator may ask when it is built."""
    token = _DERIVING.set(True)
    try:
        return op.static_spec()
    finally:
        _DERIVING.reset(token)


def element_caller(fn: Callable[..., Any]) -> Callable[[Any], Any]:
    """``fn`` as a one-argument function with tf.data's tuple unpacking."""
    return lambda element: fn(*element) if type(element) is tuple else fn(element)
