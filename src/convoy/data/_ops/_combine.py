"""Ops over several datasets: zip, concatenate, sample_from_datasets, choose_from_datasets."""

from __future__ import annotations

import bisect
import copy
import itertools
import operator
import random
from collections.abc import Iterator
from typing import Any

from convoy._values import nest
from convoy.data._core._op import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Node,
    Op,
    SameSpecOp,
    draw_seed,
)
from convoy.errors import InvalidArgumentError

_END = object()


class _MultiNode(Node):
    """A node over several input nodes, plus op-specific extra state."""

    __slots__ = ("inputs", "extra")

    def __init__(self, inputs: list[Node], extra: Any) -> None:
        self.inputs = inputs
        self.extra = extra

    def state_dict(self) -> Any:
        # a copy: the node goes on mutating `extra` (sample_from_datasets' rng and live list)
        return {"inputs": [n.state_dict() for n in self.inputs],
                "extra": copy.deepcopy(self.extra)}

    def close(self) -> None:
        for node in self.inputs:
            node.close()


def _open_all(op: Op, state: Any, key: int) -> list[Node]:
    states = state["inputs"] if state else [None] * len(op.inputs)
    return [o.iterator(s, key) for o, s in zip(op.inputs, states, strict=True)]


class ZipOp(Op):
    def __init__(self, inputs: tuple[Op, ...], structure: Any) -> None:
        self.inputs = inputs
        self.structure = structure

    def cardinality(self) -> int:
        counts = [o.cardinality() for o in self.inputs]
        finite = [n for n in counts if n >= 0]
        if finite:
            return min(finite) if UNKNOWN_CARDINALITY not in counts else UNKNOWN_CARDINALITY
        return UNKNOWN_CARDINALITY if UNKNOWN_CARDINALITY in counts else INFINITE_CARDINALITY

    def iterator(self, state: Any, key: int) -> Node:
        node = _MultiNode(_open_all(self, state, key), None)
        rows = _zip_rows([n.gen for n in node.inputs])
        if type(self.structure) is tuple and not any(map(nest.is_nested, self.structure)):
            node.gen = rows  # a flat tuple of datasets: the rows are the elements already
        else:
            node.gen = (nest.pack_sequence_as(self.structure, row) for row in rows)
        return node

    def static_spec(self) -> Any:
        specs = [o.static_spec() for o in self.inputs]
        if any(s is None for s in specs):
            return None
        return nest.pack_sequence_as(self.structure, specs)


def _zip_rows(gens: list[Iterator[Any]]) -> Iterator[tuple[Any, ...]]:
    """One element of each of ``gens`` per row. As in TensorFlow's zip, an input that raises
    does not leave the inputs after it behind: they are advanced past the failed row too, so
    an ``ignore_errors`` above resumes with the inputs in step."""
    # One counter, ticked at C speed after each input gives an element: when input k raises,
    # the inputs before it have ticked in this row, so the count modulo len(gens) is k.
    ticks = itertools.count()
    try:
        yield from zip(*[map(_FIRST, zip(gen, ticks)) for gen in gens])
    except Exception:
        for gen in gens[next(ticks) % len(gens) + 1:]:
            try:
                next(gen)
            except StopIteration:
                break
            except Exception:  # the first error of the row is the one raised
                continue
        raise


_FIRST = operator.itemgetter(0)


class ConcatenateOp(SameSpecOp):
    def __init__(self, first: Op, second: Op) -> None:
        self.inputs = (first, second)

    def cardinality(self) -> int:
        a, b = (o.cardinality() for o in self.inputs)
        if INFINITE_CARDINALITY in (a, b):
            return INFINITE_CARDINALITY
        return UNKNOWN_CARDINALITY if UNKNOWN_CARDINALITY in (a, b) else a + b

    def iterator(self, state: Any, key: int) -> Node:
        node = _MultiNode(_open_all(self, state, key), state["extra"] if state else 0)
        node.gen = self._run(node)
        return node

    @staticmethod
    def _run(node: _MultiNode) -> Iterator[Any]:
        if node.extra == 0:
            yield from node.inputs[0].gen
            node.extra = 1
        yield from node.inputs[1].gen


class SampleOp(SameSpecOp):
    """Each element comes from input ``i`` with probability ``weights[i]``."""

    def __init__(self, inputs: tuple[Op, ...], weights: list[float], seed: int | None,
                 stop_on_empty: bool) -> None:
        self.inputs = inputs
        self.weights = weights
        self.seed = seed if seed is not None else draw_seed()
        self.stop_on_empty = stop_on_empty

    def iterator(self, state: Any, key: int) -> Node:
        rng = random.Random(hash((self.seed, key)))
        live = [w > 0 for w in self.weights]
        if state is not None:
            rng.setstate(state["extra"]["rng"])
            live = list(state["extra"]["live"])
        node = _MultiNode(_open_all(self, state, key), {"rng": rng.getstate(), "live": live})
        node.gen = self._run(node, rng)
        return node

    def _run(self, node: _MultiNode, rng: random.Random) -> Iterator[Any]:
        live = node.extra["live"]
        while any(live):
            weights = [w if alive else 0.0 for w, alive in zip(self.weights, live)]
            cumulative = list(itertools.accumulate(weights))
            while True:
                node.extra["rng"] = rng.getstate()
                index = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
                index = min(index, len(cumulative) - 1)
                element = next(node.inputs[index].gen, _END)
                if element is _END:
                    if self.stop_on_empty:
                        return
                    live[index] = False
                    break
                node.extra["rng"] = rng.getstate()
                yield element


class ChooseOp(Op):
    """Element ``k`` comes from ``datasets[choice[k]]``; inputs[0] is the choice dataset."""

    def __init__(self, choice: Op, datasets: tuple[Op, ...], stop_on_empty: bool) -> None:
        self.inputs = (choice, *datasets)
        self.stop_on_empty = stop_on_empty

    def iterator(self, state: Any, key: int) -> Node:
        node = _MultiNode(_open_all(self, state, key), None)
        node.gen = self._run(node)
        return node

    def _run(self, node: _MultiNode) -> Iterator[Any]:
        choices, datasets = node.inputs[0], node.inputs[1:]
        for choice in choices.gen:
            index = int(choice)
            if not 0 <= index < len(datasets):
                raise InvalidArgumentError(
                    f"choose_from_datasets: choice {index} is out of range for "
                    f"{len(datasets)} datasets"
                )
            element = next(datasets[index].gen, _END)
            if element is _END:
                if self.stop_on_empty:
                    return
                continue
            yield element

    def static_spec(self) -> Any:
        return self.inputs[1].static_spec()
