"""State invariants on request: with ``CONVOY_VALIDATE_STATE=1`` in its environment (the
tests set it), a process's dispatcher and worker states check theirs after every event."""

from __future__ import annotations

import os

#: Whether the states validate themselves after every event (tests may set it in-process).
ENABLED = os.environ.get("CONVOY_VALIDATE_STATE") == "1"


def require(condition: bool, broken: str) -> None:
    """Raise AssertionError naming the ``broken`` invariant unless ``condition`` holds."""
    if not condition:
        raise AssertionError(f"state invariant broken: {broken}")
