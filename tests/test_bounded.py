"""The small shared caches: BoundedDict keeps its newest entries, PickleCache pickles once."""

from __future__ import annotations

import pytest

from convoy._base.bounded import BoundedDict
from convoy._values.pickling import PickleCache, digested
from convoy.errors import InvalidArgumentError


def test_a_bounded_dict_keeps_its_newest_entries() -> None:
    kept: BoundedDict[int, str] = BoundedDict(2)
    kept[1], kept[2] = "a", "b"
    kept[1] = "c"  # set again: the newest now
    kept[3] = "d"
    assert list(kept.items()) == [(1, "c"), (3, "d")]


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_a_bounded_dict_refuses_a_capacity_below_one(capacity: object) -> None:
    with pytest.raises(InvalidArgumentError, match="`capacity` must be an int >= 1"):
        BoundedDict(capacity)  # type: ignore[arg-type]


class Counted:
    pickled = 0

    def __reduce__(self) -> tuple[object, ...]:
        Counted.pickled += 1
        return (Counted, ())


def test_a_pickle_cache_pickles_each_object_once() -> None:
    cache, value = PickleCache(), Counted()
    first = cache.get(value, "test value")
    assert cache.get(value, "test value") is first
    assert Counted.pickled == 1
    assert first == digested(first[1]) and len(first[0]) == 20
    cache.get(Counted(), "test value")
    assert Counted.pickled == 2


def test_a_pickle_cache_pickles_every_time_what_it_cannot_reference_weakly() -> None:
    cache = PickleCache()
    assert cache.get([1, 2], "a list") == cache.get([1, 2], "a list")
