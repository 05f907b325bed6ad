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
    raise NotImplementedError
