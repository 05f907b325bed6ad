"""decode_raw and decode_csv, as in ``tf.io``."""

from __future__ import annotations

from typing import Any

import numpy as np

from convoy.errors import InvalidArgumentError


def decode_raw(input_bytes: Any, out_type: Any, little_endian: bool = True,
               fixed_length: int | None = None, name: str | None = None) -> np.ndarray:
    """The bytes of each string reinterpreted as an array of ``out_type``: shape
    ``input.shape + [n]``. All strings must have the same length, a multiple of the type's
    size, unless ``fixed_length`` is given: then each is cut or zero-padded to that many
    bytes."""
    dtype = np.dtype(out_type)
    if dtype.kind not in "iufcb" or dtype.itemsize == 0:
        raise InvalidArgumentError(f"out_type must be a numeric numpy dtype, got {out_type!r}")
    dtype = dtype.newbyteorder("<" if little_endian else ">")
    single = isinstance(input_bytes, (bytes, np.bytes_))
    strings = np.empty((), object) if single else np.asarray(input_bytes, dtype=object)
    if single:
        strings[()] = bytes(input_bytes)
    flat = [bytes(s) if not isinstance(s, str) else s.encode() for s in strings.reshape(-1)]
    if fixed_length is not None:
        if fixed_length % dtype.itemsize:
            raise InvalidArgumentError(
                f"fixed_length ({fixed_length}) must be a multiple of the size of out_type "
                f"({dtype.itemsize})"
            )
        flat = [s[:fixed_length].ljust(fixed_length, b"\0") for s in flat]
        width = fixed_length
    else:
        width = len(flat[0]) if flat else 0
        for index, s in enumerate(flat):
            if len(s) != width:
                raise InvalidArgumentError(
                    f"DecodeRaw requires input strings to all be the same size, but element "
                    f"{index} has size {len(s)} != {width}"
                )
        if width % dtype.itemsize:
            raise InvalidArgumentError(
                f"Input to DecodeRaw has length {width} that is not a multiple of "
                f"{dtype.itemsize}, the size of {np.dtype(out_type).name}"
            )
    values = np.frombuffer(b"".join(flat), dtype=dtype).astype(dtype.newbyteorder("="))
    return values.reshape((*strings.shape, width // dtype.itemsize))


def decode_csv(records: Any, record_defaults: Any, field_delim: str = ",",
               use_quote_delim: bool = True, na_value: str = "",
               select_cols: Any = None, name: str | None = None) -> list[np.ndarray]:
    """The columns of CSV ``records`` (strings or bytes, any shape), one array per entry of
    ``record_defaults``, each shaped like ``records``. A default is a one-element list (its
    value fills empty or ``na_value`` fields; its dtype is the column's) or an empty list or
    array of a dtype (the column is required). ``select_cols`` picks columns (sorted
    indices); with ``use_quote_delim`` a field in double quotes may hold the delimiter and
    ``""`` for a quote."""
    if not isinstance(field_delim, str) or len(field_delim) != 1:
        raise InvalidArgumentError(f"field_delim must be one character, got {field_delim!r}")
    columns = [_column_default(default, index) for index, default in enumerate(record_defaults)]
    if select_cols is not None:
        select = [int(c) for c in select_cols]
        if any(c < 0 for c in select):
            raise InvalidArgumentError("select_cols contains negative values.")
        if any(b <= a for a, b in zip(select, select[1:])):
            raise InvalidArgumentError("select_cols is not strictly increasing.")
        if len(select) != len(columns):
            raise InvalidArgumentError(
                f"Length of select_cols and record_defaults do not match. ({len(select)} vs "
                f"{len(columns)})"
            )
    else:
        select = list(range(len(columns)))
    strings = np.asarray(records, dtype=object)
    flat = strings.reshape(-1)
    out = [np.empty(flat.shape, dtype) for dtype, _ in columns]
    for row, record in enumerate(flat.tolist()):
        text = record.decode() if isinstance(record, bytes) else str(record)
        fields = _split(text, field_delim, use_quote_delim)
        if select_cols is None and len(fields) != len(columns):
            raise InvalidArgumentError(
                f"Expect {len(columns)} fields but have {len(fields)} in record {row}"
            )
        if select and select[-1] >= len(fields):
            found = sum(column < len(fields) for column in select)
            raise InvalidArgumentError(
                f"Expect {len(columns)} fields but have {found} in record {row}"
            )
        for index, (column, (dtype, default)) in enumerate(zip(select, columns)):
            out[index][row] = _field(fields[column], dtype, default, na_value, row, index)
    return [column.reshape(strings.shape) for column in out]


def _column_default(default: Any, index: int) -> tuple[np.dtype, Any]:
    if np.ndim(default) > 1:
        raise InvalidArgumentError(
            f"record_defaults[{index}]: Each record default should be at most rank 1"
        )
    if isinstance(default, np.ndarray):
        values, dtype = default.reshape(-1).tolist(), default.dtype
    else:
        values = list(default) if isinstance(default, (list, tuple)) else [default]
        dtype = None
    if len(values) > 1:
        raise InvalidArgumentError(
            f"record_defaults[{index}] must have at most one element, got {len(values)}"
        )
    if isinstance(default, np.generic):
        values, dtype = [default.item()], default.dtype
    if dtype is None or dtype.kind in "SUO":
        sample = values[0] if values else None
        if isinstance(sample, (bytes, str)) or (dtype is not None and dtype.kind in "SUO"):
            dtype = np.dtype(object)
        elif isinstance(sample, (bool, np.bool_)):
            raise InvalidArgumentError(f"record_defaults[{index}]: bool columns are not "
                                       f"supported")
        elif isinstance(sample, (int, np.integer)):
            dtype = np.dtype(np.int32) if not isinstance(sample, np.integer) else \
                np.asarray(sample).dtype
        elif isinstance(sample, (float, np.floating)):
            dtype = np.dtype(np.float32) if not isinstance(sample, np.floating) else \
                np.asarray(sample).dtype
        else:
            raise InvalidArgumentError(
                f"record_defaults[{index}] must be a one-element list or an empty array of a "
                f"dtype, got {default!r}"
            )
    value = values[0] if values else None
    if value is not None and dtype.kind == "O":
        value = value.encode() if isinstance(value, str) else bytes(value)
    return np.dtype(dtype), value


def _split(text: str, delim: str, quoted: bool) -> list[str]:
    if not quoted:
        return text.split(delim)
    fields: list[str] = []
    position, size = 0, len(text)
    while True:
        if position < size and text[position] == '"':
            chars: list[str] = []
            position += 1
            while True:
                if position >= size:
                    raise InvalidArgumentError(
                        f"Quoted field has to end with quote followed by delim or end: {text!r}"
                    )
                if text[position] == '"':
                    if position + 1 < size and text[position + 1] == '"':
                        chars.append('"')
                        position += 2
                        continue
                    position += 1
                    break
                chars.append(text[position])
                position += 1
            if position < size and text[position] != delim:
                raise InvalidArgumentError(
                    f"Quoted field has to end with quote followed by delim or end: {text!r}"
                )
            fields.append("".join(chars))
        else:
            end = text.find(delim, position)
            end = size if end < 0 else end
            field = text[position:end]
            if '"' in field:
                raise InvalidArgumentError(
                    f"Unquoted fields cannot have quotes/CRLFs inside: {text!r}"
                )
            fields.append(field)
            position = end
        if position >= size:
            return fields
        position += 1  # the delimiter
        if position == size:
            fields.append("")
            return fields


def _field(text: str, dtype: np.dtype, default: Any, na_value: str, row: int,
           column: int) -> Any:
    if text == "" or (na_value and text == na_value):
        if default is None:
            raise InvalidArgumentError(
                f"Field {column} is required but missing in record {row}!"
            )
        return default
    if dtype.kind == "O":
        return text.encode()
    try:
        if dtype.kind in "iu":
            value = int(text.strip(), 10)
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                raise ValueError
            return value
        return float(text)
    except ValueError:
        raise InvalidArgumentError(
            f"Field {column} in record {row} is not a valid "
            f"{_TYPE_NAMES.get(dtype.name, dtype.name)}: {text}"
        ) from None


_TYPE_NAMES = {"float32": "float", "float64": "double"}
