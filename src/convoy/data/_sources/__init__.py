"""Ops without an input: ranges, tensors, generators, file lists, counters and the readers of
file formats (TFRecord, text lines, CSV, fixed-length records)."""
