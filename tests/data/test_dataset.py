"""convoy.data.Dataset against plain-Python references: every source and transformation.

Where an operation has a simple list/itertools equivalent, hypothesis drives it over arbitrary
sizes and arguments; tf.data's documented examples and semantics are pinned directly.
"""

from __future__ import annotations

import gzip
import itertools
import os
import threading
import time
from collections import Counter, namedtuple
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy.data import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    Options,
    TensorSpec,
    TextLineDataset,
    TFRecordDataset,
    TFRecordWriter,
)
from convoy.errors import FailedPreconditionError, NotFoundError, OutOfRangeError

FAST = settings(max_examples=40, deadline=None)

sizes = st.integers(min_value=0, max_value=40)
positive = st.integers(min_value=1, max_value=12)
counts = st.integers(min_value=-1, max_value=50)  # -1 means "all" for take/skip

Point = namedtuple("Point", ["x", "y"])


def py(value: Any) -> Any:
    """An element as plain Python (lists for arrays, ints/floats/bytes for scalars)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: py(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)(*map(py, value))
    if isinstance(value, tuple):
        return tuple(py(v) for v in value)
    if isinstance(value, list):
        return [py(v) for v in value]
    return value


def elements(dataset: Dataset) -> list[Any]:
    return [py(x) for x in dataset]


def chunks(items: list[Any], size: int, drop_remainder: bool = False) -> list[list[Any]]:
    out = [items[i:i + size] for i in range(0, len(items), size)]
    if drop_remainder and out and len(out[-1]) < size:
        out.pop()
    return out


def check_cardinality(dataset: Dataset, expected: list[Any]) -> None:
    assert dataset.cardinality() == len(expected)
    assert len(dataset) == len(expected)


# --- sources -------------------------------------------------------------------------------


@FAST
@given(st.integers(-20, 20), st.integers(-20, 20),
       st.integers(-5, 5).filter(lambda s: s != 0))
def test_range_matches_python_range(start: int, stop: int, step: int) -> None:
    expected = list(range(start, stop, step))
    dataset = Dataset.range(start, stop, step)
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)
    assert elements(Dataset.range(stop)) == list(range(stop))
    assert elements(Dataset.range(start, stop)) == list(range(start, stop))


def test_range_elements_are_int64_scalars() -> None:
    dataset = Dataset.range(3)
    assert dataset.element_spec == TensorSpec((), np.int64)
    for x in dataset:
        assert int(x) == x and np.asarray(x).dtype == np.int64


def test_from_tensor_slices_single_array() -> None:
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    dataset = Dataset.from_tensor_slices(data)
    assert elements(dataset) == data.tolist()
    assert dataset.element_spec == TensorSpec((3,), np.float32)
    assert dataset.cardinality() == 4
    assert all(x.dtype == np.float32 for x in dataset)


def test_from_tensor_slices_tuple_of_lists_becomes_arrays() -> None:
    dataset = Dataset.from_tensor_slices(([1, 2, 3], [[1, 2], [3, 4], [5, 6]]))
    assert elements(dataset) == [(1, [1, 2]), (2, [3, 4]), (3, [5, 6])]
    assert dataset.element_spec == (TensorSpec((), np.int64), TensorSpec((2,), np.int64))


def test_from_tensor_slices_dict_and_namedtuple() -> None:
    dataset = Dataset.from_tensor_slices({"b": np.arange(3), "a": [[0.5], [1.5], [2.5]]})
    assert elements(dataset) == [{"a": [0.5], "b": 0}, {"a": [1.5], "b": 1},
                                 {"a": [2.5], "b": 2}]
    assert dataset.element_spec == {"a": TensorSpec((1,), np.float64),
                                    "b": TensorSpec((), np.int64)}
    points = Dataset.from_tensor_slices(Point(np.arange(2), np.arange(10, 12)))
    assert elements(points) == [Point(0, 10), Point(1, 11)]
    assert all(type(p) is Point for p in points)


def test_from_tensor_slices_of_strings_and_bytes() -> None:
    names = np.array([b"a", b"bc"], dtype=object)
    assert elements(Dataset.from_tensor_slices(names)) == [b"a", b"bc"]


def test_from_tensors_is_one_element() -> None:
    value = (np.zeros((2, 3), np.float32), {"k": [1, 2]})
    dataset = Dataset.from_tensors(value)
    assert dataset.cardinality() == 1
    (only,) = list(dataset)
    assert py(only) == ([[0.0] * 3] * 2, {"k": [1, 2]})
    assert isinstance(only[1]["k"], np.ndarray)  # a list inside becomes an array
    assert dataset.element_spec == (TensorSpec((2, 3), np.float32),
                                    {"k": TensorSpec((2,), np.int64)})


def test_from_generator_with_output_signature() -> None:
    def gen():
        for i in range(4):
            yield i, np.arange(i, dtype=np.float32)

    signature = (TensorSpec((), np.int64), TensorSpec((None,), np.float32))
    dataset = Dataset.from_generator(gen, output_signature=signature)
    assert dataset.element_spec == signature
    assert dataset.cardinality() == UNKNOWN_CARDINALITY
    assert elements(dataset) == [(i, list(range(i))) for i in range(4)]
    assert elements(dataset) == elements(dataset)  # the generator is called anew each pass
    assert all(x[1].dtype == np.float32 for x in dataset)


def test_from_generator_casts_to_the_signature_dtype() -> None:
    dataset = Dataset.from_generator(lambda: iter([1, 2]),
                                     output_signature=TensorSpec((), np.int32))
    values = list(dataset)
    assert py(values) == [1, 2]
    assert all(np.asarray(v).dtype == np.int32 for v in values)


def test_from_generator_documented_example_with_types_and_shapes() -> None:
    def gen():
        for i in itertools.count(1):
            yield (i, [1] * i)  # a list is one component, as in tf.data's example

    dataset = Dataset.from_generator(gen, output_types=(np.int64, np.int64),
                                     output_shapes=((), (None,)))
    assert elements(dataset.take(3)) == [(1, [1]), (2, [1, 1]), (3, [1, 1, 1])]
    assert dataset.element_spec == (TensorSpec((), np.int64), TensorSpec((None,), np.int64))


def test_from_generator_with_args_and_list_values() -> None:
    dataset = Dataset.from_generator(lambda n: ([i] * 2 for i in range(n)),
                                     output_signature=TensorSpec((2,), np.int64), args=(3,))
    assert elements(dataset) == [[0, 0], [1, 1], [2, 2]]


@pytest.mark.parametrize("prefetch", [False, True])
def test_closing_an_iterator_closes_its_generator_at_once(prefetch: bool) -> None:
    # The generator's `finally` runs at close(), not whenever the garbage collector finds it.
    closed = threading.Event()

    def gen():
        try:
            yield from range(1000)
        finally:
            closed.set()

    dataset = Dataset.from_generator(gen, output_signature=TensorSpec((), np.int64))
    dataset = dataset.map(lambda x: x * 2)
    if prefetch:
        dataset = dataset.prefetch(2)
    iterator = iter(dataset)
    assert next(iterator) == 0
    iterator.close()
    assert closed.wait(5)


def test_list_files_sorted_without_shuffle(tmp_path: Path) -> None:
    for name in ["c.txt", "a.txt", "b.txt", "skip.dat"]:
        (tmp_path / name).write_text("x")
    dataset = Dataset.list_files(str(tmp_path / "*.txt"), shuffle=False)
    expected = [os.fsencode(tmp_path / n) for n in ["a.txt", "b.txt", "c.txt"]]
    assert list(dataset) == expected
    assert dataset.cardinality() == 3
    assert dataset.element_spec == TensorSpec((), bytes)
    both = Dataset.list_files([str(tmp_path / "*.txt"), str(tmp_path / "*.dat")],
                              shuffle=False)
    assert list(both) == [*expected, os.fsencode(tmp_path / "skip.dat")]


def test_list_files_shuffles_by_default_reproducibly_with_seed(tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / f"f{i:02d}").write_text("x")
    pattern = str(tmp_path / "f*")
    first = list(Dataset.list_files(pattern, seed=7))
    assert sorted(first) == list(Dataset.list_files(pattern, shuffle=False))
    assert first == list(Dataset.list_files(pattern, seed=7))
    assert first != sorted(first)  # 20! orders: the chance of the sorted one is negligible


def test_list_files_nothing_matches(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no files matched"):
        Dataset.list_files(str(tmp_path / "*.none"))


# --- file readers --------------------------------------------------------------------------


def test_text_line_dataset_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"unix\nwindows\r\n\nlast without newline")
    dataset = TextLineDataset(str(path))
    assert list(dataset) == [b"unix", b"windows", b"", b"last without newline"]
    assert dataset.element_spec == TensorSpec((), bytes)
    assert list(TextLineDataset(path)) == list(dataset)  # a PathLike works too


def test_text_line_dataset_empty_file_and_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "one.txt").write_bytes(b"one\n")
    assert list(TextLineDataset(str(tmp_path / "empty.txt"))) == []
    assert list(TextLineDataset(str(tmp_path / "one.txt"))) == [b"one"]


def _write_files(tmp_path: Path) -> list[str]:
    paths = []
    for i in range(3):
        path = tmp_path / f"part{i}.txt"
        path.write_bytes(b"".join(b"f%d-l%d\n" % (i, j) for j in range(i + 2)))
        paths.append(str(path))
    return paths


def test_text_line_dataset_several_files_in_order(tmp_path: Path) -> None:
    paths = _write_files(tmp_path)
    expected = [b"f%d-l%d" % (i, j) for i in range(3) for j in range(i + 2)]
    assert list(TextLineDataset(paths)) == expected
    files = Dataset.list_files(str(tmp_path / "part*.txt"), shuffle=False)
    assert list(TextLineDataset(files)) == expected
    assert list(files.interleave(TextLineDataset, cycle_length=1)) == expected


def test_text_line_dataset_num_parallel_reads_interleaves_lines(tmp_path: Path) -> None:
    paths = _write_files(tmp_path)
    per_file = [[b"f%d-l%d" % (i, j) for j in range(i + 2)] for i in range(3)]
    reference = [line for group in itertools.zip_longest(*per_file) for line in group if line]
    assert list(TextLineDataset(paths, num_parallel_reads=3)) == reference
    two = list(TextLineDataset(paths, num_parallel_reads=2))
    assert Counter(two) == Counter(reference)
    assert two[:4] == [b"f0-l0", b"f1-l0", b"f0-l1", b"f1-l1"]


def test_text_line_dataset_gzip(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"a\nb\r\nc")
    assert list(TextLineDataset(str(path), compression_type="GZIP")) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("compression", [None, "", "GZIP", "ZLIB"])
def test_tfrecord_dataset_reads_what_the_writer_wrote(tmp_path: Path,
                                                      compression: str | None) -> None:
    records = [b"", b"x", os.urandom(1000), b"last"]
    path = tmp_path / "data.tfrecord"
    with TFRecordWriter(str(path), compression) as writer:
        for record in records:
            writer.write(record)
    dataset = TFRecordDataset(str(path), compression_type=compression)
    assert list(dataset) == records
    assert dataset.element_spec == TensorSpec((), bytes)


def test_tfrecord_dataset_several_files(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = str(tmp_path / f"r{i}.tfrecord")
        with TFRecordWriter(path) as writer:
            for j in range(i + 1):
                writer.write(b"%d:%d" % (i, j))
        paths.append(path)
    expected = [b"%d:%d" % (i, j) for i in range(3) for j in range(i + 1)]
    assert list(TFRecordDataset(paths)) == expected
    assert list(TFRecordDataset(Dataset.from_tensor_slices(np.array(paths, object)))) \
        == expected
    assert Counter(TFRecordDataset(paths, num_parallel_reads=AUTOTUNE)) == Counter(expected)


# --- transformations: slicing and counting ---------------------------------------------------


@FAST
@given(sizes, positive, st.booleans())
def test_batch_matches_chunks(n: int, size: int, drop: bool) -> None:
    dataset = Dataset.range(n).batch(size, drop_remainder=drop)
    expected = chunks(list(range(n)), size, drop)
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)


@FAST
@given(sizes, positive, st.data())
def test_shard_matches_slicing(n: int, num_shards: int, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, num_shards - 1))
    dataset = Dataset.range(n).shard(num_shards, index)
    expected = list(range(n))[index::num_shards]
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)


@FAST
@given(sizes, positive)
def test_shards_partition_the_dataset(n: int, num_shards: int) -> None:
    shards = [elements(Dataset.range(n).shard(num_shards, i)) for i in range(num_shards)]
    assert sorted(itertools.chain(*shards)) == list(range(n))


@FAST
@given(sizes, counts)
def test_take_and_skip_match_slicing(n: int, count: int) -> None:
    items = list(range(n))
    took = Dataset.range(n).take(count)
    skipped = Dataset.range(n).skip(count)
    expected_take = items if count == -1 else items[:count]
    expected_skip = [] if count == -1 else items[count:]
    assert elements(took) == expected_take
    assert elements(skipped) == expected_skip
    check_cardinality(took, expected_take)
    check_cardinality(skipped, expected_skip)


@FAST
@given(sizes, st.integers(0, 5))
def test_repeat_matches_list_multiplication(n: int, count: int) -> None:
    dataset = Dataset.range(n).repeat(count)
    expected = list(range(n)) * count
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)


@FAST
@given(st.integers(1, 10), st.integers(0, 40))
def test_repeat_forever(n: int, k: int) -> None:
    for dataset in (Dataset.range(n).repeat(), Dataset.range(n).repeat(-1)):
        assert dataset.cardinality() == INFINITE_CARDINALITY
        assert elements(dataset.take(k)) == list(itertools.islice(itertools.cycle(range(n)), k))


def test_repeat_of_empty_dataset_forever_is_empty() -> None:
    dataset = Dataset.range(0).repeat()
    assert dataset.cardinality() == 0
    assert list(dataset) == []


@FAST
@given(sizes, st.integers(-5, 5))
def test_enumerate_matches_python_enumerate(n: int, start: int) -> None:
    dataset = Dataset.range(10, 10 + n).enumerate(start)
    expected = list(enumerate(range(10, 10 + n), start))
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)
    assert dataset.element_spec == (TensorSpec((), np.int64), TensorSpec((), np.int64))


@FAST
@given(sizes, positive)
def test_filter_matches_comprehension(n: int, modulus: int) -> None:
    dataset = Dataset.range(n).filter(lambda x: x % modulus == 0)
    assert elements(dataset) == [x for x in range(n) if x % modulus == 0]
    assert dataset.cardinality() == UNKNOWN_CARDINALITY


def test_filter_unpacks_tuples_and_keeps_structure() -> None:
    dataset = Dataset.zip(Dataset.range(6), Dataset.range(6, 12)).filter(lambda a, b: a % 2)
    assert elements(dataset) == [(1, 7), (3, 9), (5, 11)]


@FAST
@given(sizes, st.integers(0, 45))
def test_take_while_matches_itertools(n: int, limit: int) -> None:
    dataset = Dataset.range(n).take_while(lambda x: x < limit)
    assert elements(dataset) == list(itertools.takewhile(lambda x: x < limit, range(n)))
    assert dataset.cardinality() == UNKNOWN_CARDINALITY


def test_take_while_stops_at_first_false() -> None:
    dataset = Dataset.from_tensor_slices(np.array([1, 2, 9, 3, 4])).take_while(lambda x: x < 5)
    assert elements(dataset) == [1, 2]


@FAST
@given(sizes, positive, positive)
def test_unbatch_and_rebatch(n: int, size: int, new_size: int) -> None:
    batched = Dataset.range(n).batch(size)
    assert elements(batched.unbatch()) == list(range(n))
    assert elements(batched.rebatch(new_size)) == chunks(list(range(n)), new_size)
    assert elements(batched.rebatch(new_size, drop_remainder=True)) == chunks(
        list(range(n)), new_size, True)


def test_unbatch_structures() -> None:
    words = np.array([b"x", b"y", b"z"], dtype=object)
    dataset = Dataset.from_tensors({"a": np.arange(3), "b": (np.eye(3), words)})
    rows = elements(dataset.unbatch())
    assert rows == [{"a": i, "b": (np.eye(3)[i].tolist(), c)}
                    for i, c in enumerate([b"x", b"y", b"z"])]
    assert dataset.unbatch().element_spec == {
        "a": TensorSpec((), np.int64),
        "b": (TensorSpec((3,), np.float64), TensorSpec((), bytes)),
    }


@FAST
@given(sizes, sizes)
def test_zip_matches_python_zip(n1: int, n2: int) -> None:
    dataset = Dataset.zip(Dataset.range(n1), Dataset.range(100, 100 + n2))
    expected = list(zip(range(n1), range(100, 100 + n2)))
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)
    nested = Dataset.zip((Dataset.range(n1), Dataset.range(100, 100 + n2)))
    assert elements(nested) == expected


def test_zip_structures() -> None:
    dataset = Dataset.zip({"x": Dataset.range(3), "y": Dataset.range(3).batch(1)})
    assert elements(dataset) == [{"x": i, "y": [i]} for i in range(3)]
    assert dataset.element_spec == {"x": TensorSpec((), np.int64),
                                    "y": TensorSpec((None,), np.int64)}
    nested = Dataset.zip((Dataset.range(2), (Dataset.range(2), Dataset.range(2))))
    assert elements(nested) == [(0, (0, 0)), (1, (1, 1))]
    assert Dataset.zip(Dataset.range(3), Dataset.range(4).repeat()).cardinality() == 3
    assert Dataset.zip(Dataset.range(3).repeat(),
                       Dataset.range(4).repeat()).cardinality() == INFINITE_CARDINALITY


@FAST
@given(sizes, sizes)
def test_concatenate_matches_list_addition(n1: int, n2: int) -> None:
    dataset = Dataset.range(n1).concatenate(Dataset.range(50, 50 + n2))
    expected = list(range(n1)) + list(range(50, 50 + n2))
    assert elements(dataset) == expected
    check_cardinality(dataset, expected)


# --- batch and padded_batch --------------------------------------------------------------------


def test_batch_stacks_tuples_and_dicts() -> None:
    dataset = Dataset.range(5).map(lambda x: (x, {"sq": x * x, "vec": np.full(2, x)}))
    batches = list(dataset.batch(2))
    assert py(batches) == [
        ([0, 1], {"sq": [0, 1], "vec": [[0, 0], [1, 1]]}),
        ([2, 3], {"sq": [4, 9], "vec": [[2, 2], [3, 3]]}),
        ([4], {"sq": [16], "vec": [[4, 4]]}),
    ]
    assert isinstance(batches[0][0], np.ndarray)
    assert batches[0][1]["vec"].shape == (2, 2)


def test_batch_of_strings_and_keeps_dtype() -> None:
    words = Dataset.from_tensor_slices(np.array([b"a", b"b", b"c"], object)).batch(2)
    assert elements(words) == [[b"a", b"b"], [b"c"]]
    ints = Dataset.from_tensor_slices(np.arange(3, dtype=np.int32)).batch(2)
    assert all(b.dtype == np.int32 for b in ints)


def test_batch_element_spec() -> None:
    assert Dataset.range(5).batch(2).element_spec == TensorSpec((None,), np.int64)
    assert Dataset.range(5).batch(2, drop_remainder=True).element_spec == \
        TensorSpec((2,), np.int64)
    slices = Dataset.from_tensor_slices((np.zeros((4, 3), np.float32), np.arange(4)))
    assert slices.batch(3).element_spec == (TensorSpec((None, 3), np.float32),
                                            TensorSpec((None,), np.int64))
    # after a Python function the spec is read off the function's output, then batched
    mapped = Dataset.range(5).map(lambda x: np.full(3, x, np.float32))
    assert mapped.element_spec == TensorSpec((3,), np.float32)
    assert mapped.batch(2).prefetch(1).element_spec == TensorSpec((None, 3), np.float32)
    assert mapped.batch(2, True).element_spec == TensorSpec((2, 3), np.float32)


def ref_padded_batch(rows: list[list[int]], size: int, width: int | None,
                     fill: int) -> list[list[list[int]]]:
    out = []
    for chunk in chunks(rows, size):
        target = width if width is not None else max(len(r) for r in chunk)
        out.append([r + [fill] * (target - len(r)) for r in chunk])
    return out


@FAST
@given(st.lists(st.lists(st.integers(0, 9), max_size=6), max_size=12), positive,
       st.sampled_from([None, 6, 9]), st.integers(-3, 3))
def test_padded_batch_matches_reference(rows: list[list[int]], size: int, width: int | None,
                                        fill: int) -> None:
    dataset = Dataset.from_generator(lambda: iter(rows),
                                     output_signature=TensorSpec((None,), np.int64))
    shapes = None if width is None else [width]
    padded = dataset.padded_batch(size, padded_shapes=shapes, padding_values=np.int64(fill))
    assert elements(padded) == ref_padded_batch(rows, size, width, fill)


def test_padded_batch_to_batch_max_by_default() -> None:
    dataset = Dataset.range(1, 5).map(lambda x: np.arange(x))
    assert elements(dataset.padded_batch(2)) == [[[0, 0], [0, 1]],
                                                 [[0, 1, 2, 0], [0, 1, 2, 3]]]
    assert elements(dataset.padded_batch(3, drop_remainder=True)) == [
        [[0, 0, 0], [0, 1, 0], [0, 1, 2]]]


def test_padded_batch_structures_with_shapes_and_values() -> None:
    dataset = Dataset.range(1, 4).map(lambda x: (np.arange(x), np.ones((x, 2)), x))
    padded = dataset.padded_batch(3, padded_shapes=([4], [None, 3], []),
                                  padding_values=(-1, 0.5, 0))
    (first,) = list(padded)
    assert first[0].tolist() == [[0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, -1]]
    assert first[1].shape == (3, 3, 3)
    assert first[1][0].tolist() == [[1, 1, 0.5], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]
    assert first[2].tolist() == [1, 2, 3]
    # one padding value for every component, as tf.data allows
    (same,) = list(dataset.padded_batch(3, padding_values=7))
    assert same[0][0].tolist() == [0, 7, 7]
    assert same[1][0].tolist() == [[1, 1], [7, 7], [7, 7]]
    by_name = Dataset.range(1, 3).map(lambda x: {"ids": np.arange(x), "len": x})
    assert elements(by_name.padded_batch(2, padded_shapes={"ids": [3], "len": []})) == [
        {"ids": [[0, 0, 0], [0, 1, 0]], "len": [1, 2]}]


def test_padded_batch_strings_pad_with_empty_bytes() -> None:
    dataset = Dataset.range(3).map(lambda x: np.array([b"w"] * int(x), dtype=object))
    assert elements(dataset.padded_batch(3)) == [[[b"", b""], [b"w", b""], [b"w", b"w"]]]


def test_padded_batch_element_spec_and_cardinality() -> None:
    rows = Dataset.from_tensor_slices(np.zeros((5, 3), np.int32))
    assert rows.padded_batch(2).element_spec == TensorSpec((None, 3), np.int32)
    assert rows.padded_batch(2, padded_shapes=[6], drop_remainder=True).element_spec == \
        TensorSpec((2, 6), np.int32)
    assert rows.padded_batch(2).cardinality() == 3
    assert rows.padded_batch(2, drop_remainder=True).cardinality() == 2


# --- map -------------------------------------------------------------------------------------


def test_map_unpacks_tuples_but_not_dicts_or_namedtuples() -> None:
    pairs = Dataset.zip(Dataset.range(3), Dataset.range(3, 6))
    assert elements(pairs.map(lambda a, b: a * 10 + b)) == [3, 14, 25]
    dicts = Dataset.from_tensor_slices({"a": np.arange(3)})
    assert elements(dicts.map(lambda d: d["a"] + 1)) == [1, 2, 3]
    points = Dataset.from_tensor_slices(Point(np.arange(2), np.arange(2)))
    assert elements(points.map(lambda p: p.x + p.y)) == [0, 2]


def test_map_element_spec_is_read_off_the_output() -> None:
    dataset = Dataset.range(3).map(lambda x: {"x": x, "f": np.float32(x) / 2})
    assert dataset.element_spec == {"x": TensorSpec((), np.int64),
                                    "f": TensorSpec((), np.float32)}
    # Python floats are described as numpy stores them (float64), which batching keeps
    floats = Dataset.range(3).map(lambda x: x * 0.5)
    assert floats.element_spec == TensorSpec((), np.float64)
    assert next(iter(floats.batch(3))).dtype == floats.batch(3).element_spec.dtype


@FAST
@given(sizes, st.sampled_from([1, 2, 4, AUTOTUNE]))
def test_parallel_map_keeps_order_when_deterministic(n: int, parallel: int) -> None:
    delays = np.random.default_rng(n).uniform(0, 0.002, size=n)

    def slow(x):
        time.sleep(delays[x])
        return x * 2

    dataset = Dataset.range(n).map(slow, num_parallel_calls=parallel, deterministic=True)
    assert elements(dataset) == [2 * x for x in range(n)]
    assert dataset.cardinality() == n


def test_parallel_map_runs_concurrently_and_nondeterministic_keeps_all() -> None:
    active, peak, lock = [0], [0], threading.Lock()

    def track(x):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.005)
        with lock:
            active[0] -= 1
        return x

    assert elements(Dataset.range(24).map(track, num_parallel_calls=4)) == list(range(24))
    assert peak[0] > 1
    unordered = Dataset.range(50).map(lambda x: x, num_parallel_calls=8, deterministic=False)
    assert sorted(elements(unordered)) == list(range(50))


def test_map_errors_propagate() -> None:
    def boom(x):
        if x == 2:
            raise KeyError("boom")
        return x

    for dataset in (Dataset.range(5).map(boom),
                    Dataset.range(5).map(boom, num_parallel_calls=3),
                    Dataset.range(5).map(boom).prefetch(2)):
        it = iter(dataset)
        assert [next(it), next(it)] == [0, 1]
        with pytest.raises(KeyError, match="boom"):
            next(it)


# --- interleave and flat_map ---------------------------------------------------------------------


def test_interleave_documented_example() -> None:
    dataset = Dataset.range(1, 6).interleave(
        lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4)
    assert elements(dataset) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                                 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]


def ref_interleave(inputs: list[int], make: Any, cycle: int, block: int) -> list[int]:
    """tf.data's InterleaveDataset, written from its documented state machine."""
    source, slots, out = iter(inputs), [None] * cycle, []
    index, taken, end = 0, 0, False
    while True:
        if slots[index] is None:
            if not end:
                x = next(source, None)
                if x is not None:
                    slots[index] = iter(make(x))
                    continue
                end = True
            if all(s is None for s in slots):
                return out
            index, taken = (index + 1) % cycle, 0
            continue
        y = next(slots[index], None)
        if y is None:
            slots[index] = None
            index, taken = (index + 1) % cycle, 0
            continue
        out.append(y)
        taken += 1
        if taken == block:
            index, taken = (index + 1) % cycle, 0


@FAST
@given(st.lists(st.integers(0, 6), max_size=8), st.integers(1, 4), st.integers(1, 4),
       st.booleans())
def test_interleave_matches_reference(lengths: list[int], cycle: int, block: int,
                                      parallel: bool) -> None:
    inputs = [length * 10 + 10 for length in lengths]  # element x expands to x // 10 - 1 values

    dataset = Dataset.from_tensor_slices(np.array(inputs, np.int64)).interleave(
        lambda x: Dataset.range(x, x + x // 10 - 1), cycle_length=cycle, block_length=block,
        num_parallel_calls=2 if parallel else None)
    expected = ref_interleave(inputs, lambda x: range(x, x + x // 10 - 1), cycle, block)
    assert elements(dataset) == expected


@FAST
@given(st.lists(st.integers(0, 5), max_size=8))
def test_flat_map_matches_chain(lengths: list[int]) -> None:
    dataset = Dataset.from_generator(lambda: iter(lengths),
                                     output_signature=TensorSpec((), np.int64))
    flat = dataset.flat_map(lambda n: Dataset.range(n))
    assert elements(flat) == list(itertools.chain.from_iterable(range(n) for n in lengths))


def test_flat_map_unpacks_tuples() -> None:
    pairs = Dataset.zip(Dataset.range(3), Dataset.range(3))
    assert elements(pairs.flat_map(lambda a, b: Dataset.range(a + b))) == [0, 1, 0, 1, 2, 3]


# --- shuffle ---------------------------------------------------------------------------------


@FAST
@given(sizes, positive, st.integers(0, 2**31))
def test_shuffle_is_a_reproducible_permutation(n: int, buffer: int, seed: int) -> None:
    first = elements(Dataset.range(n).shuffle(buffer, seed=seed))
    assert sorted(first) == list(range(n))
    assert elements(Dataset.range(n).shuffle(buffer, seed=seed)) == first  # a new object
    assert Dataset.range(n).shuffle(buffer, seed=seed).cardinality() == n


def test_shuffle_buffer_of_one_keeps_order() -> None:
    assert elements(Dataset.range(10).shuffle(1, seed=3)) == list(range(10))


def test_shuffle_actually_shuffles_and_seeds_differ() -> None:
    a = elements(Dataset.range(50).shuffle(50, seed=1))
    b = elements(Dataset.range(50).shuffle(50, seed=2))
    assert a != list(range(50)) and a != b


def test_repeat_reshuffles_each_epoch_by_default() -> None:
    dataset = Dataset.range(20).shuffle(20, seed=5).repeat(3)
    values = elements(dataset)
    epochs = [values[i * 20:(i + 1) * 20] for i in range(3)]
    assert all(sorted(e) == list(range(20)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    assert elements(Dataset.range(20).shuffle(20, seed=5).repeat(3)) == values


def test_repeat_keeps_order_without_reshuffle() -> None:
    dataset = Dataset.range(20).shuffle(20, seed=5, reshuffle_each_iteration=False).repeat(3)
    values = elements(dataset)
    assert values[:20] == values[20:40] == values[40:]
    assert values[:20] != list(range(20))


def test_iterating_again_reshuffles_unless_disabled() -> None:
    reshuffled = Dataset.range(30).shuffle(30, seed=9)
    assert elements(reshuffled) != elements(reshuffled)
    fixed = Dataset.range(30).shuffle(30, seed=9, reshuffle_each_iteration=False)
    assert elements(fixed) == elements(fixed)


# --- sampling and choosing --------------------------------------------------------------------


@FAST
@given(sizes, sizes, st.integers(0, 1000))
def test_sample_from_datasets_yields_every_element_once(n1: int, n2: int, seed: int) -> None:
    dataset = Dataset.sample_from_datasets([Dataset.range(n1), Dataset.range(100, 100 + n2)],
                                           seed=seed)
    values = elements(dataset)
    assert sorted(values) == list(range(n1)) + list(range(100, 100 + n2))
    # each input keeps its own order
    assert [v for v in values if v < 100] == list(range(n1))
    assert elements(Dataset.sample_from_datasets(
        [Dataset.range(n1), Dataset.range(100, 100 + n2)], seed=seed)) == values


def test_sample_from_datasets_proportions() -> None:
    dataset = Dataset.sample_from_datasets(
        [Dataset.from_tensors(0).repeat(), Dataset.from_tensors(1).repeat(),
         Dataset.from_tensors(2).repeat()], weights=[0.2, 0.5, 0.3], seed=11)
    counts = Counter(elements(dataset.take(10_000)))
    for value, weight in enumerate([0.2, 0.5, 0.3]):
        assert abs(counts[value] / 10_000 - weight) < 0.03


def test_sample_from_datasets_zero_weight_and_stop_on_empty() -> None:
    dataset = Dataset.sample_from_datasets([Dataset.range(5), Dataset.range(100, 105)],
                                           weights=[1.0, 0.0], seed=0)
    assert elements(dataset) == list(range(5))
    stopping = Dataset.sample_from_datasets(
        [Dataset.range(3), Dataset.range(100, 200)], seed=0, stop_on_empty_dataset=True)
    values = elements(stopping)
    assert [v for v in values if v < 100] == [0, 1, 2]
    assert len(values) < 103


@FAST
@given(st.lists(st.integers(0, 2), max_size=30))
def test_choose_from_datasets_matches_reference(choices: list[int]) -> None:
    datasets = [Dataset.range(i * 100, i * 100 + 10) for i in range(3)]
    choice = Dataset.from_tensor_slices(np.array(choices, np.int64)) if choices \
        else Dataset.range(0)
    dataset = Dataset.choose_from_datasets(datasets, choice, stop_on_empty_dataset=False)
    sources = [iter(range(i * 100, i * 100 + 10)) for i in range(3)]
    expected = [v for v in (next(sources[c], None) for c in choices) if v is not None]
    assert elements(dataset) == expected


def test_choose_from_datasets_documented_example() -> None:
    datasets = [Dataset.from_tensors(b"foo").repeat(), Dataset.from_tensors(b"bar").repeat(),
                Dataset.from_tensors(b"baz").repeat()]
    choice = Dataset.range(3).repeat(3)
    assert list(Dataset.choose_from_datasets(datasets, choice)) == [b"foo", b"bar", b"baz"] * 3


def test_choose_from_datasets_stops_on_empty_by_default() -> None:
    choice = Dataset.from_tensor_slices(np.array([0, 0, 0, 1]))
    datasets = [Dataset.range(2), Dataset.range(10, 12)]
    assert elements(Dataset.choose_from_datasets(datasets, choice)) == [0, 1]
    assert elements(Dataset.choose_from_datasets(datasets, choice,
                                                 stop_on_empty_dataset=False)) == [0, 1, 10]


# --- cache and prefetch -------------------------------------------------------------------------


def _counted(calls: list[int]) -> Any:
    def double(x):
        calls[0] += 1
        return x * 2

    return double


def test_memory_cache_second_pass_does_not_call_upstream() -> None:
    calls = [0]
    dataset = Dataset.range(6).map(_counted(calls)).cache()
    assert elements(dataset) == [0, 2, 4, 6, 8, 10]
    assert calls[0] == 6
    assert elements(dataset) == [0, 2, 4, 6, 8, 10]
    assert calls[0] == 6
    assert elements(dataset.repeat(3)) == [0, 2, 4, 6, 8, 10] * 3
    assert calls[0] == 6
    assert dataset.cardinality() == 6


def test_memory_cache_with_repeat_fills_once() -> None:
    calls = [0]
    dataset = Dataset.range(4).map(_counted(calls)).cache().repeat(3)
    assert elements(dataset) == [0, 2, 4, 6] * 3
    assert calls[0] == 4


def test_memory_cache_partial_pass_records_nothing() -> None:
    calls = [0]
    dataset = Dataset.range(5).map(_counted(calls)).cache()
    assert elements(dataset.take(2)) == [0, 2]
    assert elements(dataset) == [0, 2, 4, 6, 8]
    assert calls[0] == 7
    assert elements(dataset) == [0, 2, 4, 6, 8]
    assert calls[0] == 7


def test_file_cache_writes_a_file_and_replays_it(tmp_path: Path) -> None:
    calls = [0]
    prefix = str(tmp_path / "cache")
    dataset = Dataset.range(5).map(_counted(calls)).cache(prefix)
    assert os.listdir(tmp_path) == []
    assert elements(dataset) == [0, 2, 4, 6, 8]
    assert calls[0] == 5
    assert os.listdir(tmp_path)  # the cache file appeared
    assert all(name.startswith("cache") for name in os.listdir(tmp_path))
    assert elements(dataset) == [0, 2, 4, 6, 8]
    # a separately built dataset with the same file name reads the file too
    again = Dataset.range(5).map(_counted(calls)).cache(prefix)
    assert elements(again) == [0, 2, 4, 6, 8]
    assert calls[0] == 5


@FAST
@given(sizes, st.sampled_from([0, 1, 3, AUTOTUNE]))
def test_prefetch_keeps_elements(n: int, buffer: int) -> None:
    dataset = Dataset.range(n).map(lambda x: x + 1).prefetch(buffer)
    assert elements(dataset) == list(range(1, n + 1))
    assert dataset.cardinality() == n


def test_prefetch_runs_ahead() -> None:
    produced = []
    dataset = Dataset.range(10).map(lambda x: produced.append(x) or x).prefetch(4)
    it = iter(dataset)
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(produced) >= 4
    it.close()


# --- cardinality ------------------------------------------------------------------------------


def test_cardinality_of_every_op() -> None:
    r = Dataset.range(10)
    inf = r.repeat()
    unknown = r.filter(lambda x: True)
    cases = {
        "range": (r, 10),
        "tensors": (Dataset.from_tensors([1, 2]), 1),
        "slices": (Dataset.from_tensor_slices(np.zeros((7, 2))), 7),
        "generator": (Dataset.from_generator(lambda: iter([1]),
                                             output_signature=TensorSpec((), np.int64)),
                      UNKNOWN_CARDINALITY),
        "map": (r.map(lambda x: x), 10),
        "parallel map": (r.map(lambda x: x, num_parallel_calls=2), 10),
        "filter": (unknown, UNKNOWN_CARDINALITY),
        "take_while": (r.take_while(lambda x: True), UNKNOWN_CARDINALITY),
        "batch": (r.batch(3), 4),
        "batch drop": (r.batch(3, drop_remainder=True), 3),
        "padded_batch": (r.padded_batch(4), 3),
        "unbatch": (r.batch(2).unbatch(), UNKNOWN_CARDINALITY),
        "shuffle": (r.shuffle(3), 10),
        "prefetch": (r.prefetch(2), 10),
        "cache": (r.cache(), 10),
        "enumerate": (r.enumerate(), 10),
        "shard": (r.shard(3, 0), 4),
        "shard last": (r.shard(3, 2), 3),
        "take": (r.take(3), 3),
        "take more": (r.take(30), 10),
        "take all": (r.take(-1), 10),
        "skip": (r.skip(3), 7),
        "skip more": (r.skip(30), 0),
        "skip all": (r.skip(-1), 0),
        "repeat": (r.repeat(3), 30),
        "repeat 0": (r.repeat(0), 0),
        "repeat forever": (inf, INFINITE_CARDINALITY),
        "zip": (Dataset.zip(r, r.take(4)), 4),
        "zip infinite": (Dataset.zip(inf, inf), INFINITE_CARDINALITY),
        "zip with unknown": (Dataset.zip(r, unknown), UNKNOWN_CARDINALITY),
        "concatenate": (r.concatenate(r.take(2)), 12),
        "concatenate infinite": (r.concatenate(inf), INFINITE_CARDINALITY),
        "concatenate unknown": (r.concatenate(unknown), UNKNOWN_CARDINALITY),
        "interleave": (r.interleave(lambda x: Dataset.range(x)), UNKNOWN_CARDINALITY),
        "flat_map": (r.flat_map(lambda x: Dataset.range(x)), UNKNOWN_CARDINALITY),
        "sample": (Dataset.sample_from_datasets([r, r]), UNKNOWN_CARDINALITY),
        "choose": (Dataset.choose_from_datasets([r], r.map(lambda x: 0)),
                   UNKNOWN_CARDINALITY),
        "options": (r.with_options(Options(deterministic=False)), 10),
        "infinite take": (inf.take(5), 5),
        "infinite skip": (inf.skip(5), INFINITE_CARDINALITY),
        "infinite batch": (inf.batch(4), INFINITE_CARDINALITY),
        "infinite map": (inf.map(lambda x: x), INFINITE_CARDINALITY),
        "infinite shard": (inf.shard(2, 1), INFINITE_CARDINALITY),
        "unknown take 0": (unknown.take(0), 0),
        "unknown take": (unknown.take(3), UNKNOWN_CARDINALITY),
        "unknown batch": (unknown.batch(2), UNKNOWN_CARDINALITY),
        # an unknown dataset might be empty, and an empty one repeated forever is empty
        "unknown repeat": (unknown.repeat(), UNKNOWN_CARDINALITY),
        "empty repeat": (Dataset.range(0).repeat(), 0),
    }
    wrong = {name: (ds.cardinality(), n) for name, (ds, n) in cases.items()
             if ds.cardinality() != n}
    assert not wrong
    for name, (ds, n) in cases.items():
        if n >= 0 and name != "repeat forever":
            assert len(elements(ds)) == n, name


def test_len_of_infinite_or_unknown_raises() -> None:
    assert len(Dataset.range(4)) == 4
    with pytest.raises(TypeError, match="infinite"):
        len(Dataset.range(4).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.range(4).filter(lambda x: True))


# --- element_spec -----------------------------------------------------------------------------


def test_element_spec_of_sources_and_ops() -> None:
    assert Dataset.from_tensors(np.zeros((2, 3), np.float32)).element_spec == \
        TensorSpec((2, 3), np.float32)
    assert Dataset.from_tensors(b"abc").element_spec == TensorSpec((), bytes)
    assert Dataset.from_tensors(1.5).element_spec == TensorSpec((), np.float64)
    assert Dataset.from_tensors(True).element_spec == TensorSpec((), np.bool_)
    r = Dataset.range(4)
    spec = TensorSpec((), np.int64)
    for ds in (r.take(2), r.skip(1), r.shuffle(2), r.repeat(2), r.prefetch(1), r.cache(),
               r.filter(lambda x: x > 0), r.shard(2, 0), r.take_while(lambda x: True),
               r.concatenate(r), r.with_options(Options())):
        assert ds.element_spec == spec
    assert Dataset.zip(r, r.batch(2)).element_spec == (spec, TensorSpec((None,), np.int64))
    assert r.interleave(lambda x: Dataset.from_tensors((x, x))).element_spec == (spec, spec)


def test_element_spec_of_empty_map_is_unknown() -> None:
    with pytest.raises(FailedPreconditionError, match="empty"):
        _ = Dataset.range(0).map(lambda x: x).element_spec


# --- iteration, reduce, options, pickling -------------------------------------------------------


def test_get_next_raises_out_of_range_at_the_end() -> None:
    it = iter(Dataset.range(2))
    assert [it.get_next(), it.get_next()] == [0, 1]
    with pytest.raises(OutOfRangeError, match="End of sequence"):
        it.get_next()
    with pytest.raises(IndexError):  # OutOfRangeError is an IndexError, and keeps raising
        it.get_next()
    with pytest.raises(StopIteration):
        next(iter(Dataset.range(0)))


def test_iterators_are_independent() -> None:
    dataset = Dataset.range(5)
    a, b = iter(dataset), iter(dataset)
    assert next(a) == 0 and next(a) == 1
    assert next(b) == 0
    assert list(a) == [2, 3, 4]
    assert list(dataset.as_numpy_iterator()) == [0, 1, 2, 3, 4]


@FAST
@given(sizes)
def test_reduce_matches_functools_reduce(n: int) -> None:
    assert Dataset.range(n).reduce(0, lambda s, x: s + x) == sum(range(n))
    count, total = Dataset.range(n).reduce((0, 0), lambda s, x: (s[0] + 1, s[1] + x))
    assert (count, total) == (n, sum(range(n)))


def test_options_merge_along_the_pipeline() -> None:
    base = Dataset.range(3)
    assert base.options() == Options()
    one = base.with_options(Options(deterministic=False))
    two = one.map(lambda x: x).with_options(Options(auto_shard_policy="DATA"))
    three = two.with_options(Options(deterministic=True))
    assert one.options() == Options(deterministic=False)
    assert two.options() == Options(deterministic=False, auto_shard_policy="DATA")
    assert three.options() == Options(deterministic=True, auto_shard_policy="DATA")
    assert base.options() == Options()  # the original is unchanged
    assert elements(three) == [0, 1, 2]


def test_apply() -> None:
    dataset = Dataset.range(10).apply(lambda ds: ds.filter(lambda x: x % 3 == 0))
    assert elements(dataset) == [0, 3, 6, 9]


def _round_trip(dataset: Dataset) -> Dataset:
    return cloudpickle.loads(cloudpickle.dumps(dataset))


def test_pickled_graph_with_lambdas_and_closures_yields_the_same() -> None:
    table = np.arange(100) ** 2
    offset = 7

    def lookup(x):
        return table[x] + offset

    dataset = (Dataset.range(20).map(lookup).filter(lambda x: x % 2 == 1)
               .map(lambda x: (x, np.full(2, x))).batch(3).shuffle(4, seed=1).prefetch(2))
    copy = _round_trip(dataset)
    assert isinstance(copy, Dataset)
    assert py(list(copy)) == py(list(dataset))


def test_pickled_datasets_of_every_kind(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a\nb\n")
    rec = str(tmp_path / "r.tfrecord")
    with TFRecordWriter(rec) as writer:
        writer.write(b"r")
    weights = np.array([0.5, 0.5])
    datasets = [
        Dataset.from_tensor_slices({"a": np.arange(4), "b": np.eye(4)}),
        Dataset.from_generator(lambda: iter(weights), output_signature=TensorSpec((), float)),
        Dataset.zip(Dataset.range(3), Dataset.range(3)).map(lambda a, b: a + b),
        Dataset.range(3).interleave(lambda x: Dataset.range(x), cycle_length=2),
        Dataset.sample_from_datasets([Dataset.range(3), Dataset.range(5, 8)],
                                     weights=weights, seed=3),
        Dataset.choose_from_datasets([Dataset.range(3)], Dataset.range(2).map(lambda x: 0)),
        Dataset.range(5).cache().enumerate().take_while(lambda i, x: i < 3),
        Dataset.range(9).shard(2, 1).padded_batch(2).unbatch(),
        Dataset.list_files(str(tmp_path / "*.txt")),
        TextLineDataset(str(path)),
        TFRecordDataset(rec),
        Dataset.range(10).shuffle(10, seed=5),
    ]
    for dataset in datasets:
        assert py(list(_round_trip(dataset))) == py(list(dataset)), repr(dataset)


def test_a_seeded_shuffle_unpickled_repeats_the_epoch_orders() -> None:
    dataset = Dataset.range(30).shuffle(30, seed=8).repeat(2)
    assert elements(_round_trip(dataset)) == elements(dataset)


@pytest.mark.parametrize("reshuffle", [True, False])
def test_an_unseeded_shuffle_draws_its_seed_where_it_is_unpickled(reshuffle: bool) -> None:
    """As each data service worker instantiates the pipeline: each shuffles its own way;
    within one instance, reshuffle_each_iteration=False still repeats its order."""
    dataset = Dataset.range(50).shuffle(50, reshuffle_each_iteration=reshuffle).repeat(2)
    orders = [elements(copy) for copy in (dataset, _round_trip(dataset), _round_trip(dataset))]
    assert all(sorted(order) == sorted(list(range(50)) * 2) for order in orders)
    assert len({tuple(order) for order in orders}) == 3
    for order in orders:
        assert (order[:50] == order[50:]) is not reshuffle
    assert (elements(dataset) == orders[0]) is not reshuffle  # iterating again


def test_repr_names_the_op() -> None:
    assert "Map" in repr(Dataset.range(3).map(lambda x: x))
    assert "Range" in repr(Dataset.range(3))
