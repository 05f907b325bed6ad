"""The one codec: many elements (nested structures of arrays) in one ``bytes`` message.

Workers encode a batch of elements (nested tuples, dicts, namedtuples, lists of numpy arrays,
numpy scalars and Python ints, floats, bytes, str) with :meth:`Encoder.encode`; trainers turn
the message back into the elements with :func:`decode`. grpcio sends and receives ``bytes``, so
each array is copied exactly once on the way out (into the message) and not at all on the way
in: decoded arrays are read-only views on the received message.

The elements are pickled with the standard :mod:`pickle` module (they are data, not code) at
protocol 5, with the buffers of contiguous numpy arrays of at least 1 KiB taken out of band;
smaller buffers and non-contiguous arrays stay inside the pickle stream.

Wire format, all integers little-endian::

    fixed header   magic b"CVC", version (u8) = 1, flags (u8), buffer count n (u32),
                   in-band stored length (u64), in-band raw length (u64)          25 bytes
    n entries      flags (u8), stored length (u64), raw length (u64)              17 bytes each
    checksum       CRC-32 (zlib) of the bytes above and of the stored in-band part  4 bytes
    in-band part   the pickle stream, LZ4-compressed if flags bit 0 is set
    buffers        each starts at the next multiple of 64 from the message start (the gap is
                   zero padding) and is LZ4-compressed if its entry's flags bit 0 is set;
                   the last buffer ends exactly at the end of the message

Compressed parts are LZ4 frames (:mod:`lz4.frame`) recording their content size; their raw
length is the decompressed length, and for uncompressed parts it equals the stored length.
The checksum makes any corruption of the header or of the pickle stream a clean
:class:`~convoy.errors.DataLossError` before anything is unpickled; the contents of the
out-of-band buffers are not checksummed (that is the transport's job, and it would cost a pass
over every array), so a flipped bit there changes a value, or fails LZ4 decompression with a
:class:`~convoy.errors.DataLossError`.
"""

from convoy._values.codec import (
    COMPRESSIONS,
    Encoder,
    decode,
    validate_compression,
)

__all__ = [
    "COMPRESSIONS",
    "Encoder",
    "decode",
    "validate_compression",
]
