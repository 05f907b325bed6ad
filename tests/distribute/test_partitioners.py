"""convoy.distribute.partitioners: TensorFlow's partitioner arithmetic and the "div" layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy.distribute import partitioners
from convoy.distribute.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    partition_count,
    shard_offsets,
    shard_sizes,
)
from convoy.errors import InvalidArgumentError

F32, F64, I8 = np.float32, np.float64, np.int8
KIB, MIB = 1 << 10, 1 << 20


# --- FixedShardsPartitioner --------------------------------------------------------------------

@pytest.mark.parametrize(
    "num_shards, shape, axis, expected",
    [
        (2, [10, 3], 0, [2, 1]),          # TF docstring example
        (4, [3], 0, [3]),                 # capped at the axis length
        (4, [3, 5], 0, [3, 1]),
        (1, [10, 10], 0, [1, 1]),
        (5, [5, 2, 2], 0, [5, 1, 1]),
        (7, [100], 0, [7]),
        (3, [10, 2], 1, [1, 2]),          # other axis, capped at 2
        (3, [10, 4], -1, [1, 3]),         # negative axis counts from the end
        (4, [0, 3], 0, [0, 1]),           # TF's min(num_shards, 0); partition_count skips these
    ],
)
def test_fixed_shards(num_shards, shape, axis, expected):
    assert FixedShardsPartitioner(num_shards)(shape, F32, axis=axis) == expected


def test_fixed_shards_ignores_dtype_and_accepts_tuple_and_numpy_shapes():
    p = FixedShardsPartitioner(2)
    assert p((10, 3), "string") == [2, 1]
    assert p(np.zeros((10, 3)).shape, None) == [2, 1]
    assert p([np.int64(10), np.int32(3)], F64) == [2, 1]


# --- MinSizePartitioner ------------------------------------------------------------------------

# n = max(1, min(rows, max_shards, ceil(num_elements * element_size / min_shard_bytes)))
@pytest.mark.parametrize(
    "min_bytes, max_shards, per_string, shape, dtype, expected",
    [
        # TF docstring: 6*1*4 = 24 B, 24/4 = 6 wanted; min(6 rows, 2, 6) = 2
        (4, 2, 16, [6, 1], F32, [2, 1]),
        # same with max_shards=10: min(6, 10, 6) = 6
        (4, 10, 16, [6, 1], F32, [6, 1]),
        # pv.py docstring: 1024*1024*4 = 4 MiB, / 256 KiB = 16
        (256 * KIB, 16, 16, [1024, 1024], F32, [16, 1]),
        (256 * KIB, 32, 16, [1024, 1024], F32, [16, 1]),
        (256 * KIB, 2, 16, [1024, 1024], F32, [2, 1]),
        # tutorial embedding: 8*16384*4 = 512 KiB, / 256 KiB = 2, max_shards=2 -> 2
        (256 * KIB, 2, 16, [8, 16384], F32, [2, 1]),
        # float64 doubles the bytes: 8 MiB / 256 KiB = 32
        (256 * KIB, 100, 16, [1024, 1024], F64, [32, 1]),
        # int8: 1 MiB / 256 KiB = 4
        (256 * KIB, 100, 16, [1024, 1024], I8, [4, 1]),
        (256 * KIB, 100, 16, [1024, 1024], np.bool_, [4, 1]),
        (256 * KIB, 100, 16, [1024, 1024], np.complex128, [64, 1]),
        # rounding up: 400 B / 1000 = 0.4 -> 1; 400/100 = 4; 400/300 = 1.33 -> 2
        (1000, 10, 16, [10, 10], F32, [1, 1]),
        (100, 10, 16, [10, 10], F32, [4, 1]),
        (300, 10, 16, [10, 10], F32, [2, 1]),
        (399, 10, 16, [10, 10], F32, [2, 1]),
        (400, 10, 16, [10, 10], F32, [1, 1]),
        # strings: 20 elements * 16 B = 320 B; /16 = 20 -> capped at 10 rows
        (16, 100, 16, [10, 2], object, [10, 1]),
        (64, 100, 16, [10, 2], object, [5, 1]),       # 320/64 = 5
        (64, 100, 32, [10, 2], object, [10, 1]),      # 640/64 = 10
        (64, 100, 4, [10, 2], "string", [2, 1]),      # 80/64 = 1.25 -> 2
        (16, 100, 16, [4], np.dtype("<U5"), [4]),     # numpy str: bytes_per_string, not itemsize
        (16, 100, 16, [4], np.dtype("S9"), [4]),
        (16, 100, 16, [4], bytes, [4]),
        # capped by the row count: 12000 B / 1 = 12000 wanted, 3 rows
        (1, 100, 16, [3, 1000], F32, [3, 1]),
        # empty variable still gets one piece
        (4, 10, 16, [0, 5], F32, [1, 1]),
        (4, 10, 16, [5, 0], F32, [1, 1]),
    ],
)
def test_min_size(min_bytes, max_shards, per_string, shape, dtype, expected):
    p = MinSizePartitioner(min_shard_bytes=min_bytes, max_shards=max_shards,
                           bytes_per_string=per_string)
    assert p(shape, dtype) == expected


def test_min_size_default_never_shards():
    p = MinSizePartitioner()
    assert (p.min_shard_bytes, p.max_shards, p.bytes_per_string) == (256 * KIB, 1, 16)
    assert p([1 << 20, 1024], F64) == [1, 1]


def test_min_size_other_axis():
    # 1*6*4 = 24 B / 4 = 6 along axis 1
    assert MinSizePartitioner(4, 10)([1, 6], F32, axis=1) == [1, 6]


# --- MaxSizePartitioner ------------------------------------------------------------------------

# slice = num_elements / rows * element_size; per_shard = max(1, floor(max_bytes / slice))
# n = ceil(rows / per_shard), then min(max_shards, n) when max_shards is given
@pytest.mark.parametrize(
    "max_bytes, max_shards, per_string, shape, dtype, expected",
    [
        # TF docstring: slice = 4 B, 4/4 = 1 row per shard -> 6 shards
        (4, None, 16, [6, 1], F32, [6, 1]),
        (4, 2, 16, [6, 1], F32, [2, 1]),
        # 1024/4 = 256 rows per shard -> 1 shard
        (1024, None, 16, [6, 1], F32, [1, 1]),
        # a row (4 B) bigger than the limit (2 B) still gets a shard of its own
        (2, None, 16, [6, 1], F32, [6, 1]),
        # slice = 10*4 = 40 B; floor(100/40) = 2 rows per shard; ceil(10/2) = 5
        (100, None, 16, [10, 10], F32, [5, 1]),
        # floor(120/40) = 3; ceil(10/3) = 4
        (120, None, 16, [10, 10], F32, [4, 1]),
        (79, None, 16, [10, 10], F32, [10, 1]),     # floor(79/40) = 1
        (80, None, 16, [10, 10], F32, [5, 1]),      # floor(80/40) = 2
        # float64 slice = 80 B; floor(1.25) = 1 -> 10 shards
        (100, None, 16, [10, 10], F64, [10, 1]),
        # int8 slice = 10 B: 100 B holds all 10 rows; 25 B holds 2 -> 5 shards
        (100, None, 16, [10, 10], I8, [1, 1]),
        (25, None, 16, [10, 10], I8, [5, 1]),
        # strings: slice = 2*16 = 32 B; floor(100/32) = 3; ceil(10/3) = 4
        (100, None, 16, [10, 2], object, [4, 1]),
        # bytes_per_string 8: slice = 16 B; floor(6.25) = 6; ceil(10/6) = 2
        (100, None, 8, [10, 2], object, [2, 1]),
        (100, None, 8, [10, 2], "string", [2, 1]),
        # protobuf-safe limit: slice 4096 B, floor((64 MiB - 1)/4096) = 16383 rows -> 1 shard
        ((64 << 20) - 1, None, 16, [1024, 1024], F32, [1, 1]),
        # 1 MiB / 4096 B = 256 rows per shard -> 4 shards; capped to 3
        (MIB, None, 16, [1024, 1024], F32, [4, 1]),
        (MIB, 3, 16, [1024, 1024], F32, [3, 1]),
        (MIB, 8, 16, [1024, 1024], F32, [4, 1]),
        # rank 3: slice = 5*5*4 = 100 B
        (1000, None, 16, [8, 5, 5], F32, [1, 1, 1]),
        (100, None, 16, [8, 5, 5], F32, [8, 1, 1]),
        (250, None, 16, [8, 5, 5], F32, [4, 1, 1]),   # floor(2.5) = 2; ceil(8/2) = 4
        (100, None, 16, [3], F64, [1]),               # rank 1: slice = 8 B, 12 per shard
        (10, None, 16, [3], F64, [3]),                # floor(10/8) = 1 per shard
        # empty variables: one piece (TensorFlow would divide by zero here)
        (100, None, 16, [0, 4], F32, [1, 1]),
        (100, None, 16, [4, 0], F32, [1, 1]),
    ],
)
def test_max_size(max_bytes, max_shards, per_string, shape, dtype, expected):
    p = MaxSizePartitioner(max_shard_bytes=max_bytes, max_shards=max_shards,
                           bytes_per_string=per_string)
    assert p(shape, dtype) == expected


def test_max_size_other_axis():
    # along axis 1 of [2, 6]: slice = 12/6*4 = 8 B, 1 per shard -> 6
    assert MaxSizePartitioner(8)([2, 6], F32, axis=1) == [1, 6]


# --- bad arguments -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: FixedShardsPartitioner(0), "num_shards"),
        (lambda: FixedShardsPartitioner(-3), "num_shards"),
        (lambda: FixedShardsPartitioner(2.0), "num_shards"),
        (lambda: FixedShardsPartitioner("2"), "num_shards"),
        (lambda: FixedShardsPartitioner(True), "num_shards"),
        (lambda: MinSizePartitioner(min_shard_bytes=0), "min_shard_bytes"),
        (lambda: MinSizePartitioner(min_shard_bytes=-1), "min_shard_bytes"),
        (lambda: MinSizePartitioner(max_shards=0), "max_shards"),
        (lambda: MinSizePartitioner(max_shards=None), "max_shards"),
        (lambda: MinSizePartitioner(bytes_per_string=0), "bytes_per_string"),
        (lambda: MaxSizePartitioner(0), "max_shard_bytes"),
        (lambda: MaxSizePartitioner(1.5), "max_shard_bytes"),
        (lambda: MaxSizePartitioner(10, max_shards=0), "max_shards"),
        (lambda: MaxSizePartitioner(10, max_shards=-2), "max_shards"),
        (lambda: MaxSizePartitioner(10, bytes_per_string=0), "bytes_per_string"),
    ],
)
def test_constructor_rejects(make, argument):
    with pytest.raises(InvalidArgumentError, match=argument):
        make()


@pytest.mark.parametrize(
    "partitioner",
    [FixedShardsPartitioner(2), MinSizePartitioner(4, 4), MaxSizePartitioner(4)],
    ids=repr,
)
@pytest.mark.parametrize(
    "shape, axis, message",
    [
        ([None, 3], 0, "fully defined"),
        ([-1, 3], 0, ">= 0"),
        ([2.5, 3], 0, "integer"),
        ([], 0, "axis 0"),
        ([4, 3], 2, "axis 2"),
        ([4, 3], -3, "axis -3"),
        (None, 0, "sequence"),
    ],
)
def test_call_rejects_bad_shape_or_axis(partitioner, shape, axis, message):
    with pytest.raises(InvalidArgumentError, match=message):
        partitioner(shape, F32, axis=axis)


@pytest.mark.parametrize("partitioner", [MinSizePartitioner(4, 4), MaxSizePartitioner(4)],
                         ids=repr)
def test_size_partitioners_reject_unknown_dtype(partitioner):
    with pytest.raises(InvalidArgumentError, match="dtype"):
        partitioner([4, 4], "not-a-dtype")


def test_partitioner_repr_and_equality():
    assert repr(FixedShardsPartitioner(3)) == "FixedShardsPartitioner(num_shards=3)"
    assert repr(MaxSizePartitioner(8)) == (
        "MaxSizePartitioner(max_shard_bytes=8, max_shards=None, bytes_per_string=16)")
    assert MinSizePartitioner(4, 2) == MinSizePartitioner(min_shard_bytes=4, max_shards=2)
    assert MinSizePartitioner(4, 2) != MinSizePartitioner(4, 3)
    assert len({FixedShardsPartitioner(2), FixedShardsPartitioner(2)}) == 1
    assert isinstance(FixedShardsPartitioner(2), Partitioner)
    with pytest.raises(NotImplementedError):
        Partitioner()([2], F32)


# --- "div" layout ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "rows, shards, sizes",
    [
        (13, 5, [3, 3, 3, 2, 2]),     # 13 = 5*2 + 3: the first 3 shards get an extra row
        (10, 4, [3, 3, 2, 2]),
        (12, 4, [3, 3, 3, 3]),
        (10, 1, [10]),
        (3, 5, [1, 1, 1]),            # never more shards than rows
        (7, 7, [1] * 7),
        (1, 1, [1]),
        (0, 3, [0]),                  # no rows: one empty shard
        (1000, 3, [334, 333, 333]),
    ],
)
def test_shard_sizes(rows, shards, sizes):
    assert shard_sizes(rows, shards) == sizes
    offsets = shard_offsets(rows, shards)
    assert offsets[0] == 0 and offsets[-1] == rows
    assert [b - a for a, b in zip(offsets, offsets[1:])] == sizes


@pytest.mark.parametrize(
    "rows, shards, offsets",
    [
        (10, 4, [0, 3, 6, 8, 10]),
        (13, 5, [0, 3, 6, 9, 11, 13]),
        (5, 1, [0, 5]),
        (2, 9, [0, 1, 2]),
    ],
)
def test_shard_offsets(rows, shards, offsets):
    assert shard_offsets(rows, shards) == offsets


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 500), st.integers(1, 40))
def test_shard_sizes_properties(rows, shards):
    sizes = shard_sizes(rows, shards)
    assert sum(sizes) == rows
    assert len(sizes) == max(1, min(rows, shards))
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    "rows, shards, argument",
    [(10, 0, "num_shards"), (10, -1, "num_shards"), (-1, 2, "num_rows"),
     (2.5, 2, "num_rows"), (10, True, "num_shards")],
)
def test_shard_sizes_rejects(rows, shards, argument):
    with pytest.raises(InvalidArgumentError, match=argument):
        shard_sizes(rows, shards)
    with pytest.raises(InvalidArgumentError, match=argument):
        shard_offsets(rows, shards)


# --- partition_count ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "partitioner, shape, dtype, expected",
    [
        (FixedShardsPartitioner(4), (10, 3), F32, 4),
        (FixedShardsPartitioner(4), (3,), F32, 3),
        (FixedShardsPartitioner(1), (10, 3), F32, 1),
        (MinSizePartitioner(), (1024, 1024), F32, 1),
        (MinSizePartitioner(256 << 10, max_shards=2), (1024, 1024), F32, 2),
        (MinSizePartitioner(256 << 10, max_shards=2), (8, 16384), F32, 2),
        (MaxSizePartitioner(100), (10, 10), F32, 5),
        # a custom callable asking for more shards than rows is capped at the row count
        (lambda shape, dtype: [7, 1], (5, 2), F32, 5),
        (lambda shape, dtype: (3, 1, 1), (9, 2, 2), F64, 3),
        (lambda shape, dtype: np.array([2, 1]), (9, 2), F64, 2),
    ],
)
def test_partition_count(partitioner, shape, dtype, expected):
    assert partition_count(partitioner, shape, dtype) == expected


def test_partition_count_passes_shape_and_dtype_as_keywords():
    seen = {}

    def partitioner(*, shape, dtype):
        seen.update(shape=shape, dtype=dtype)
        return [2, 1]

    assert partition_count(partitioner, [6, 4], F32) == 2
    assert seen == {"shape": (6, 4), "dtype": F32}


@pytest.mark.parametrize("shape", [(), [], (0, 4), (0,)])
def test_partition_count_never_partitions_scalars_or_empty_rows(shape):
    def explode(shape, dtype):
        raise AssertionError("the partitioner must not be called")

    assert partition_count(explode, shape, F32) == 1


@pytest.mark.parametrize(
    "answer, shape, message",
    [
        (None, (4, 3), "non-empty"),
        ([], (4, 3), "non-empty"),
        ([0, 1, 1], (4, 3, 2), "first-axis count >= 1"),
        ([-2, 1], (4, 3), "first-axis count >= 1"),
        ([2, 2, 1], (4, 3, 2), "1 for every axis but the first"),
        ([1, 3], (4, 3), "1 for every axis but the first"),
        ([2], (4, 3), "one count per axis"),
        ([2, 1, 1], (4, 3), "one count per axis"),
        ([1.5, 1], (4, 3), "integer"),
        ([True, 1], (4, 3), "integer"),
        ("21", (4, 3), "non-empty"),
        (2, (4, 3), "non-empty"),
    ],
)
def test_partition_count_rejects_bad_answers(answer, shape, message):
    def my_partitioner(shape, dtype):
        return answer

    with pytest.raises(InvalidArgumentError, match=message) as info:
        partition_count(my_partitioner, shape, F32)
    text = str(info.value)
    assert "my_partitioner" in text
    assert repr(answer) in text


def test_partition_count_names_partitioner_objects():
    class Broken(Partitioner):
        def __call__(self, shape, dtype, axis=0):
            return [2, 2]

    with pytest.raises(InvalidArgumentError, match=r"Broken\(\) returned \[2, 2\]"):
        partition_count(Broken(), (4, 4), F32)


def test_partition_count_rejects_non_callable_and_bad_shape():
    with pytest.raises(InvalidArgumentError, match="callable"):
        partition_count(4, (4, 4), F32)
    with pytest.raises(InvalidArgumentError, match="fully defined"):
        partition_count(FixedShardsPartitioner(2), (None, 4), F32)


def test_module_exports():
    assert set(partitioners.__all__) >= {
        "Partitioner", "FixedShardsPartitioner", "MinSizePartitioner", "MaxSizePartitioner",
        "shard_sizes", "shard_offsets", "partition_count"}
