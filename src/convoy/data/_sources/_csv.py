"""CsvDataset and make_csv_dataset: records of CSV files, parsed as TensorFlow parses them.

A record ends at a newline outside quotes. With ``use_quote_delim`` a field may be quoted
(``"a,b"``, a quote inside written ``""``, newlines allowed); an unquoted field must not
hold a quote. An empty field, or one equal to ``na_value``, takes its column's default; a
column without a default (``[]`` or a dtype in ``record_defaults``) must have a value.
A record that fails to parse raises InvalidArgumentError once it has been consumed, so
``ignore_errors`` goes on with the next record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from convoy._base import fs as _fs
from convoy._values import nest
from convoy.data._core._op import Node
from convoy.data._sources._file_reader_ops import FileReaderOp
from convoy.data.tfrecord import open_stream
from convoy.errors import InvalidArgumentError, NotFoundError

_STRING = np.dtype(object)
_SUPPORTED = {np.dtype(t) for t in (np.int32, np.int64, np.float32, np.float64)} | {_STRING}


class Column:
    """How one selected column converts: its dtype and default (None: required)."""

    __slots__ = ("dtype", "default")

    def __init__(self, dtype: np.dtype, default: Any) -> None:
        self.dtype = dtype
        self.default = default

    def convert(self, field: bytes, na_value: bytes, column: int, record: int) -> Any:
        if field == b"" or field == na_value:
            if self.default is None:
                raise InvalidArgumentError(
                    f"Field {column} is required but missing in record!")
            return self.default
        if self.dtype == _STRING:
            return field
        try:
            if self.dtype.kind == "i":
                value = int(field.strip())
                info = np.iinfo(self.dtype)
                if not info.min <= value <= info.max:
                    raise ValueError
                return self.dtype.type(value)
            return self.dtype.type(float(field))
        except ValueError:
            raise InvalidArgumentError(
                f"Field {column} in record {record} is not a valid {self.dtype.name}: "
                f"{field!r}") from None


def _dtype(value: Any) -> np.dtype:
    if value in (str, bytes, "string", object):
        return _STRING
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or (dtype not in _SUPPORTED and dtype.kind not in "SU"):
        raise InvalidArgumentError(
            f"record_defaults: each entry must be int32, int64, float32, float64 or string, "
            f"got {value!r}")
    return _STRING if dtype.kind in "SUO" else dtype


def column_from_default(entry: Any) -> Column:
    """A ``record_defaults`` entry: a dtype (required), an empty list or array (required, of
    its dtype), or a default value (alone or in a one-element list)."""
    if isinstance(entry, (type, np.dtype, str)) and not isinstance(entry, np.str_):
        return Column(_dtype(entry), None)
    if isinstance(entry, (list, tuple)):
        if len(entry) > 1:
            raise InvalidArgumentError(
                f"record_defaults: a default must hold at most one value, got {entry!r}")
        entry = np.asarray(entry) if entry or isinstance(entry, tuple) else \
            np.asarray(entry, dtype=np.float32)
    array = np.asarray(entry)
    if isinstance(entry, (bytes, str)) or array.dtype.kind in "SUO":
        dtype = _STRING
    else:
        dtype = _dtype(array.dtype)
    if array.size == 0:
        return Column(dtype, None)
    if array.size != 1:
        raise InvalidArgumentError(
            f"record_defaults: a default must hold at most one value, got {entry!r}")
    value = array.reshape(()).item() if dtype != _STRING else array.reshape(())[()]
    if dtype == _STRING:
        return Column(dtype, value.encode() if isinstance(value, str) else bytes(value))
    return Column(dtype, dtype.type(value))


def split_record(record: bytes, delim: bytes, quotes: bool) -> list[bytes]:
    """The fields of one record (its line ending removed)."""
    if not quotes or b'"' not in record:
        return record.split(delim)
    fields: list[bytes] = []
    i, n, step = 0, len(record), len(delim)
    while True:
        if i < n and record[i] == 34:  # a quoted field
            value = bytearray()
            j = i + 1
            while True:
                k = record.find(b'"', j)
                if k < 0:
                    raise InvalidArgumentError(
                        "Reached end of file without closing quoted field in record")
                value += record[j:k]
                if record[k + 1:k + 2] == b'"':
                    value += b'"'
                    j = k + 2
                    continue
                i = k + 1
                break
            if i < n and record[i:i + step] != delim:
                raise InvalidArgumentError(
                    "Quote inside a string has to be escaped by another quote")
            fields.append(bytes(value))
        else:
            k = record.find(delim, i)
            end = n if k < 0 else k
            field = record[i:end]
            if b'"' in field:
                raise InvalidArgumentError("Unquoted fields cannot have quotes inside")
            fields.append(field)
            i = end
        if i >= n:
            return fields
        i += step
        if i == n:
            fields.append(b"")
            return fields


def _open_quote(text: bytes, delim: bytes) -> bool:
    """Whether ``text`` ends inside a quoted field (one that starts with a quote)."""
    i, n = 0, len(text)
    while i < n:
        if text[i] == 34:
            j = i + 1
            while True:
                k = text.find(b'"', j)
                if k < 0:
                    return True
                if text[k + 1:k + 2] == b'"':
                    j = k + 2
                    continue
                break
            i = k + 1
        k = text.find(delim, i)
        if k < 0:
            return False
        i = k + 1
    return False


def read_records(path: str, compression_type: str | None, offset: int,
                 quotes: bool, delim: bytes = b",") -> Iterator[tuple[bytes, int]]:
    """``(record, offset after it)`` from ``offset`` on; a quoted field may span lines."""
    with open_stream(path, compression_type, offset) as stream:
        parts: list[bytes] = []
        for line in stream:
            offset += len(line)
            parts.append(line)
            if quotes and b'"' in line and _open_quote(b"".join(parts), delim):
                continue
            record = b"".join(parts)
            parts = []
            yield _strip_line_end(record), offset
        if parts:
            raise InvalidArgumentError(
                "Reached end of file without closing quoted field in record")


def _strip_line_end(record: bytes) -> bytes:
    if record.endswith(b"\r\n"):
        return record[:-2]
    return record[:-1] if record.endswith(b"\n") else record


class CsvOp(FileReaderOp):
    """The parsed records of each file (a tuple of one scalar per selected column)."""

    def __init__(self, files: Sequence[bytes | str], compression_type: str | None,
                 columns: list[Column], header: bool, delim: bytes, quotes: bool,
                 na_value: bytes, select_cols: list[int] | None,
                 exclude_cols: list[int] | None) -> None:
        super().__init__(files, compression_type)
        self.columns = columns
        self.header = header
        self.delim = delim
        self.quotes = quotes
        self.na_value = na_value
        self.select_cols = select_cols
        self.exclude_cols = set(exclude_cols or ())

    def read(self, path: str, offset: int) -> Iterator[tuple[Any, int]]:
        for element, end in self.outcomes(path, offset):
            if isinstance(element, InvalidArgumentError):
                raise element
            yield element, end

    def outcomes(self, path: str, offset: int) -> Iterator[tuple[Any, int]]:
        """``(element or the error parsing it, offset after it)``; offset -1 when nothing
        more can be read from the file."""
        records = read_records(path, self.compression_type, offset, self.quotes, self.delim)
        if self.header and offset == 0:
            first = next(records, None)
            if first is None:
                yield InvalidArgumentError(f"Can't read header of file {path}"), -1
                return
        number = 0
        while True:
            try:
                item = next(records, None)
            except InvalidArgumentError as error:  # an unclosed quote ends the file
                yield error, -1
                return
            if item is None:
                return
            record, end = item
            try:
                yield self.parse(record, number), end
            except InvalidArgumentError as error:
                yield error, end
            number += 1

    def parse(self, record: bytes, number: int) -> tuple[Any, ...]:
        fields = split_record(record, self.delim, self.quotes)
        wanted = len(self.columns)
        if self.select_cols is not None:
            chosen = [fields[i] for i in self.select_cols if i < len(fields)]
            if len(chosen) < wanted:
                raise InvalidArgumentError(
                    f"Expect {wanted} fields but have {len(chosen)} in record")
        elif self.exclude_cols:
            chosen = [f for i, f in enumerate(fields) if i not in self.exclude_cols]
        else:
            chosen = fields
        if len(chosen) > wanted:
            raise InvalidArgumentError(f"Expect {wanted} fields but have more in record")
        if len(chosen) < wanted:
            raise InvalidArgumentError(
                f"Expect {wanted} fields but have {len(chosen)} in record")
        return tuple(column.convert(field, self.na_value, i, number)
                     for i, (column, field) in enumerate(zip(self.columns, chosen)))

    def iterator(self, state: Any, key: int) -> Node:
        file, offset = state if state is not None else (0, 0)
        return _CsvNode(self, file, offset)

    def static_spec(self) -> Any:
        return tuple(nest.TensorSpec((), c.dtype) for c in self.columns)


class _CsvNode(Node):
    """Like the other file readers' node, except that a record that fails to parse is
    consumed before its error is raised (an unclosed quote consumes the rest of the file)."""

    __slots__ = ("file", "offset")

    def __init__(self, op: CsvOp, file: int, offset: int) -> None:
        self.file = file
        self.offset = offset
        self.gen = self._run(op)

    def _run(self, op: CsvOp) -> Iterator[Any]:
        files = op.files
        while self.file < len(files):
            for element, offset in op.outcomes(files[self.file], self.offset):
                if offset < 0:  # nothing more can be read from this file
                    self.file, self.offset = self.file + 1, 0
                    raise element
                self.offset = offset
                if isinstance(element, InvalidArgumentError):
                    raise element
                yield element
            self.file += 1
            self.offset = 0

    def state_dict(self) -> Any:
        return (self.file, self.offset)


def csv_op(filenames: list[str], record_defaults: Sequence[Any], compression_type: Any,
           header: bool, field_delim: str, use_quote_delim: bool, na_value: str,
           select_cols: Sequence[int] | None, exclude_cols: Sequence[int] | None) -> CsvOp:
    """A checked :class:`CsvOp` for CsvDataset's arguments."""
    if compression_type not in (None, "", "GZIP", "ZLIB"):
        raise InvalidArgumentError(
            f"compression_type must be one of None, '', 'GZIP', 'ZLIB', got {compression_type!r}")
    if select_cols and exclude_cols:
        raise InvalidArgumentError("Either select_cols or exclude_cols should be empty")
    columns = [column_from_default(entry) for entry in record_defaults]
    if not columns:
        raise InvalidArgumentError("record_defaults must name at least one column")
    select = None
    if select_cols is not None:
        select = [int(c) for c in select_cols]
        if any(c < 0 for c in select) or any(a >= b for a, b in zip(select, select[1:])):
            raise InvalidArgumentError(
                f"select_cols must be non-negative and strictly increasing, got {select}")
        if len(select) != len(columns):
            raise InvalidArgumentError(
                f"Expect {len(select)} fields but have {len(columns)} record_defaults: "
                "select_cols and record_defaults must have the same length")
    if not isinstance(field_delim, (str, bytes)) or len(field_delim) != 1:
        raise InvalidArgumentError(f"field_delim must be one character, got {field_delim!r}")
    delim = field_delim.encode() if isinstance(field_delim, str) else field_delim
    na = na_value.encode() if isinstance(na_value, str) else bytes(na_value)
    return CsvOp(filenames, compression_type, columns, bool(header), delim,
                 bool(use_quote_delim), na, select,
                 None if exclude_cols is None else [int(c) for c in exclude_cols])


# ----- make_csv_dataset ------------------------------------------------------------------------

def file_names(file_pattern: Any) -> list[str]:
    """The files matching a pattern or list of patterns, sorted."""
    patterns = [file_pattern] if isinstance(file_pattern, (str, bytes, os.PathLike)) \
        else list(file_pattern)
    names = sorted({name for p in patterns for name in _fs.glob(os.fsdecode(p))})
    if not names:
        raise NotFoundError(f"No files match `file_pattern` {file_pattern}.")
    return names


def header_names(path: str, delim: str, quotes: bool, compression_type: Any) -> list[str]:
    for record, _ in read_records(path, compression_type or None, 0, quotes,
                                  delim.encode()):
        return [f.decode() for f in split_record(record, delim.encode(), quotes)]
    raise InvalidArgumentError(f"Can't read header of file {path}")


_INFERENCE: list[np.dtype] = [np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32),
              np.dtype(np.float64), _STRING]


def _fits(field: bytes, dtype: np.dtype) -> bool:
    try:
        if dtype.kind == "i":
            info = np.iinfo(dtype)
            return info.min <= int(field.strip()) <= info.max
        if dtype == _STRING:
            return True
        value = float(field)
        return dtype == np.float64 or not np.isinf(np.float32(value)) or np.isinf(value)
    except ValueError:
        return False


def infer_defaults(files: list[str], num_columns: int, delim: str, quotes: bool,
                   na_value: str, header: bool, rows: int, select: list[int] | None,
                   compression_type: Any) -> list[list[Any]]:
    """Per column, the narrowest of int32, int64, float32, float64, string that holds the
    first ``rows`` values (empty and NA values aside), with a zero (or empty) default."""
    kinds = [0] * num_columns
    seen = 0
    for path in files:
        records = read_records(path, compression_type or None, 0, quotes, delim.encode())
        if header:
            next(records, None)
        for record, _ in records:
            if seen >= rows:
                break
            fields = split_record(record, delim.encode(), quotes)
            if select is not None:
                fields = [fields[i] for i in select if i < len(fields)]
            for i, field in enumerate(fields[:num_columns]):
                if field in (b"", na_value.encode()):
                    continue
                while not _fits(field, _INFERENCE[kinds[i]]):
                    kinds[i] += 1
            seen += 1
        if seen >= rows:
            break
    return [[b""] if _INFERENCE[k] == _STRING else [_INFERENCE[k].type(0)] for k in kinds]
