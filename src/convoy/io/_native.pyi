"""The compiled wire-format reader of convoy.io's parsers (_native.cpp)."""

from typing import Any

def parse_columns(records: list[bytes], keys: list[bytes], kinds: list[int], field: int,
                  lists: bool, threads: int, sparse: list[bool]
                  ) -> tuple[list[tuple[Any, ...]] | None, tuple[Any, ...] | None]: ...
def split_records(chunk: bytes, at: int) -> tuple[list[bytes], int, str | None]: ...
