"""What a training worker takes at most in one scheduled call."""

from __future__ import annotations

from typing import Any

from convoy._transport.rpc import Outcome
from convoy.errors import ResourceExhaustedError

#: The default limit on one pickled scheduled function (with what it captures).
MAX_FUNCTION_BYTES = 64 * 2**20


def oversize_function(call: Any, max_function_bytes: int | None) -> Outcome | None:
    """The refusal of ``call`` (a ``(digest, function, arguments, call id)`` tuple) if its
    pickled function is larger than ``max_function_bytes``; None if it may run."""
    if (max_function_bytes is None or type(call) is not tuple or len(call) != 4
            or not isinstance(call[1], bytes) or len(call[1]) <= max_function_bytes):
        return None
    return Outcome(error=ResourceExhaustedError(
        f"the scheduled function pickles to {len(call[1]):,} bytes, more than this worker's "
        f"max_function_bytes ({max_function_bytes:,}): pass large values as arguments or "
        "variables, or capture less"))
