"""The names of ``tf.data.experimental`` that ported pipelines use.

The transformations return a function for ``Dataset.apply``, as TensorFlow's do.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from convoy._base import check
from convoy._values import nest
from convoy.data import service  # tf.data.experimental.service: the same module
from convoy.data._core._op import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from convoy.data._core._optional import Optional
from convoy.data._core._options import (
    AutoShardPolicy,
    AutotuneOptions,
    DistributeOptions,
    OptimizationOptions,
    ThreadingOptions,
)
from convoy.data._dataset import Dataset
from convoy.data._file_datasets import _file_list
from convoy.data._iterator import DatasetIterator
from convoy.data._ops._faults import AssertCardinalityOp
from convoy.data._sources._basic import ElementsOp, to_tensor_structure
from convoy.data._sources._csv import csv_op, file_names, header_names, infer_defaults
from convoy.errors import InvalidArgumentError
from convoy.io._parsing import check_features, parse_example

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "UNKNOWN_CARDINALITY",
    "AutoShardPolicy",
    "AutotuneOptions",
    "CsvDataset",
    "DistributeOptions",
    "OptimizationOptions",
    "Optional",
    "ThreadingOptions",
    "assert_cardinality",
    "bucket_by_sequence_length",
    "cardinality",
    "choose_from_datasets",
    "dense_to_ragged_batch",
    "dense_to_sparse_batch",
    "distributed_save",
    "from_list",
    "get_next_as_optional",
    "group_by_window",
    "ignore_errors",
    "make_batched_features_dataset",
    "make_csv_dataset",
    "parse_example_dataset",
    "rejection_resample",
    "sample_from_datasets",
    "scan",
    "service",
    "unique",
]

Transformation = Callable[[Dataset], Dataset]


def bucket_by_sequence_length(element_length_func: Callable[..., Any],
                              bucket_boundaries: Sequence[int],
                              bucket_batch_sizes: Sequence[int], padded_shapes: Any = None,
                              padding_values: Any = None, pad_to_bucket_boundary: bool = False,
                              no_padding: bool = False,
                              drop_remainder: bool = False) -> Transformation:
    """``dataset.bucket_by_sequence_length(...)`` as a transformation for ``apply``."""
    return lambda dataset: dataset.bucket_by_sequence_length(
        element_length_func, bucket_boundaries, bucket_batch_sizes, padded_shapes,
        padding_values, pad_to_bucket_boundary, no_padding, drop_remainder)


def sample_from_datasets(datasets: Sequence[Dataset], weights: Sequence[float] | None = None,
                         seed: int | None = None,
                         stop_on_empty_dataset: bool = False) -> Dataset:
    """``Dataset.sample_from_datasets``."""
    return Dataset.sample_from_datasets(datasets, weights, seed, stop_on_empty_dataset)


def choose_from_datasets(datasets: Sequence[Dataset], choice_dataset: Dataset,
                         stop_on_empty_dataset: bool = True) -> Dataset:
    """``Dataset.choose_from_datasets``."""
    return Dataset.choose_from_datasets(datasets, choice_dataset, stop_on_empty_dataset)


def make_batched_features_dataset(file_pattern: Any, batch_size: int,
                                  features: Mapping[str, Any], reader: Any = None,
                                  label_key: str | None = None,
                                  reader_args: Sequence[Any] | None = None,
                                  num_epochs: int | None = None, shuffle: bool = True,
                                  shuffle_buffer_size: int = 10000,
                                  shuffle_seed: int | None = None,
                                  prefetch_buffer_size: int | None = None,
                                  reader_num_threads: int | None = None,
                                  parser_num_threads: int | None = None,
                                  sloppy_ordering: bool = False,
                                  drop_final_batch: bool = False) -> Dataset:
    """Batches of ``Example`` records read by ``reader`` (``TFRecordDataset``) from the files
    matching ``file_pattern``, parsed into dicts of ``features`` (``(features, label)`` with
    ``label_key``), as TensorFlow's: files and records shuffled unless ``shuffle=False``, the
    data repeated ``num_epochs`` times (for ever if None, then every batch full)."""
    from convoy.data._file_datasets import TFRecordDataset

    size = check.integer("batch_size", batch_size, 1)
    check_features(features)
    if label_key is not None and label_key not in features:
        raise InvalidArgumentError(
            f"The `label_key` provided ({label_key}) must be one of the `features` keys.")
    read = TFRecordDataset if reader is None else check.function("reader", reader)
    threads = check.optional_integer("reader_num_threads", reader_num_threads, 1,
                                     allowed=(AUTOTUNE,)) or 1
    files = Dataset.list_files(file_pattern, shuffle=check.boolean("shuffle", shuffle),
                               seed=shuffle_seed)
    dataset = files.interleave(lambda name: read(name, *(reader_args or ())),
                               cycle_length=threads,
                               num_parallel_calls=None if threads == 1 else threads,
                               deterministic=not sloppy_ordering)
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer_size, shuffle_seed)
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(size, drop_remainder=drop_final_batch or num_epochs is None)
    dataset = dataset.apply(parse_example_dataset(
        features, num_parallel_calls=parser_num_threads or 1,
        deterministic=not sloppy_ordering))
    if label_key is not None:
        dataset = dataset.map(lambda parsed: (
            {k: v for k, v in parsed.items() if k != label_key}, parsed[label_key]))
    return dataset.prefetch(AUTOTUNE if prefetch_buffer_size is None else prefetch_buffer_size)


def cardinality(dataset: Dataset) -> int:
    """``dataset.cardinality()``."""
    return dataset.cardinality()


def assert_cardinality(expected_cardinality: int) -> Transformation:
    """The dataset, declared to have ``expected_cardinality`` elements: iterating it raises
    FailedPreconditionError as soon as it turns out to have fewer or more."""
    expected = check.integer("expected_cardinality", expected_cardinality,
                             allowed=(INFINITE_CARDINALITY,))
    if expected < 0 and expected != INFINITE_CARDINALITY:
        raise InvalidArgumentError(
            f"expected_cardinality must be >= 0 or INFINITE_CARDINALITY, got {expected}")
    return lambda dataset: Dataset(AssertCardinalityOp(dataset._op, expected))


def dense_to_ragged_batch(batch_size: int, drop_remainder: bool = False,
                          row_splits_dtype: Any = np.int64) -> Transformation:
    """``Dataset.ragged_batch`` as a transformation."""
    return lambda dataset: dataset.ragged_batch(batch_size, drop_remainder, row_splits_dtype)


def dense_to_sparse_batch(batch_size: int, row_shape: Any) -> Transformation:
    """``Dataset.sparse_batch`` as a transformation."""
    return lambda dataset: dataset.sparse_batch(batch_size, row_shape)


def group_by_window(key_func: Callable[..., Any], reduce_func: Callable[..., Dataset],
                    window_size: int | None = None,
                    window_size_func: Callable[[Any], Any] | None = None) -> Transformation:
    """``Dataset.group_by_window`` as a transformation."""
    return lambda dataset: dataset.group_by_window(key_func, reduce_func, window_size,
                                                   window_size_func)


def ignore_errors(log_warning: bool = False) -> Transformation:
    """``Dataset.ignore_errors`` as a transformation."""
    return lambda dataset: dataset.ignore_errors(log_warning)


def parse_example_dataset(features: Mapping[str, Any], num_parallel_calls: int = 1,
                          deterministic: bool | None = None) -> Transformation:
    """Each element, a 1-D array of serialized ``Example`` records (a batch of a
    ``TFRecordDataset``), parsed by :func:`convoy.io.parse_example` into a dict of features."""
    if features is None:
        raise InvalidArgumentError("Missing: features was None.")
    check_features(features)
    parallel = check.optional_integer("num_parallel_calls", num_parallel_calls, 1,
                                      allowed=(AUTOTUNE,))
    order = check.optional_boolean("deterministic", deterministic)

    def apply(dataset: Dataset) -> Dataset:
        spec = dataset._op.static_spec()
        if spec is not None and not (
                isinstance(spec, nest.TensorSpec) and spec.shape is not None
                and len(spec.shape) == 1 and np.dtype(spec.dtype).kind in "OS"):
            raise InvalidArgumentError(
                f"Input dataset should be a dataset of vectors of strings, got elements of "
                f"{spec}")
        return dataset.map(lambda serialized: parse_example(serialized, features),
                           num_parallel_calls=None if parallel == 1 else parallel,
                           deterministic=order)

    return apply


def rejection_resample(class_func: Callable[..., Any], target_dist: Any,
                       initial_dist: Any = None, seed: int | None = None) -> Transformation:
    """``Dataset.rejection_resample`` as a transformation."""
    return lambda dataset: dataset.rejection_resample(class_func, target_dist, initial_dist,
                                                      seed)


def scan(initial_state: Any, scan_func: Callable[[Any, Any], Any]) -> Transformation:
    """``Dataset.scan`` as a transformation."""
    return lambda dataset: dataset.scan(initial_state, scan_func)


def unique() -> Transformation:
    """``Dataset.unique`` as a transformation."""
    return lambda dataset: dataset.unique()


def get_next_as_optional(iterator: DatasetIterator) -> Optional:
    """``iterator.get_next_as_optional()``."""
    if not isinstance(iterator, DatasetIterator):
        raise InvalidArgumentError(
            f"iterator must be a convoy.data.DatasetIterator, got {type(iterator).__name__}")
    return iterator.get_next_as_optional()


def from_list(elements: list[Any], name: str | None = None) -> Dataset:
    """A dataset of the given elements, in order; unlike ``from_tensor_slices`` their
    shapes may differ (their structure and dtypes may not)."""
    if not elements:
        raise InvalidArgumentError("Invalid `elements`. `elements` should not be empty.")
    if not isinstance(elements, list):
        raise InvalidArgumentError("Invalid `elements`. `elements` must be a list.")
    converted = [to_tensor_structure(e, "elements") for e in elements]
    specs = [nest.spec_from_value(e) for e in converted]
    for i, spec in enumerate(specs[1:], 1):
        nest.assert_same_structure(specs[0], spec)
        for a, b in zip(nest.flatten(specs[0]), nest.flatten(spec)):
            if a.dtype != b.dtype:
                raise InvalidArgumentError(
                    f"Invalid `elements`. Element {i} has dtype {b.dtype} where element 0 "
                    f"has {a.dtype}: all elements must have the same dtypes.")
    common = specs[0]
    for spec in specs[1:]:
        common = nest.map_structure(lambda a, b: a.most_specific_common(b), common, spec)
    return Dataset(ElementsOp(converted, common))


class CsvDataset(Dataset):
    """The records of CSV files, each a tuple with one scalar per selected column.

    ``record_defaults`` gives each column's dtype and default: a value (or ``[value]``),
    or a dtype or ``[]`` for a column that must be present.
    """

    def __init__(self, filenames: Any, record_defaults: Sequence[Any],
                 compression_type: str | None = None, buffer_size: int | None = None,
                 header: bool = False, field_delim: str = ",", use_quote_delim: bool = True,
                 na_value: str = "", select_cols: Sequence[int] | None = None,
                 exclude_cols: Sequence[int] | None = None) -> None:
        files = _file_list(filenames, "filenames")
        args = (list(record_defaults), compression_type, header, field_delim, use_quote_delim,
                na_value, select_cols, exclude_cols)
        if isinstance(files, Dataset):
            csv_op([], *args)  # checks the arguments now

            def read_one(filename: Any) -> Dataset:
                return Dataset(csv_op([filename], *args))

            super().__init__(files.flat_map(read_one)._op)
        else:
            super().__init__(csv_op(files, *args))


def make_csv_dataset(file_pattern: Any, batch_size: int, column_names: Sequence[str] | None = None,
                     column_defaults: Sequence[Any] | None = None,
                     label_name: str | None = None, select_columns: Sequence[Any] | None = None,
                     field_delim: str = ",", use_quote_delim: bool = True, na_value: str = "",
                     header: bool = True, num_epochs: int | None = None, shuffle: bool = True,
                     shuffle_buffer_size: int = 10000, shuffle_seed: int | None = None,
                     prefetch_buffer_size: int | None = None,
                     num_parallel_reads: int | None = None, sloppy: bool = False,
                     num_rows_for_inference: int = 100, compression_type: str | None = None,
                     ignore_errors: bool = False, encoding: str = "utf-8") -> Dataset:
    """Batches of CSV records as dicts of columns (``(features, label)`` with
    ``label_name``), column names read from the header and dtypes inferred unless given."""
    files = file_names(file_pattern)
    size = check.integer("batch_size", batch_size, 1)
    if column_names is None:
        if not header:
            raise InvalidArgumentError("Cannot infer column names without a header line.")
        column_names = header_names(files[0], field_delim, use_quote_delim, compression_type)
    names = list(column_names)
    if len(set(names)) != len(names):
        raise InvalidArgumentError("Cannot have duplicate column names.")
    select = None
    if select_columns is not None:
        select = sorted(_column_index(c, names) for c in select_columns)
        names = [names[i] for i in select]
    if column_defaults is not None and len(column_defaults) != len(names):
        raise InvalidArgumentError(
            "If specified, column_defaults and select_columns must have same length.")
    if label_name is not None and label_name not in names:
        raise InvalidArgumentError(
            f"`label_name` provided must be one of the columns: {names}. "
            f"Received: {label_name}.")
    defaults = list(column_defaults) if column_defaults is not None else infer_defaults(
        files, len(names), field_delim, use_quote_delim, na_value, header,
        num_rows_for_inference, select, compression_type)

    def read_one(filename: Any) -> Dataset:
        return CsvDataset(filename, defaults, compression_type=compression_type,
                          header=header, field_delim=field_delim,
                          use_quote_delim=use_quote_delim, na_value=na_value,
                          select_cols=select)

    filenames = Dataset.from_tensor_slices(np.array(files, dtype=object))
    if shuffle:
        filenames = filenames.shuffle(len(files), shuffle_seed)
    parallel = num_parallel_reads or 1
    dataset = filenames.interleave(read_one, cycle_length=parallel,
                                   num_parallel_calls=None if parallel == 1 else parallel)
    if ignore_errors:
        dataset = dataset.ignore_errors()
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer_size, shuffle_seed)
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    dataset = dataset.batch(size, drop_remainder=num_epochs is None)

    def to_dict(*columns: Any) -> Any:
        features = collections.OrderedDict(zip(names, columns))
        if label_name is None:
            return features
        label = features.pop(label_name)
        return features, label

    dataset = dataset.map(to_dict)
    return dataset.prefetch(AUTOTUNE if prefetch_buffer_size is None else prefetch_buffer_size)


def _column_index(column: Any, names: list[str]) -> int:
    if isinstance(column, (int, np.integer)):
        if not 0 <= column < len(names):
            raise InvalidArgumentError(
                f"Column index {column} specified in `select_columns` should be > 0 and "
                f"< {len(names)}.")
        return int(column)
    if column not in names:
        raise InvalidArgumentError(
            f"Value {column} specified in `select_columns` must be of one of the columns: "
            f"{names}.")
    return names.index(column)


def distributed_save(dataset: Dataset, path: Any, data_service_address: str,
                     compression: str | None = "AUTO") -> None:
    """Starts writing ``dataset`` under ``path`` through the data service's workers;
    ``Dataset.load(path, wait=True)`` reads it once written."""
    from convoy.data.service._distributed_save import distributed_save as start

    start(dataset, path, data_service_address, compression)
