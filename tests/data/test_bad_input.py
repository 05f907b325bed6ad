"""Every public entry point of convoy.data rejects bad arguments with a clear error.

Each message names the argument, what was expected and what was received; each error is a
convoy error that is also the matching builtin (InvalidArgumentError is a ValueError,
NotFoundError a LookupError, OutOfRangeError an IndexError).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from convoy.data import (
    Dataset,
    Options,
    TensorSpec,
    TextLineDataset,
    TFRecordDataset,
    TFRecordWriter,
)
from convoy.errors import (
    ConvoyError,
    DataLossError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
)


def _raises(error: type[BaseException], match: str, builtin: type[BaseException]):
    """pytest.raises for ``error`` that also checks the builtin base and ConvoyError."""
    context = pytest.raises(error, match=match)

    class _Both:
        def __enter__(self):
            self.info = context.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = context.__exit__(*exc)
            if handled:
                assert isinstance(self.info.value, builtin)
                assert isinstance(self.info.value, ConvoyError)
            return handled

    return _Both()


def invalid(match: str):
    return _raises(InvalidArgumentError, match, ValueError)


# --- arguments of transformations --------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda ds: ds.batch(0), r"batch_size must be >= 1, got 0"),
    (lambda ds: ds.batch(-1), r"batch_size must be >= 1, got -1"),
    (lambda ds: ds.batch("3"), r"batch_size must be an integer, got '3' \(str\)"),
    (lambda ds: ds.batch(2.0), r"batch_size must be an integer, got 2.0 \(float\)"),
    (lambda ds: ds.batch(True), r"batch_size must be an integer, got True \(bool\)"),
    (lambda ds: ds.batch(2, drop_remainder=1), r"drop_remainder must be True or False, got 1"),
    (lambda ds: ds.batch(2, num_parallel_calls=0), r"num_parallel_calls must be >= 1"),
    (lambda ds: ds.padded_batch(0), r"batch_size must be >= 1, got 0"),
    (lambda ds: ds.shard(2, 2), r"index must be less than num_shards \(2\), got 2"),
    (lambda ds: ds.shard(0, 0), r"num_shards must be >= 1, got 0"),
    (lambda ds: ds.shard(2, -1), r"index must be >= 0, got -1"),
    (lambda ds: ds.shard("2", 0), r"num_shards must be an integer, got '2' \(str\)"),
    (lambda ds: ds.take("x"), r"count must be an integer, got 'x' \(str\)"),
    (lambda ds: ds.take(-2), r"count must be >= 0 \(or one of \[-1\]\), got -2"),
    (lambda ds: ds.skip(1.5), r"count must be an integer, got 1.5 \(float\)"),
    (lambda ds: ds.repeat(-2), r"count must be >= 0 \(or one of \[-1\]\), got -2"),
    (lambda ds: ds.repeat("2"), r"count must be an integer, got '2'"),
    (lambda ds: ds.shuffle(0), r"buffer_size must be >= 1, got 0"),
    (lambda ds: ds.shuffle(None), r"buffer_size must be an integer, got None"),
    (lambda ds: ds.shuffle(4, seed="a"), r"seed must be an integer, got 'a' \(str\)"),
    (lambda ds: ds.shuffle(4, reshuffle_each_iteration=None),
     r"reshuffle_each_iteration must be True or False, got None"),
    (lambda ds: ds.prefetch(-5), r"buffer_size must be >= 0 \(or one of \[-1\]\), got -5"),
    (lambda ds: ds.map(3), r"map_func must be callable, got 3 \(int\)"),
    (lambda ds: ds.map(lambda x: x, num_parallel_calls=0),
     r"num_parallel_calls must be >= 1 \(or one of \[-1\]\), got 0"),
    (lambda ds: ds.map(lambda x: x, deterministic="yes"),
     r"deterministic must be True or False, got 'yes' \(str\)"),
    (lambda ds: ds.filter(None), r"predicate must be callable, got None \(NoneType\)"),
    (lambda ds: ds.take_while("x < 3"), r"predicate must be callable, got 'x < 3'"),
    (lambda ds: ds.interleave(lambda x: Dataset.range(x), cycle_length=0),
     r"cycle_length must be >= 1 \(or one of \[-1\]\), got 0"),
    (lambda ds: ds.interleave(lambda x: Dataset.range(x), block_length=0),
     r"block_length must be >= 1, got 0"),
    (lambda ds: ds.interleave(None), r"map_func must be callable, got None"),
    (lambda ds: ds.flat_map(5), r"map_func must be callable, got 5"),
    (lambda ds: ds.enumerate("a"), r"start must be an integer, got 'a' \(str\)"),
    (lambda ds: ds.concatenate([1, 2]), r"dataset must be a convoy.data.Dataset, got list"),
    (lambda ds: ds.cache(3), r"filename must be a string, got 3 \(int\)"),
    (lambda ds: ds.apply(3), r"transformation_func must be callable, got 3"),
    (lambda ds: ds.apply(lambda d: 3),
     r"the value returned by transformation_func must be a convoy.data.Dataset, got int"),
    (lambda ds: ds.with_options({"deterministic": True}),
     r"options must be convoy.data.Options, got dict"),
])
def test_transformation_arguments(call, match: str) -> None:
    with invalid(match):
        call(Dataset.range(5))


# --- arguments of sources -----------------------------------------------------------------------


def test_range_arguments() -> None:
    with invalid(r"range takes 1 to 3 arguments, got 0"):
        Dataset.range()
    with invalid(r"range takes 1 to 3 arguments, got 4"):
        Dataset.range(1, 2, 3, 4)
    with invalid(r"step must not be zero"):
        Dataset.range(1, 2, 0)
    with invalid(r"stop must be an integer, got 1.5 \(float\)"):
        Dataset.range(1.5)
    with invalid(r"start must be an integer, got '0' \(str\)"):
        Dataset.range("0", 3)


def test_from_tensor_slices_mismatched_first_dimensions() -> None:
    with invalid(r"tensors must have the same size in their first dimension, "
                 r"got shapes \[\[3, 2\], \[4\]\]"):
        Dataset.from_tensor_slices((np.zeros((3, 2)), np.zeros(4)))
    with invalid(r"got shapes \[\[2\], \[3\]\]"):
        Dataset.from_tensor_slices({"a": [1, 2], "b": [1, 2, 3]})


def test_from_tensor_slices_scalars_and_other_bad_tensors() -> None:
    with invalid(r"component 0 of tensors is a scalar"):
        Dataset.from_tensor_slices(np.int64(3))
    with invalid(r"component 1 of tensors is a scalar"):
        Dataset.from_tensor_slices(([1, 2], 5))
    with invalid(r"tensors must not contain None"):
        Dataset.from_tensor_slices(None)
    with invalid(r"tensors: could not convert a list to one array"):
        Dataset.from_tensor_slices([[1, 2], [3]])
    with invalid(r"tensors must hold at least one component, got \(\)"):
        Dataset.from_tensor_slices(())
    with invalid(r"tensors must not contain None"):
        Dataset.from_tensors((1, None))


def test_from_generator_arguments() -> None:
    with invalid(r"generator must be callable, got 3 \(int\)"):
        Dataset.from_generator(3, output_signature=TensorSpec(()))
    with invalid(r"from_generator needs output_signature"):
        Dataset.from_generator(lambda: iter([1]))
    with invalid(r"output_signature must be a structure of TensorSpec, found 3"):
        Dataset.from_generator(lambda: iter([1]), output_signature=(TensorSpec(()), 3))
    with invalid(r"output_shapes must have the structure of output_types"):
        Dataset.from_generator(lambda: iter([(1, 2)]), output_types=(np.int64, np.int64),
                               output_shapes=((),))


def test_from_generator_value_that_does_not_match_the_signature() -> None:
    spec = TensorSpec((), np.int64)
    dataset = Dataset.from_generator(lambda: iter([1, 2, "x"]), output_signature=spec)
    it = iter(dataset)
    assert [next(it), next(it)] == [1, 2]
    with invalid(r"element 2 value 'x' cannot be converted to "
                 + re.escape(repr(spec))):
        next(it)


def test_from_generator_wrong_shape_and_structure() -> None:
    spec = TensorSpec((2,), np.float32)
    with invalid(r"element 1 has shape \[3\], which does not match "
                 + re.escape(repr(spec))):
        list(Dataset.from_generator(lambda: iter([np.zeros(2), np.zeros(3)]),
                                    output_signature=spec))
    pair = (TensorSpec(()), TensorSpec(()))
    with invalid(r"element 0 does not match output_signature .*tuple of length 2 vs "
                 r"tuple of length 3"):
        list(Dataset.from_generator(lambda: iter([(1, 2, 3)]), output_signature=pair))
    with invalid(r"element 0 does not match output_signature .*dict"):
        list(Dataset.from_generator(lambda: iter([{"a": 1}]), output_signature=pair))


def test_zip_arguments() -> None:
    with invalid(r"zip needs several datasets, or one tuple/dict of datasets, got \(\)"):
        Dataset.zip()
    with invalid(r"datasets must be a convoy.data.Dataset, got int"):
        Dataset.zip(Dataset.range(3), 4)
    with invalid(r"datasets must be a convoy.data.Dataset, got str"):
        Dataset.zip({"a": Dataset.range(3), "b": ["not a dataset"]})


def test_sample_and_choose_arguments() -> None:
    two = [Dataset.range(3), Dataset.range(3)]
    with invalid(r"sample_from_datasets needs at least one dataset"):
        Dataset.sample_from_datasets([])
    with invalid(r"datasets must be a convoy.data.Dataset, got int"):
        Dataset.sample_from_datasets([1, 2])
    with invalid(r"weights must be 2 non-negative numbers with a positive sum, got \[1.0\]"):
        Dataset.sample_from_datasets(two, weights=[1])
    with invalid(r"weights must be 2 .*got \[1.0, -2.0\]"):
        Dataset.sample_from_datasets(two, weights=[1, -2])
    with invalid(r"weights must be 2 .*got \[0.0, 0.0\]"):
        Dataset.sample_from_datasets(two, weights=[0, 0])
    with invalid(r"seed must be an integer"):
        Dataset.sample_from_datasets(two, seed=1.5)
    with invalid(r"choose_from_datasets needs at least one dataset"):
        Dataset.choose_from_datasets([], Dataset.range(1))
    with invalid(r"choice_dataset must be a convoy.data.Dataset, got list"):
        Dataset.choose_from_datasets(two, [0, 1])
    with invalid(r"choice 2 is out of range for 2 datasets"):
        list(Dataset.choose_from_datasets(two, Dataset.range(3)))


def test_list_files_arguments(tmp_path: Path) -> None:
    pattern = str(tmp_path / "*.nothing")
    with _raises(NotFoundError, r"no files matched pattern\(s\) \[" + re.escape(repr(pattern)),
                 LookupError):
        Dataset.list_files(pattern)
    with invalid(r"file_pattern must be a string or a list of strings, got 3"):
        Dataset.list_files(3)
    with invalid(r"file_pattern must be a string or a list of strings, got None"):
        Dataset.list_files([pattern, None])
    (tmp_path / "a.txt").write_text("x")
    with invalid(r"shuffle must be True or False, got 'no'"):
        Dataset.list_files(str(tmp_path / "*.txt"), shuffle="no")


# --- readers ---------------------------------------------------------------------------------


def test_reader_arguments(tmp_path: Path) -> None:
    with invalid(r"filenames must be a file name, a list of file names or a Dataset of them, "
                 r"got 3"):
        TextLineDataset(3)
    with invalid(r"filenames must be .*got \['a', 3\]"):
        TFRecordDataset(["a", 3])
    with invalid(r"compression_type must be one of None, '', 'GZIP', 'ZLIB', got 'BZ2'"):
        TFRecordDataset(str(tmp_path / "x"), compression_type="BZ2")
    with invalid(r"compression_type must be one of .*got 'gzip'"):
        TextLineDataset(str(tmp_path / "x"), compression_type="gzip")
    with invalid(r"num_parallel_reads must be >= 1 \(or one of \[-1\]\), got 0"):
        TextLineDataset(str(tmp_path / "x"), num_parallel_reads=0)


def test_reader_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.txt")
    with _raises(NotFoundError, re.escape(missing), LookupError):
        list(TextLineDataset(missing))
    with _raises(NotFoundError, re.escape(missing), LookupError):
        list(TFRecordDataset(missing))


def test_corrupt_tfrecord_gives_data_loss_naming_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for i in range(3):
            writer.write(b"record-%d" % i)  # 12 + 8 + 4 = 24 bytes each
    raw = bytearray(path.read_bytes())
    raw[24 + 12 + 3] ^= 0xFF  # a data byte of the second record
    path.write_bytes(bytes(raw))
    it = iter(TFRecordDataset(str(path)))
    assert next(it) == b"record-0"
    with pytest.raises(DataLossError, match=r"offset 24 in " + re.escape(str(path))
                       + r".*data CRC mismatch"):
        next(it)
    truncated = tmp_path / "truncated.tfrecord"
    truncated.write_bytes(bytes(raw[:24 + 5]))
    with pytest.raises(DataLossError, match=r"offset 24 in " + re.escape(str(truncated))
                       + r".*truncated header"):
        list(TFRecordDataset(str(truncated)))


# --- errors found while iterating ------------------------------------------------------------


def test_batching_elements_of_different_shapes() -> None:
    dataset = Dataset.range(4).map(lambda x: (x, np.zeros(x)))
    with invalid(r"Cannot batch tensors with different shapes in component 1. "
                 r"First element had shape \[0\] and element 1 had shape \[1\]"):
        list(dataset.batch(2))


def test_padded_batch_shapes_that_do_not_fit() -> None:
    dataset = Dataset.range(5).map(lambda x: np.arange(x))
    with invalid(r"component 0 has shape \[4\], which does not fit padded shape \[3\]"):
        list(dataset.padded_batch(5, padded_shapes=[3]))
    with invalid(r"padded shape \[3, 3\] of component 0 has rank 2, but the component has "
                 r"rank 1"):
        list(dataset.padded_batch(2, padded_shapes=[3, 3]))
    pairs = dataset.map(lambda v: (v, v))
    with invalid(r"padded_shapes must have the structure of the elements"):
        list(pairs.padded_batch(2, padded_shapes=[3]))


def test_unbatch_of_scalars() -> None:
    with invalid(r"unbatch: component 0 is a scalar"):
        list(Dataset.range(3).unbatch())


def test_interleave_function_must_return_a_dataset() -> None:
    with invalid(r"map_func must be a convoy.data.Dataset, got int"):
        list(Dataset.range(3).interleave(lambda x: x, cycle_length=1))


def test_get_next_past_the_end() -> None:
    it = iter(Dataset.range(1))
    it.get_next()
    with _raises(OutOfRangeError, r"End of sequence", IndexError):
        it.get_next()


def test_load_state_dict_garbage() -> None:
    it = iter(Dataset.range(3))
    with invalid(r"state must be a dict returned by DatasetIterator.state_dict\(\), got str"):
        it.load_state_dict("garbage")
    with invalid(r"state must be a dict returned by DatasetIterator.state_dict\(\)"):
        it.load_state_dict({"version": -1})
    assert list(it) == [0, 1, 2]  # a rejected state leaves the iterator where it was


def test_tensor_spec_arguments() -> None:
    with invalid(r"shape must hold sizes >= 0 or None, got \(-1,\)"):
        TensorSpec([-1])
    with invalid(r"shape must be a sequence of sizes \(int or None\) or None, got 3"):
        TensorSpec(3)
    with invalid(r"dtype must be a numpy dtype, str or bytes, got 'no-such-type'"):
        TensorSpec([], "no-such-type")


def test_options_are_a_dataclass() -> None:
    with pytest.raises(TypeError):
        Options(no_such_option=True)
