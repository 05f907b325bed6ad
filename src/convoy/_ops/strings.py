"""String ops, as ``tf.strings`` names them, on numpy arrays of ``bytes``.

The docs are in :mod:`convoy.strings`, the public face.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from convoy._ops.array import convert_to_tensor
from convoy._values.tensors import RaggedTensor
from convoy.errors import InvalidArgumentError

__all__ = ["join", "length", "lower", "reduce_join", "regex_replace", "split", "strip",
           "substr", "to_hash_bucket_fast", "to_number", "unicode_decode", "upper"]

_STRING = np.dtype(object)
_ASCII_SPACE = b" \t\n\v\f\r"
_len = len  # substr's argument `len` hides the builtin


def _strings(value: Any, argument: str) -> np.ndarray:
    array = convert_to_tensor(value, name=argument)
    if array.dtype != _STRING:
        raise InvalidArgumentError(f"{argument} must hold strings, got dtype {array.dtype}")
    return array


def _result(array: np.ndarray) -> Any:
    """``array``, or its one value for a 0-d array."""
    return array[()] if array.ndim == 0 else array


def _map(value: Any, argument: str, fn: Callable[[bytes], Any], dtype: Any = object) -> Any:
    """``fn`` of each string of ``value``, in ``value``'s shape."""
    array = _strings(value, argument)
    out = np.empty(array.shape, dtype=dtype)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat[i] = fn(item)
    return _result(out)


def _ragged(array: np.ndarray, fn: Callable[[bytes], list[Any]], dtype: Any) -> Any:
    """A row of ``fn(item)`` for each string: a 1-D array for a scalar, else a RaggedTensor
    with one more (ragged) dimension than ``array``."""
    rows = [fn(item) for item in array.reshape(-1)]
    if array.ndim == 0:
        return np.array(rows[0], dtype=dtype)
    flat = np.array([v for row in rows for v in row], dtype=dtype)
    result: Any = RaggedTensor.from_row_lengths(flat, [len(row) for row in rows])
    for size in reversed(array.shape[1:]):
        result = RaggedTensor.from_row_splits(result, np.arange(0, result.nrows() + 1, size))
    return result


def split(input: Any, sep: Any = None, maxsplit: int = -1) -> Any:
    """Each string cut at ``sep`` (keeping empty pieces: an empty string gives one), or with
    no ``sep`` at runs of ASCII whitespace (dropping empty pieces); at most ``maxsplit`` cuts
    if it is >= 0."""
    array = _strings(input, "input")
    if sep is not None:
        sep = sep.encode() if isinstance(sep, str) else bytes(sep)
    if sep == b"":
        raise InvalidArgumentError("sep must not be empty (use None to split on whitespace)")

    def pieces(item: bytes) -> list[bytes]:
        if sep is None:
            return item.split(None, maxsplit)
        return item.split(sep, maxsplit)

    return _ragged(array, pieces, object)


_NUMBER = re.compile(rb"\s*[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf|infinity|nan)"
                     rb"\s*", re.IGNORECASE)
_INTEGER = re.compile(rb"\s*[-+]?\d+\s*")


def to_number(string_tensor: Any, out_type: Any = np.float32) -> Any:
    """Each string parsed as a number of ``out_type`` (float32, float64, int32 or int64); a
    string that is not one, or an integer out of range, is an error naming it."""
    dtype = np.dtype(out_type)
    if dtype not in (np.float32, np.float64, np.int32, np.int64):
        raise InvalidArgumentError(f"out_type must be float32, float64, int32 or int64, got "
                                   f"{dtype}")
    integer = dtype.kind == "i"
    limits = np.iinfo(dtype) if integer else None

    def parse(item: bytes) -> Any:
        if not (_INTEGER if integer else _NUMBER).fullmatch(item):
            raise InvalidArgumentError(f"StringToNumberOp could not correctly convert string: "
                                       f"{item!r}")
        if limits is not None:
            number = int(item)
            if not limits.min <= number <= limits.max:
                raise InvalidArgumentError(f"StringToNumberOp: {item!r} is out of range of "
                                           f"{dtype}")
            return number
        return float(item)

    return _map(string_tensor, "string_tensor", parse, dtype)


@lru_cache(maxsize=64)
def _pattern(pattern: bytes) -> re.Pattern[bytes]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise InvalidArgumentError(f"pattern {pattern!r} is not a valid regex: {error}") \
            from None


def _as_bytes(value: Any, argument: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value)
    raise InvalidArgumentError(f"{argument} must be str or bytes, got {type(value).__name__}")


def regex_replace(input: Any, pattern: Any, rewrite: Any, replace_global: bool = True) -> Any:
    """Each string with the matches of ``pattern`` (Python's ``re``, close to RE2 for the
    patterns pipelines use) replaced by ``rewrite`` (``\\1`` for a group, ``\\0`` for the
    match); only the first match unless ``replace_global``."""
    regex = _pattern(_as_bytes(pattern, "pattern"))
    template = re.sub(rb"\\0", rb"\\g<0>", _as_bytes(rewrite, "rewrite"))
    count = 0 if replace_global else 1
    return _map(input, "input", lambda item: regex.sub(template, item, count=count))


def _unicode(encoding: str) -> bool:
    if encoding not in ("", "utf-8", "UTF-8"):
        raise InvalidArgumentError(f"encoding must be '' or 'utf-8', got {encoding!r}")
    return bool(encoding)


def lower(input: Any, encoding: str = "") -> Any:
    """Each string in lower case: ASCII letters only, or every letter with ``encoding="utf-8"``."""
    if _unicode(encoding):
        return _map(input, "input", lambda item: item.decode("utf-8").lower().encode("utf-8"))
    return _map(input, "input", bytes.lower)


def upper(input: Any, encoding: str = "") -> Any:
    """Each string in upper case: ASCII letters only, or every letter with ``encoding="utf-8"``."""
    if _unicode(encoding):
        return _map(input, "input", lambda item: item.decode("utf-8").upper().encode("utf-8"))
    return _map(input, "input", bytes.upper)


def strip(input: Any) -> Any:
    """Each string without leading and trailing ASCII whitespace."""
    return _map(input, "input", lambda item: item.strip(_ASCII_SPACE))


def _units(unit: str) -> bool:
    if unit not in ("BYTE", "UTF8_CHAR"):
        raise InvalidArgumentError(f"unit must be 'BYTE' or 'UTF8_CHAR', got {unit!r}")
    return unit == "UTF8_CHAR"


def length(input: Any, unit: str = "BYTE") -> Any:
    """int32: each string's length in bytes, or in UTF-8 characters (``unit="UTF8_CHAR"``)."""
    if _units(unit):
        return _map(input, "input", lambda item: len(item.decode("utf-8", "replace")),
                    np.int32)
    return _map(input, "input", len, np.int32)


def substr(input: Any, pos: Any, len: Any, unit: str = "BYTE") -> Any:
    """Each string's ``len`` bytes (or UTF-8 characters) from ``pos`` (negative counts from
    the end; ``pos`` and ``len`` broadcast against ``input``); a ``pos`` past the end is an
    error, a ``len`` past it stops at the end."""
    chars = _units(unit)
    array = _strings(input, "input")
    starts, sizes = np.asarray(pos), np.asarray(len)
    if starts.dtype.kind not in "iu" or sizes.dtype.kind not in "iu":
        raise InvalidArgumentError("pos and len must hold integers")
    array, starts, sizes = np.broadcast_arrays(array, starts, sizes)
    out = np.empty(array.shape, dtype=object)
    for index in np.ndindex(array.shape):
        item = bytes(array[index])
        text: Any = item.decode("utf-8") if chars else item
        start, size, n = int(starts[index]), int(sizes[index]), _len(text)
        if start < 0:
            start += n
        if not 0 <= start <= n:
            raise InvalidArgumentError(f"pos {int(starts[index])} out of range for string of "
                                       f"length {n}: {item!r}")
        piece = text[start:start + max(size, 0)]
        out[index] = piece.encode("utf-8") if chars else piece
    return _result(out)


def join(inputs: Sequence[Any], separator: Any = "") -> Any:
    """The strings of ``inputs`` (tensors that broadcast together) joined element by element
    with ``separator``."""
    arrays = [_strings(v, "inputs") for v in inputs]
    if not arrays:
        raise InvalidArgumentError("inputs must hold at least one tensor")
    sep = _as_bytes(separator, "separator")
    try:
        parts = np.broadcast_arrays(*arrays)
    except ValueError as error:
        raise InvalidArgumentError(f"join: {error}") from None
    out = np.empty(parts[0].shape, dtype=object)
    for index in np.ndindex(out.shape):
        out[index] = sep.join(bytes(p[index]) for p in parts)
    return _result(out)


def reduce_join(inputs: Any, axis: Any = None, keepdims: bool = False,
                separator: Any = "") -> Any:
    """The strings of ``inputs`` joined with ``separator`` along ``axis`` (every axis if
    None), in order."""
    array = _strings(inputs, "inputs")
    sep = _as_bytes(separator, "separator")
    axes = tuple(range(array.ndim)) if axis is None else \
        tuple(int(a) % max(array.ndim, 1) for a in np.atleast_1d(axis))
    kept = [d for d in range(array.ndim) if d not in axes]
    moved = np.transpose(array, kept + list(axes))
    outer = moved.shape[:len(kept)]
    rows = moved.reshape(*outer, -1) if outer else moved.reshape(1, -1)
    out = np.empty(outer, dtype=object)
    for index in np.ndindex(outer):
        out[index] = sep.join(rows[index] if outer else rows[0])
    if keepdims:
        out = out.reshape([1 if d in axes else s for d, s in enumerate(array.shape)])
    return _result(out)


def unicode_decode(input: Any, input_encoding: str, errors: str = "replace",
                   replacement_char: int = 0xFFFD,
                   replace_control_characters: bool = False) -> Any:
    """int32 code points of each string (UTF-8, UTF-16-BE or UTF-32-BE): a 1-D array for a
    scalar, else a RaggedTensor with one row per string. Bad bytes are ``replacement_char``
    (``errors="replace"``), skipped (``"ignore"``) or an error (``"strict"``), and so are
    C0 control characters with ``replace_control_characters``."""
    codecs = {"UTF-8": "utf-8", "UTF-16-BE": "utf-16-be", "UTF-32-BE": "utf-32-be"}
    codec = codecs.get(input_encoding.upper())
    if codec is None:
        raise InvalidArgumentError(f"input_encoding must be one of {sorted(codecs)}, got "
                                   f"{input_encoding!r}")
    if errors not in ("replace", "ignore", "strict"):
        raise InvalidArgumentError(f"errors must be 'replace', 'ignore' or 'strict', got "
                                   f"{errors!r}")

    def points(item: bytes) -> list[int]:
        try:
            text = item.decode(codec, "strict" if errors == "strict" else
                               "ignore" if errors == "ignore" else "replace")
        except UnicodeDecodeError as error:
            raise InvalidArgumentError(f"invalid {input_encoding} in {item!r}: {error}") \
                from None
        out = [replacement_char if ch == "\ufffd" else ord(ch) for ch in text]
        if replace_control_characters:  # C0 controls count as errors
            if errors == "strict" and any(c < 0x20 for c in out):
                raise InvalidArgumentError(f"control character in {item!r}")
            out = [c for c in out if c >= 0x20] if errors == "ignore" else \
                [replacement_char if c < 0x20 else c for c in out]
        return out

    return _ragged(_strings(input, "input"), points, np.int32)


def to_hash_bucket_fast(input: Any, num_buckets: int) -> Any:
    """int64: each string's FarmHash Fingerprint64 modulo ``num_buckets``, the buckets
    TensorFlow gives (stable across runs and machines)."""
    import farmhash

    if int(num_buckets) < 1:
        raise InvalidArgumentError(f"num_buckets must be >= 1, got {num_buckets}")
    buckets = int(num_buckets)
    return _map(input, "input", lambda item: farmhash.fingerprint64(item) % buckets, np.int64)
