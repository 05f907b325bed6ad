"""Sets of element sequence numbers as sorted lists of disjoint ranges ``(start, stop)``.

Under DYNAMIC, a task numbers the elements it produces from 0; consumers keep the ranges they
received, and a task run again after its worker died skips the ranges its consumers already
have. A consumer reading alone holds one range per task; consumers sharing a job hold
interleaved ones, whose union is again about one range.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Range = tuple[int, int]


def add(ranges: list[Range], start: int, stop: int) -> None:
    """Add ``[start, stop)`` to ``ranges`` in place (sorted, disjoint, touching ones joined)."""
    if start >= stop:
        return
    if not ranges or ranges[-1][1] <= start:  # the common case: at or after the end
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((start, stop))
        return
    first = bisect.bisect_left(ranges, start, key=lambda r: r[1])  # first that ends >= start
    last = bisect.bisect_right(ranges, stop, key=lambda r: r[0])  # after the last starting <= stop
    if first < last:
        start, stop = min(start, ranges[first][0]), max(stop, ranges[last - 1][1])
    ranges[first:last] = [(start, stop)]


def remove(ranges: list[Range], start: int, stop: int) -> None:
    """Remove ``[start, stop)`` from ``ranges`` in place."""
    if start >= stop:
        return
    first = bisect.bisect_right(ranges, start, key=lambda r: r[1])  # first that ends > start
    last = bisect.bisect_left(ranges, stop, key=lambda r: r[0])  # after the last starting < stop
    if first >= last:
        return
    kept = []
    if ranges[first][0] < start:
        kept.append((ranges[first][0], start))
    if ranges[last - 1][1] > stop:
        kept.append((stop, ranges[last - 1][1]))
    ranges[first:last] = kept


def union(ranges: list[Range], more: Iterable[Range]) -> list[Range]:
    """A new list: ``ranges`` with ``more`` added."""
    joined = list(ranges)
    for start, stop in more:
        add(joined, start, stop)
    return joined


def runs(numbers: Iterable[int]) -> list[Range]:
    """The ranges of increasing ``numbers`` (consecutive ones make one range)."""
    found: list[Range] = []
    for number in numbers:
        if found and found[-1][1] == number:
            found[-1] = (found[-1][0], number + 1)
        else:
            found.append((number, number + 1))
    return found


def count(ranges: Iterable[Range]) -> int:
    return sum(stop - start for start, stop in ranges)


class Skipper:
    """Says, for increasing sequence numbers, whether each is in ``ranges``."""

    def __init__(self, ranges: Iterable[Range]) -> None:
        self._ranges = sorted(ranges)
        self._next = 0  # the first range that may still hold a number asked about

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __contains__(self, number: int) -> bool:
        ranges = self._ranges
        while self._next < len(ranges) and ranges[self._next][1] <= number:
            self._next += 1
        return self._next < len(ranges) and ranges[self._next][0] <= number
