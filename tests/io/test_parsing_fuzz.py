"""The parsers on hostile bytes: random Examples and SequenceExamples, then the same bytes
mutated (bits flipped, bytes inserted and deleted, cut short). An intact batch parses to what
protobuf reads; a mutated one parses or raises InvalidArgumentError or DataLossError, and
never crashes the process. The compiled TFRecord framing gets the same treatment.

``make fuzz`` runs these with many more cases against a build of the compiled parser with
AddressSanitizer and UndefinedBehaviorSanitizer (CONVOY_FUZZ_NATIVE names that build's
module file, CONVOY_FUZZ_EXAMPLES the number of cases).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from typing import Any

import numpy as np
import pytest

from convoy import io
from convoy.errors import DataLossError, InvalidArgumentError
from convoy.io import _parsing

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("CONVOY_FUZZ_EXAMPLES", "400"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="CONVOY_FUZZ_NATIVE" not in
                os.environ, suppress_health_check=list(HealthCheck))

KEYS = ["i", "f", "b", "", "long/key_name_x", "other"]
KINDS = {"int64_list": io.Int64List, "float_list": io.FloatList, "bytes_list": io.BytesList}
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT = st.floats(width=32, allow_nan=False)
BYTES = st.binary(max_size=12)
VALUES = {"int64_list": INT64, "float_list": FLOAT, "bytes_list": BYTES}


@pytest.fixture(autouse=True)
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sanitizer build of the compiled parser, when ``make fuzz`` names one."""
    path = os.environ.get("CONVOY_FUZZ_NATIVE")
    if not path:
        return
    loader = importlib.machinery.ExtensionFileLoader("convoy.io._native", path)
    spec = importlib.util.spec_from_file_location("convoy.io._native", path, loader=loader)
    assert spec is not None, f"no extension module at CONVOY_FUZZ_NATIVE={path}"
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    monkeypatch.setattr(_parsing, "_native", module)


@st.composite
def features(draw: Any) -> io.Feature:
    kind = draw(st.sampled_from([*KINDS, None]))
    if kind is None:
        return io.Feature()
    values = draw(st.lists(VALUES[kind], max_size=6))
    return io.Feature(**{kind: KINDS[kind](value=values)})


@st.composite
def examples(draw: Any) -> bytes:
    chosen = draw(st.dictionaries(st.sampled_from(KEYS), features(), max_size=5))
    return io.Example(features=io.Features(feature=chosen)).SerializeToString()


@st.composite
def sequence_examples(draw: Any) -> bytes:
    context = draw(st.dictionaries(st.sampled_from(KEYS), features(), max_size=3))
    lists = draw(st.dictionaries(st.sampled_from(KEYS), st.lists(features(), max_size=4),
                                 max_size=3))
    return io.SequenceExample(
        context=io.Features(feature=context),
        feature_lists=io.FeatureLists(feature_list={
            key: io.FeatureList(feature=steps) for key, steps in lists.items()}),
    ).SerializeToString()


@st.composite
def mutated(draw: Any, record: bytes) -> bytes:
    data = bytearray(record)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "insert", "delete", "cut", "set"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif how == "delete" and data:
            del data[at:at + draw(st.integers(1, 4))]
        elif how == "cut":
            del data[at:]
        elif data:  # a byte that is a tag, a length or a varint's continuation
            data[at] = draw(st.sampled_from([0x0A, 0x12, 0x1A, 0x80, 0xFF, 0x7F, 0x0B, 0x0D]))
    return bytes(data)


def _batch(draw: Any, records: list[bytes]) -> tuple[list[bytes], bool]:
    """The records, some mutated (and whether any is), sometimes repeated into a batch large
    enough to be split over threads."""
    changed = False
    out = []
    for record in records:
        if draw(st.booleans()):
            record, changed = draw(mutated(record)), True
        out.append(record)
    if draw(st.booleans()):
        out = out * 20
    return out, changed


def _values(features: Any, key: str, kind: str) -> list[Any]:
    """The values of ``key`` in protobuf's reading of a record's features, if of ``kind``."""
    feature = features.get(key)
    if feature is None or feature.WhichOneof("kind") != kind:
        return []
    return list(getattr(feature, kind).value)


EXAMPLE_FEATURES = {
    "i": io.VarLenFeature(np.int64),
    "f": io.RaggedFeature(np.float32),
    "b": io.VarLenFeature(bytes),
    "": io.FixedLenFeature([2], np.int64, default_value=[7, 7]),
    "long/key_name_x": io.FixedLenSequenceFeature([], np.float32, allow_missing=True),
}


@pytest.mark.timeout(600)
@FUZZ
@given(st.data(), st.lists(examples(), max_size=6), st.sampled_from([1, 2, 3]))
def test_examples(data: Any, records: list[bytes], threads: int) -> None:
    batch, changed = _batch(data.draw, records)
    _parsing.set_parse_threads(threads)
    try:
        out = io.parse_example(batch, EXAMPLE_FEATURES)
    except (InvalidArgumentError, DataLossError):
        if changed:
            return
        # Intact records fail only on a key of another kind, or a FixedLenFeature of a size
        # not 2.
        parsed = [io.Example.FromString(r).features.feature for r in records]
        assert any(_kind(f, key) not in (None, _KIND[key]) or
                   (key == "" and len(_values(f, "", "int64_list")) not in (0, 2))
                   for f in parsed for key in EXAMPLE_FEATURES)
        return
    finally:
        _parsing.set_parse_threads(os.cpu_count() or 1)
    assert out["i"].dense_shape[0] == len(batch)
    if changed:
        return
    for index, record in enumerate(records):  # a repeated batch repeats these
        feature = io.Example.FromString(record).features.feature
        sparse = out["i"]
        assert sparse.values[sparse.indices[:, 0] == index].tolist() == \
            _values(feature, "i", "int64_list")
        assert out["f"][index].tolist() == \
            np.array(_values(feature, "f", "float_list"), np.float32).tolist()
        sparse = out["b"]
        assert sparse.values[sparse.indices[:, 0] == index].tolist() == \
            _values(feature, "b", "bytes_list")
        assert out[""][index].tolist() == (_values(feature, "", "int64_list") or [7, 7])


_KIND = {"i": "int64_list", "f": "float_list", "b": "bytes_list", "": "int64_list",
         "long/key_name_x": "float_list"}


def _kind(features: Any, key: str) -> str | None:
    feature = features.get(key)
    return None if feature is None else feature.WhichOneof("kind")


@pytest.mark.timeout(600)
@FUZZ
@given(st.data(), st.lists(sequence_examples(), max_size=5), st.sampled_from([1, 2]))
def test_sequence_examples(data: Any, records: list[bytes], threads: int) -> None:
    batch, changed = _batch(data.draw, records)
    _parsing.set_parse_threads(threads)
    try:
        context, lists, _ = io.parse_sequence_example(
            batch, context_features={"i": io.VarLenFeature(np.int64),
                                     "b": io.RaggedFeature(bytes)},
            sequence_features={"f": io.RaggedFeature(np.float32),
                               "i": io.VarLenFeature(np.int64),
                               "other": io.FixedLenSequenceFeature([], bytes,
                                                                   allow_missing=True)})
    except (InvalidArgumentError, DataLossError):  # intact records may hold other kinds
        return
    finally:
        _parsing.set_parse_threads(os.cpu_count() or 1)
    if changed:
        return
    for index, record in enumerate(records):
        message = io.SequenceExample.FromString(record)
        steps = message.feature_lists.feature_list.get("f")
        want = [] if steps is None else [
            np.array(step.float_list.value, np.float32).tolist() for step in steps.feature]
        assert lists["f"][index].to_list() == want
        feature = message.context.feature.get("b")
        assert context["b"][index].tolist() == ([] if feature is None else
                                                list(feature.bytes_list.value))


def _framed(record: bytes) -> bytes:
    from convoy.data.tfrecord import masked_crc32c

    length = len(record).to_bytes(8, "little")
    return (length + masked_crc32c(length).to_bytes(4, "little") + record +
            masked_crc32c(record).to_bytes(4, "little"))


@pytest.mark.timeout(600)
@FUZZ
@given(st.data(), st.lists(st.binary(max_size=40), max_size=8))
def test_tfrecord_framing(data: Any, records: list[bytes]) -> None:
    """TFRecord framing cut by the compiled reader: intact, every record and the offset after
    them; damaged, a prefix of the records, the offset after it, and an error only where a
    whole frame's CRC fails."""
    chunk = b"".join(map(_framed, records))
    damaged = data.draw(mutated(chunk)) if chunk and data.draw(st.booleans()) else chunk
    got, at, error = _parsing._native.split_records(damaged, 0)
    if damaged == chunk:
        assert (got, at, error) == (records, len(chunk), None)
        return
    assert got == records[:len(got)]  # damage stops the cut (a CRC fails) or ends it early
    assert at == sum(16 + len(record) for record in got)
    assert error in (None, "length CRC mismatch", "data CRC mismatch")
