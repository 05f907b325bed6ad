"""The transformations: ops with inputs (batch, map, shuffle, grouping, interleave, ...)."""
