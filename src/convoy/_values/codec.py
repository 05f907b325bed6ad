"""The one codec: many elements (nested structures of arrays) in one ``bytes`` message.

The docs are in :mod:`convoy.codec`, the public face.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
import zlib
from typing import Any

import lz4.frame
import numpy as np

from convoy.errors import DataLossError, InvalidArgumentError

__all__ = ["COMPRESSIONS", "Encoder", "decode", "validate_compression"]

_MAGIC = b"CVC"
_VERSION = 1
_FIXED = struct.Struct("<3sBBIQQ")
_ENTRY = struct.Struct("<BQQ")
_CRC = struct.Struct("<I")
_COMPRESSED = 0x01  # flags bit 0, in the fixed header (in-band part) and in each entry
_ALIGN = 64  # out-of-band buffers start at multiples of this from the message start
_PADDING = [bytes(n) for n in range(_ALIGN)]

#: Buffers smaller than this stay inside the pickle stream (an entry and padding cost more).
_OUT_OF_BAND_MIN = 1024
#: Parts (buffers, or the in-band pickle stream) smaller than this are never compressed.
_COMPRESS_MIN = 64 * 1024
#: "AUTO" compresses a sample of this many bytes from the middle of a part first.
_SAMPLE = 64 * 1024
#: "AUTO" keeps a compressed part only if compressed/original is at most this.
_AUTO_RATIO = 0.8
#: After an encode in which nothing compressed well, "AUTO" skips this many encodes.
_AUTO_BACKOFF = 64
#: LZ4 cannot expand data by more than ~255x; decompressed sizes above this are corrupt.
_LZ4_MAX_RATIO = 256
_LZ4_SLACK = 1024
_LZ4_BLOCK_SIZE = lz4.frame.BLOCKSIZE_MAX1MB

#: The compressions an encoder can be asked for (besides None: never compress).
COMPRESSIONS = ("AUTO", "LZ4")


def validate_compression(compression: str | None) -> str | None:
    """The canonical form of a ``compression`` argument: ``"AUTO"``, ``"LZ4"`` or ``None``.

    Accepts ``None`` (never compress) and the strings ``"AUTO"`` and ``"LZ4"`` in any case;
    raises :class:`~convoy.errors.InvalidArgumentError` for anything else.
    """
    if compression is None:
        return None
    if isinstance(compression, str):
        canonical = compression.upper()
        if canonical in COMPRESSIONS:
            return canonical
    raise InvalidArgumentError(
        "compression must be None, 'AUTO' or 'LZ4' (case-insensitive), "
        f"got {compression!r} ({type(compression).__name__})"
    )


def _compress(data: Any) -> bytes:
    return lz4.frame.compress(data, block_size=_LZ4_BLOCK_SIZE)


class Encoder:
    """Encodes lists of dataset elements into single ``bytes`` messages for :func:`decode`.

    ``compression`` is ``None`` (never compress), ``"LZ4"`` (LZ4-compress every out-of-band
    buffer of at least 64 KiB, and the pickle stream when it is that large, keeping the
    compressed form whenever it is smaller) or ``"AUTO"`` (the default: compress only what
    pays). ``"AUTO"`` first compresses a 64 KiB sample of each large part and compresses the
    whole part only if the sample shrank to at most 80%; when nothing in an encode compressed
    that well it stops trying for the next 64 encodes that have large parts, then samples
    again. So incompressible data (e.g. random-looking images) costs one small sample every
    65 encodes, and compressible data (zeros, masks, repeated rows) is compressed.

    An encoder keeps only that sampling state, so use one per stream of similar elements. It
    may be shared between threads: a race only perturbs the heuristic, never a message.
    """

    __slots__ = ("_compression", "_skip")

    def __init__(self, compression: str | None = "AUTO") -> None:
        self._compression = validate_compression(compression)
        self._skip = 0

    @property
    def compression(self) -> str | None:
        """The canonical compression mode: ``"AUTO"``, ``"LZ4"`` or ``None``."""
        return self._compression

    def __repr__(self) -> str:
        return f"Encoder(compression={self._compression!r})"

    def encode(self, elements: list[Any]) -> bytes:
        """One message holding ``elements`` (a list; a tuple is encoded as a list).

        The arrays' memory is copied once, into the returned ``bytes``. Raises
        :class:`~convoy.errors.InvalidArgumentError` if ``elements`` is not a list or
        something in it cannot be pickled.
        """
        return b"".join(self.encode_parts(elements))

    def encode_parts(self, elements: list[Any]) -> list[Any]:
        """The message of :meth:`encode` as the consecutive pieces (bytes-like) it joins, for
        a writer that copies them elsewhere itself; the arrays' buffers are not copied. Valid
        while the elements are not changed."""
        if type(elements) is not list:
            if not isinstance(elements, list | tuple):
                raise InvalidArgumentError(
                    f"elements must be a list, got {type(elements).__name__}"
                )
            elements = list(elements)

        buffers: list[memoryview] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            try:
                view = buffer.raw()
            except BufferError:  # not contiguous: let pickle keep (or refuse) it in band
                return True
            if view.nbytes < _OUT_OF_BAND_MIN:
                return True
            buffers.append(view)
            return False

        try:
            stream = io.BytesIO()
            pickler = pickle.Pickler(stream, protocol=5, buffer_callback=out_of_band)
            pickler.dispatch_table = _DISPATCH
            pickler.dump(elements)
            inband = stream.getvalue()
        except Exception as error:
            raise InvalidArgumentError(
                f"elements must be picklable with the standard pickle module: "
                f"{type(error).__name__}: {error}"
            ) from error

        mode = self._compression
        inband_raw_len = len(inband)
        flags = 0
        stored: list[Any] = buffers
        compressed: list[bool] | None = None
        if mode is not None:
            big = [i for i, b in enumerate(buffers) if b.nbytes >= _COMPRESS_MIN]
            big_inband = inband_raw_len >= _COMPRESS_MIN
            if big or big_inband:
                pick = self._compress_lz4 if mode == "LZ4" else self._compress_auto
                if big_inband:
                    big.append(-1)
                parts = [inband if i < 0 else buffers[i] for i in big]
                results = pick(parts)
                if results is not None:
                    stored = list(buffers)
                    compressed = [False] * len(buffers)
                    for i, result in zip(big, results, strict=True):
                        if result is None:
                            continue
                        if i < 0:
                            inband = result
                            flags |= _COMPRESSED
                        else:
                            stored[i] = result
                            compressed[i] = True

        header = [_FIXED.pack(_MAGIC, _VERSION, flags, len(buffers), len(inband),
                              inband_raw_len)]
        for i, buffer in enumerate(buffers):
            part = stored[i]
            if compressed is not None and compressed[i]:
                header.append(_ENTRY.pack(_COMPRESSED, len(part), buffer.nbytes))
            else:
                header.append(_ENTRY.pack(0, buffer.nbytes, buffer.nbytes))
        head = header[0] if len(header) == 1 else b"".join(header)
        crc = zlib.crc32(inband, zlib.crc32(head))
        pieces: list[Any] = [head, _CRC.pack(crc), inband]
        position = len(head) + _CRC.size + len(inband)
        for part in stored:
            pad = -position % _ALIGN
            if pad:
                pieces.append(_PADDING[pad])
            pieces.append(part)
            position += pad + (part.nbytes if isinstance(part, memoryview) else len(part))
        return pieces

    def _compress_lz4(self, parts: list[Any]) -> list[bytes | None]:
        results: list[bytes | None] = []
        for part in parts:
            packed = _compress(part)
            results.append(packed if len(packed) < _nbytes(part) else None)
        return results

    def _compress_auto(self, parts: list[Any]) -> list[bytes | None] | None:
        if self._skip > 0:
            self._skip -= 1
            return None
        results: list[bytes | None] = []
        paid = False
        for part in parts:
            size = _nbytes(part)
            if size <= _SAMPLE:
                sample = part
            else:
                start = (size - _SAMPLE) // 2
                sample = memoryview(part)[start:start + _SAMPLE]
            packed = _compress(sample)
            if len(packed) > _AUTO_RATIO * _nbytes(sample):
                results.append(None)
                continue
            if sample is not part:
                packed = _compress(part)
            if len(packed) <= _AUTO_RATIO * size:
                results.append(packed)
                paid = True
            else:
                results.append(None)
        if not paid:
            self._skip = _AUTO_BACKOFF
        return results


def _array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array of :func:`_reduce_array` again: a view on ``buffer`` (writable if it is)."""
    return np.frombuffer(buffer, dtype).reshape(shape)


def _reduce_array(array: np.ndarray) -> Any:
    """A contiguous array of numbers as its buffer, dtype string and shape: the same result
    as numpy's own reduction, at a fraction of its cost (numpy pickles the dtype as an
    object of its own, which costs more than a small array's data)."""
    if not array.flags.c_contiguous or array.dtype.kind not in "biufc":
        return array.__reduce_ex__(5)
    buffer = pickle.PickleBuffer(array)  # type: ignore[arg-type]  # numpy's stubs: no Buffer
    return _array, (buffer, array.dtype.str, array.shape)


_DISPATCH = {**copyreg.dispatch_table, np.ndarray: _reduce_array}


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _decompress(data: bytes | memoryview, raw_len: int, what: str) -> bytes:
    if raw_len > _LZ4_MAX_RATIO * len(data) + _LZ4_SLACK:
        raise DataLossError(
            f"corrupt message: {what} claims to decompress {len(data)} bytes into {raw_len}"
        )
    try:
        info = lz4.frame.get_frame_info(data)
        if info["content_size"] != raw_len:
            raise DataLossError(
                f"corrupt message: {what} is an LZ4 frame of {info['content_size']} bytes, "
                f"the header says {raw_len}"
            )
        result, used = lz4.frame.decompress(data, return_bytes_read=True)
    except DataLossError:
        raise
    except Exception as error:
        raise DataLossError(
            f"corrupt message: {what} does not decompress ({type(error).__name__}: {error})"
        ) from error
    if used != len(data) or len(result) != raw_len:
        raise DataLossError(
            f"corrupt message: {what} decompressed {used} of {len(data)} bytes into "
            f"{len(result)} bytes, the header says {raw_len}"
        )
    return result


def decode(payload: bytes | bytearray | memoryview) -> list[Any]:
    """The list of elements in a message made by :meth:`Encoder.encode`.

    Uncompressed out-of-band buffers are not copied: arrays of at least 1 KiB come back as
    views on ``payload`` (so they keep it alive), and are **read-only** when ``payload`` is
    (``bytes``, as grpcio delivers it); copy an array (``np.array(a)``) to modify it. Arrays
    that travelled compressed are read-only views on their decompressed bytes; small arrays
    (under 1 KiB) are ordinary writable copies. Treat them all as read-only.

    Raises :class:`~convoy.errors.DataLossError` if ``payload`` is not a complete, intact
    message (truncated, corrupt header or pickle stream, unknown version, lengths that do not
    add up to the payload size), or its elements cannot be unpickled here.
    """
    try:
        view = memoryview(payload)
    except TypeError:
        raise InvalidArgumentError(
            f"payload must be bytes-like, got {type(payload).__name__}"
        ) from None
    if view.ndim != 1 or view.itemsize != 1:
        try:
            view = view.cast("B")
        except TypeError as error:
            raise InvalidArgumentError(
                f"payload must be a contiguous bytes-like object: {error}"
            ) from None
    size = view.nbytes
    if size < _FIXED.size:
        raise DataLossError(
            f"truncated message: {size} bytes, shorter than the {_FIXED.size}-byte header"
        )
    magic, version, flags, count, inband_len, inband_raw = _FIXED.unpack_from(view)
    if magic != _MAGIC:
        raise DataLossError(f"not a convoy element message: starts with {bytes(magic)!r}")
    if version != _VERSION:
        raise DataLossError(
            f"unsupported element message version {version} (this convoy reads {_VERSION})"
        )
    if flags & ~_COMPRESSED:
        raise DataLossError(f"corrupt message: unknown header flags {flags:#04x}")
    head_end = _FIXED.size + count * _ENTRY.size
    inband_start = head_end + _CRC.size
    inband_end = inband_start + inband_len
    if inband_end > size:
        raise DataLossError(
            f"truncated or corrupt message: the header ({count} buffers) and pickle stream "
            f"({inband_len} bytes) need {inband_end} bytes, the message has {size}"
        )
    (crc,) = _CRC.unpack_from(view, head_end)
    inband: bytes | memoryview = view[inband_start:inband_end]
    if zlib.crc32(inband, zlib.crc32(view[:head_end])) != crc:
        raise DataLossError("corrupt message: header or pickle stream checksum mismatch")

    buffers: list[Any] = []
    position = inband_end
    for index, (entry_flags, stored_len, raw_len) in enumerate(
        _ENTRY.iter_unpack(view[_FIXED.size:head_end])
    ):
        start = position + (-position % _ALIGN)
        position = start + stored_len
        if position > size:
            raise DataLossError(
                f"truncated message: buffer {index} of {count} ends at byte {position}, "
                f"the message has {size}"
            )
        part = view[start:position]
        if entry_flags == _COMPRESSED:
            buffers.append(_decompress(part, raw_len, f"buffer {index}"))
        elif entry_flags == 0 and raw_len == stored_len:
            buffers.append(part)
        else:
            raise DataLossError(
                f"corrupt message: buffer {index} has flags {entry_flags:#04x}, stored length "
                f"{stored_len} and raw length {raw_len}"
            )
    if position != size:
        raise DataLossError(
            f"corrupt message: its parts end at byte {position}, the message has {size} bytes"
        )

    if flags & _COMPRESSED:
        inband = _decompress(inband, inband_raw, "the pickle stream")
    elif inband_raw != inband_len:
        raise DataLossError(
            f"corrupt message: uncompressed pickle stream of {inband_len} bytes claims "
            f"{inband_raw}"
        )
    try:
        elements = pickle.loads(inband, buffers=buffers)
    except Exception as error:
        raise DataLossError(
            f"the elements in the message cannot be unpickled "
            f"({type(error).__name__}: {error})"
        ) from error
    if type(elements) is not list:
        raise DataLossError(
            f"corrupt message: it holds a {type(elements).__name__}, not a list of elements"
        )
    return elements
