"""convoy.nest (structures and TensorSpec) and convoy.errors (the error tree)."""

from __future__ import annotations

import concurrent.futures
import pickle
from collections import OrderedDict, namedtuple
from typing import Any

import cloudpickle
import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy import errors, nest
from convoy.errors import ConvoyError, InvalidArgumentError
from convoy.nest import TensorSpec

Point = namedtuple("Point", ["x", "y"])
Triple = namedtuple("Triple", ["c", "b", "a"])  # fields in non-alphabetical order

FAST = settings(max_examples=60, deadline=None)


# --- structures --------------------------------------------------------------------------------

leaves = st.one_of(st.integers(), st.text(max_size=3), st.binary(max_size=3),
                   st.builds(np.int32, st.integers(-5, 5)))
structures = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text("abcdef", min_size=1, max_size=3), children, max_size=4),
        st.builds(Point, children, children),
    ),
    max_leaves=12,
)


class Box:
    """A leaf holding a value (so mapping a leaf to it keeps the structure's shape)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def ref_flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in ref_flatten(value[key])]
    if isinstance(value, (list, tuple)):
        return [leaf for child in value for leaf in ref_flatten(child)]
    return [value]


def same(a: Any, b: Any) -> bool:
    """Equal, with the same container types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@FAST
@given(structures)
def test_flatten_and_pack_round_trip(structure: Any) -> None:
    flat = nest.flatten(structure)
    assert flat == ref_flatten(structure)
    assert same(nest.pack_sequence_as(structure, flat), structure)
    nest.assert_same_structure(structure, structure)


@FAST
@given(structures)
def test_map_structure_keeps_the_shape(structure: Any) -> None:
    mapped = nest.map_structure(Box, structure)
    if nest.is_nested(structure):
        nest.assert_same_structure(structure, mapped)
    assert [box.value for box in nest.flatten(mapped)] == ref_flatten(structure)
    assert same(nest.map_structure(lambda box: box.value, mapped), structure)


def test_flatten_examples() -> None:
    assert nest.flatten(5) == [5]
    assert nest.flatten(np.zeros(3)).__len__() == 1  # an array is a leaf
    assert nest.flatten((1, [2, 3], {"b": 4, "a": (5, 6)})) == [1, 2, 3, 5, 6, 4]
    assert nest.flatten({"b": 1, "a": 2, "c": 3}) == [2, 1, 3]  # sorted key order
    assert nest.flatten(OrderedDict([("z", 1), ("a", 2)])) == [2, 1]
    assert nest.flatten(Triple(1, 2, 3)) == [1, 2, 3]  # namedtuples keep field order
    assert nest.flatten(()) == [] and nest.flatten({}) == []
    assert nest.flatten(b"bytes") == [b"bytes"] and nest.flatten("str") == ["str"]


def test_pack_sequence_as_examples() -> None:
    assert nest.pack_sequence_as({"b": 0, "a": (0, 0)}, [1, 2, 3]) == {"a": (1, 2), "b": 3}
    packed = nest.pack_sequence_as([Point(0, 0), (0,)], ["x", "y", "z"])
    assert packed == [Point("x", "y"), ("z",)]
    assert type(packed[0]) is Point
    assert nest.pack_sequence_as(0, [7]) == 7
    ordered = nest.pack_sequence_as(OrderedDict([("z", 0), ("a", 0)]), [1, 2])
    assert type(ordered) is OrderedDict and ordered == {"a": 1, "z": 2}


def test_pack_sequence_as_wrong_count() -> None:
    with pytest.raises(InvalidArgumentError, match=r"flat has 1 values, too few"):
        nest.pack_sequence_as((0, 0), [1])
    with pytest.raises(InvalidArgumentError, match=r"structure has 2 leaves but flat has 3"):
        nest.pack_sequence_as((0, 0), [1, 2, 3])


def test_map_structure_over_several_structures() -> None:
    a = {"x": (1, 2), "y": [3]}
    b = {"x": (10, 20), "y": [30]}
    assert nest.map_structure(lambda p, q: p + q, a, b) == {"x": (11, 22), "y": [33]}
    assert nest.map_structure(lambda p: p * 2, Point(1, 2)) == Point(2, 4)
    with pytest.raises(InvalidArgumentError, match=r"structures differ at \['y'\]"):
        nest.map_structure(lambda p, q: p, a, {"x": (1, 2), "y": [1, 2]})
    with pytest.raises(InvalidArgumentError, match="at least one structure"):
        nest.map_structure(lambda: 0)


@pytest.mark.parametrize("first, second, where", [
    ((1, 2), (1, 2, 3), r"at the top level: tuple of length 2 vs tuple of length 3"),
    ((1, 2), [1, 2], r"at the top level: tuple vs list"),
    ({"a": 1}, {"b": 1}, r"at the top level: dict keys \['a'\] vs \['b'\]"),
    ({"a": (1, [2, 3])}, {"a": (1, [2])},
     r"at \['a'\]\[1\]: list of length 2 vs list of length 1"),
    ((1, (2,)), (1, 2), r"at \[1\]: tuple of length 1 vs a leaf"),
    ([1, {"k": 2}], [1, {"k": (2,)}], r"at \[1\]\['k'\]: a leaf vs tuple of length 1"),
    (Point(1, 2), (1, 2), r"at the top level: Point vs tuple"),
])
def test_assert_same_structure_locates_the_difference(first: Any, second: Any,
                                                      where: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"structures differ " + where):
        nest.assert_same_structure(first, second)


def test_assert_same_structure_without_type_check() -> None:
    nest.assert_same_structure((1, [2]), [1, (2,)], check_types=False)
    nest.assert_same_structure(Point(1, 2), (3, 4), check_types=False)
    nest.assert_same_structure(np.zeros(3), 5)  # two leaves
    with pytest.raises(InvalidArgumentError, match="length 2 vs list of length 3"):
        nest.assert_same_structure((1, 2), [1, 2, 3], check_types=False)


def test_flatten_up_to() -> None:
    shallow = (0, {"b": 0, "a": 0})
    assert nest.flatten_up_to(shallow, ([1, 2], {"a": (3,), "b": 4})) == [[1, 2], (3,), 4]
    assert nest.flatten_up_to(0, (1, 2)) == [(1, 2)]
    with pytest.raises(InvalidArgumentError, match=r"differ at \[1\]: dict with keys"):
        nest.flatten_up_to(shallow, (1, 2))
    with pytest.raises(InvalidArgumentError, match=r"dict keys \['a', 'b'\] vs \['a', 'c'\]"):
        nest.flatten_up_to(shallow, (1, {"a": 1, "c": 2}))


def test_is_nested() -> None:
    assert all(nest.is_nested(v) for v in [(), [], {}, Point(1, 2)])
    assert not any(nest.is_nested(v) for v in [1, "s", b"b", np.zeros(2), None])


# --- TensorSpec --------------------------------------------------------------------------------


def test_tensor_spec_equality_and_hash() -> None:
    a = TensorSpec([2, None], np.float32)
    assert a == TensorSpec((2, None), "float32")
    assert hash(a) == hash(TensorSpec((2, None), np.dtype("float32")))
    assert a != TensorSpec([2, None], np.float64)
    assert a != TensorSpec([2, 3], np.float32)
    assert a != TensorSpec(None, np.float32)
    assert a != (2, None)
    assert TensorSpec([], bytes) == TensorSpec([], str) == TensorSpec([], "string")
    assert TensorSpec([3]).dtype == np.float32  # the default dtype, as in TensorFlow
    assert len({a, TensorSpec([2, None], np.float32), TensorSpec([1])}) == 2


def test_tensor_spec_shape_and_rank() -> None:
    assert TensorSpec([2, None]).shape == (2, None)
    assert TensorSpec([2, None]).rank == 2
    assert TensorSpec([]).rank == 0
    assert TensorSpec(None).rank is None and TensorSpec(None).shape is None
    assert TensorSpec(np.array([3, 4])).shape == (3, 4)


def test_tensor_spec_repr() -> None:
    assert repr(TensorSpec([2, None], np.float32)) == "TensorSpec(shape=[2, None], dtype=float32)"
    assert repr(TensorSpec([], bytes)) == "TensorSpec(shape=[], dtype=string)"
    assert repr(TensorSpec(None, np.int64)) == "TensorSpec(shape=<unknown>, dtype=int64)"


def test_tensor_spec_compatibility() -> None:
    spec = TensorSpec([None, 3], np.int64)
    assert spec.is_compatible_with(TensorSpec([5, 3], np.int64))
    assert spec.is_compatible_with(TensorSpec([None, None], np.int64))
    assert spec.is_compatible_with(TensorSpec(None, np.int64))
    assert not spec.is_compatible_with(TensorSpec([5, 4], np.int64))
    assert not spec.is_compatible_with(TensorSpec([5, 3], np.int32))
    assert not spec.is_compatible_with(TensorSpec([3], np.int64))
    assert spec.is_compatible_with(np.zeros((7, 3), np.int64))  # a value
    assert not spec.is_compatible_with(np.zeros((7, 3), np.float32))
    assert TensorSpec(None, np.int64).is_compatible_with(np.zeros((1, 2, 3), np.int64))
    assert TensorSpec([], bytes).is_compatible_with(b"x")
    assert TensorSpec([], np.int64).is_compatible_with(3)
    assert TensorSpec([], np.float64).is_compatible_with(3.5)  # Python floats are float64


def test_tensor_spec_most_specific_common() -> None:
    a, b = TensorSpec([2, 3], np.int64), TensorSpec([2, 4], np.int64)
    assert a.most_specific_common(b) == TensorSpec([2, None], np.int64)
    assert a.most_specific_common(TensorSpec([2], np.int64)) == TensorSpec(None, np.int64)
    assert a.most_specific_common(a) == a


def test_spec_from_value() -> None:
    value = {"img": np.zeros((2, 3), np.uint8), "label": 3, "name": b"x", "ok": True,
             "w": 0.5, "pair": (np.float32(1), "s")}
    assert nest.spec_from_value(value) == {
        "img": TensorSpec([2, 3], np.uint8),
        "label": TensorSpec([], np.int64),
        "name": TensorSpec([], bytes),
        "ok": TensorSpec([], np.bool_),
        "w": TensorSpec([], np.float64),
        "pair": (TensorSpec([], np.float32), TensorSpec([], bytes)),
    }


def test_tensor_spec_pickles() -> None:
    spec = TensorSpec([None, 2], np.int16)
    assert pickle.loads(pickle.dumps(spec)) == spec


# --- errors -------------------------------------------------------------------------------------

ALL_ERRORS = [cls for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, ConvoyError)]

BUILTIN_BASES = {
    errors.CancelledError: concurrent.futures.CancelledError,
    errors.InvalidArgumentError: ValueError,
    errors.DeadlineExceededError: TimeoutError,
    errors.NotFoundError: LookupError,
    errors.PermissionDeniedError: PermissionError,
    errors.FailedPreconditionError: RuntimeError,
    errors.OutOfRangeError: IndexError,
    errors.UnimplementedError: NotImplementedError,
    errors.UnavailableError: ConnectionError,
}


def test_the_error_tree_is_complete() -> None:
    assert len(ALL_ERRORS) == 17  # the base and one class per non-OK gRPC status code
    assert set(errors.BY_GRPC_CODE.values()) == set(ALL_ERRORS) - {ConvoyError}


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("dumps, loads", [(pickle.dumps, pickle.loads),
                                          (cloudpickle.dumps, cloudpickle.loads)])
def test_every_error_pickles(cls: type[ConvoyError], dumps: Any, loads: Any) -> None:
    error = cls("something went wrong: 'x' at offset 12")
    copy = loads(dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) == "something went wrong: 'x' at offset 12"
    assert copy.message == error.message
    assert copy.args == error.args
    assert isinstance(copy, ConvoyError) and isinstance(copy, Exception)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_is_a_convoy_error_and_its_builtin(cls: type[ConvoyError]) -> None:
    error = cls("m")
    assert isinstance(error, ConvoyError)
    builtin = BUILTIN_BASES.get(cls)
    if builtin is not None:
        assert isinstance(error, builtin)
        with pytest.raises(builtin, match="^m$"):
            raise error
    # no bases beyond the documented one (and that one's own bases)
    bases = set(cls.__mro__[1:]) - {ConvoyError, Exception, BaseException, object}
    if builtin is None:
        assert bases == set()
    else:
        assert builtin in bases and all(issubclass(builtin, b) for b in bases)


@pytest.mark.parametrize("cls", [c for c in ALL_ERRORS if c is not ConvoyError],
                         ids=lambda c: c.__name__)
def test_grpc_code_round_trip(cls: type[ConvoyError]) -> None:
    error = cls("remote failure")
    code = errors.grpc_code_name(error)
    assert code == cls.grpc_code
    assert code in grpc.StatusCode.__members__ and code != "OK"
    back = errors.from_grpc_code(code, "remote failure")
    assert type(back) is cls and str(back) == "remote failure"


def test_grpc_code_of_foreign_and_unknown() -> None:
    assert errors.grpc_code_name(ValueError("x")) == "UNKNOWN"
    assert errors.grpc_code_name(ConvoyError("x")) == "UNKNOWN"
    assert type(errors.from_grpc_code("UNKNOWN", "x")) is errors.UnknownError
    assert type(errors.from_grpc_code("NO_SUCH_CODE", "x")) is errors.UnknownError
    every_code = {c.name for c in grpc.StatusCode} - {"OK"}
    assert set(errors.BY_GRPC_CODE) == every_code


def test_errors_default_message_and_chaining() -> None:
    assert str(errors.InternalError()) == ""
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise errors.NotFoundError("outer") from inner
    except LookupError as caught:  # NotFoundError is a LookupError, like KeyError
        assert isinstance(caught.__cause__, KeyError)
