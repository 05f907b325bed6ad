"""``tf.train.Example`` records and serialized tensors without TensorFlow, named as in ``tf.io``.

``parse_example`` and ``parse_single_example`` turn serialized ``Example`` records into numpy
arrays, :class:`~convoy.SparseTensor` and :class:`~convoy.RaggedTensor` values, as
``FixedLenFeature``, ``VarLenFeature``, ``SparseFeature``, ``RaggedFeature`` and
``FixedLenSequenceFeature`` ask; ``parse_sequence_example`` and
``parse_single_sequence_example`` do the same for ``SequenceExample`` records. Byte strings
come out as ``object`` arrays of ``bytes``. The parsers are compiled: each call releases the GIL
and splits its batch over ``set_parse_threads(n)`` threads (by default the CPUs the process
may use). The message classes to write records
(``Example``, ``Features``, ...) are protobuf messages with TensorFlow's wire format; they are
also ``convoy.train``'s. ``serialize_tensor``/``parse_tensor`` write and read the bytes
``tf.io.serialize_tensor`` does. ``gfile``, ``read_file`` and ``write_file`` reach files on
local disks and object stores (``s3://``, ``gs://``, any fsspec URL) alike. ``decode_image``,
``decode_jpeg``, ``decode_png``, ``decode_gif``, ``decode_bmp``, ``encode_jpeg`` and
``encode_png`` read and write image files (with Pillow: ``pip install 'convoy[image]'``).
"""

from convoy.data.tfrecord import TFRecordOptions, TFRecordWriter
from convoy.io import gfile
from convoy.io._decode import decode_csv, decode_raw
from convoy.io._features import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    SparseFeature,
    VarLenFeature,
)
from convoy.io._image_codec import (
    decode_bmp,
    decode_gif,
    decode_image,
    decode_jpeg,
    decode_png,
    encode_jpeg,
    encode_png,
)
from convoy.io._parsing import (
    get_parse_threads,
    parse_example,
    parse_sequence_example,
    parse_single_example,
    parse_single_sequence_example,
    set_parse_threads,
)
from convoy.io._tensor import parse_tensor, serialize_tensor
from convoy.io.example_pb2 import (
    BytesList,
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    FloatList,
    Int64List,
    SequenceExample,
)
from convoy.io.gfile import read_file, write_file

__all__ = [
    "BytesList",
    "Example",
    "Feature",
    "FeatureList",
    "FeatureLists",
    "Features",
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "FloatList",
    "Int64List",
    "RaggedFeature",
    "SequenceExample",
    "SparseFeature",
    "TFRecordOptions",
    "TFRecordWriter",
    "VarLenFeature",
    "decode_csv",
    "decode_raw",
    "decode_bmp",
    "decode_gif",
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "encode_jpeg",
    "encode_png",
    "get_parse_threads",
    "gfile",
    "parse_example",
    "parse_sequence_example",
    "parse_single_example",
    "parse_single_sequence_example",
    "parse_tensor",
    "read_file",
    "serialize_tensor",
    "set_parse_threads",
    "write_file",
]
