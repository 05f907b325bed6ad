"""String ops, as ``tf.strings`` names them, on numpy arrays of ``bytes``.

Inputs may be ``str``, ``bytes``, numpy ``|S``/``|U`` arrays or object arrays of them; results
are ``bytes`` in object arrays (a ``bytes`` value for a scalar), lengths int32, hash buckets
int64, and ops that give each input a variable number of outputs (``split``,
``unicode_decode``) give a :class:`~convoy.RaggedTensor` with one row per input.
"""

from convoy._ops.strings import (
    join,
    length,
    lower,
    reduce_join,
    regex_replace,
    split,
    strip,
    substr,
    to_hash_bucket_fast,
    to_number,
    unicode_decode,
    upper,
)

__all__ = [
    "join",
    "length",
    "lower",
    "reduce_join",
    "regex_replace",
    "split",
    "strip",
    "substr",
    "to_hash_bucket_fast",
    "to_number",
    "unicode_decode",
    "upper",
]
