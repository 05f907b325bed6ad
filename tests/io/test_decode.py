"""Tests for cv.io.decode_raw and cv.io.decode_csv, ported from TensorFlow's
tensorflow/python/kernel_tests/io_ops/decode_raw_op_test.py and decode_csv_op_test.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from convoy import io
from convoy.errors import InvalidArgumentError

# --- decode_raw (decode_raw_op_test.py) --------------------------------------------------------


def test_to_uint8() -> None:  # testToUint8
    assert io.decode_raw([b"A"], np.uint8).tolist() == [[0x41]]
    assert io.decode_raw([b"wer", b"XYZ"], np.uint8).tolist() == [[ord(c) for c in "wer"],
                                                                  [ord(c) for c in "XYZ"]]
    with pytest.raises(InvalidArgumentError, match="same size"):
        io.decode_raw([b"short", b"longer"], np.uint8)


def test_to_int16() -> None:  # testToInt16
    out = io.decode_raw([b"AaBC"], np.int16)
    assert out.tolist() == [[ord("A") + ord("a") * 256, ord("B") + ord("C") * 256]]
    with pytest.raises(InvalidArgumentError, match="not a multiple of 2"):
        io.decode_raw([b"123", b"456"], np.int16)


def test_endianness() -> None:  # testEndianness
    assert io.decode_raw([b"\x01\x02\x03\x04"], np.int32, little_endian=True).tolist() == \
        [[0x04030201]]
    assert io.decode_raw([b"\x01\x02\x03\x04"], np.int32, little_endian=False).tolist() == \
        [[0x01020304]]
    assert io.decode_raw([b"\x00\x00\x80\x3f"], np.float32).tolist() == [[1.0]]


def test_to_float16_and_complex() -> None:  # testToFloat16, testToComplex64
    values = np.array([1.5, -2.0, 65504], np.float16)
    assert io.decode_raw([values.tobytes()], np.float16).tolist() == [values.tolist()]
    complex_values = np.array([1 + 2j, -3j], np.complex64)
    assert io.decode_raw([complex_values.tobytes()], np.complex64).tolist() == [
        complex_values.tolist()]


def test_empty_string_input() -> None:  # testEmptyStringInput
    out = io.decode_raw([b"", b""], np.float16)
    assert out.shape == (2, 0)


def test_fixed_length_pads_and_cuts() -> None:  # DecodePaddedRawOpTest.testToInt16, testToFloat
    out = io.decode_raw([b"\x01\x00\x02\x00\x03", b"\x04"], np.int16, fixed_length=4)
    assert out.tolist() == [[1, 2], [4, 0]]
    with pytest.raises(InvalidArgumentError, match="fixed_length"):
        io.decode_raw([b"abc"], np.int16, fixed_length=3)


def test_scalar_input_and_bad_type() -> None:
    assert io.decode_raw(b"\x01\x02", np.uint8).tolist() == [1, 2]
    with pytest.raises(InvalidArgumentError, match="out_type"):
        io.decode_raw([b"a"], object)


# --- decode_csv (decode_csv_op_test.py) --------------------------------------------------------

CSV_CASES: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("testSimple", {"records": ["1", "2", '"3"'], "record_defaults": [[1]]}, [[1, 2, 3]]),
    ("testSimpleWithScalarDefaults", {"records": ["1,4", "2,5", "3,6"],
                                      "record_defaults": [1, 2]}, [[1, 2, 3], [4, 5, 6]]),
    ("testSimpleNoQuoteDelimiter", {"records": ["1", "2", '"3"'], "record_defaults": [[""]],
                                    "use_quote_delim": False}, [[b"1", b"2", b'"3"']]),
    ("testScalar", {"records": '1,""', "record_defaults": [[3], [4]]}, [1, 4]),
    ("test2D", {"records": [["1", "2"], ['""', "4"]], "record_defaults": [[5]]},
     [[[1, 2], [5, 4]]]),
    ("test2DNoQuoteDelimiter", {"records": [["1", "2"], ['""', '"']], "record_defaults": [[""]],
                                "use_quote_delim": False}, [[[b"1", b"2"], [b'""', b'"']]]),
    ("testDouble", {"records": ["1.0", "-1.79e+308", '"1.79e+308"'],
                    "record_defaults": [np.array([], dtype=np.double)]},
     [[1.0, -1.79e308, 1.79e308]]),
    ("testInt64", {"records": ["1", "2", '"2147483648"'],
                   "record_defaults": [np.array([], dtype=np.int64)]}, [[1, 2, 2147483648]]),
    ("testComplexString", {"records": ['"1.0"', '"ab , c"', '"a\nbc"', '"ab""c"', " abc "],
                           "record_defaults": [["1"]]},
     [[b"1.0", b"ab , c", b"a\nbc", b'ab"c', b" abc "]]),
    ("testMultiRecords", {"records": ["1.0,4,aa", "0.2,5,bb", "3,6,cc"],
                          "record_defaults": [[1.0], [1], ["aa"]]},
     [[1.0, 0.2, 3], [4, 5, 6], [b"aa", b"bb", b"cc"]]),
    ("testNA", {"records": ["2.0,NA,aa", "NA,5,bb", "3,6,NA"],
                "record_defaults": [[0.0], [0], [""]], "na_value": "NA"},
     [[2.0, 0.0, 3], [0, 5, 6], [b"aa", b"bb", b""]]),
    ("testWithDefaults", {"records": [",1,", "0.2,3,bcd", "3.0,,"],
                          "record_defaults": [[1.0], [0], ["a"]]},
     [[1.0, 0.2, 3.0], [1, 3, 0], [b"a", b"bcd", b"a"]]),
    ("testWithDefaultsAndNoQuoteDelimiter", {"records": [",1,", "0.2,3,bcd", '3.0,,"'],
                                             "record_defaults": [[1.0], [0], ["a"]],
                                             "use_quote_delim": False},
     [[1.0, 0.2, 3.0], [1, 3, 0], [b"a", b"bcd", b'"']]),
    ("testWithTabDelim", {"records": ["1\t1", "0.2\t3", "3.0\t"],
                          "record_defaults": [[1.0], [0]], "field_delim": "\t"},
     [[1.0, 0.2, 3.0], [1, 3, 0]]),
    ("testSelectCols", {"records": [",,", "4,5,6"], "record_defaults": [[1], [2]],
                        "select_cols": [0, 1]}, [[1, 4], [2, 5]]),
    ("testSelectColsInclLast", {"records": [",,", "4,5,6"],
                                "record_defaults": [[0], [1], [2]],
                                "select_cols": [0, 1, 2]}, [[0, 4], [1, 5], [2, 6]]),
    ("testNumpyAttribute", {"records": "1,2,3,4,5", "record_defaults": np.zeros(5)},
     [1, 2, 3, 4, 5]),
]


@pytest.mark.parametrize("args, expected", [c[1:] for c in CSV_CASES],
                         ids=[c[0] for c in CSV_CASES])
def test_decode_csv(args: dict[str, Any], expected: list[Any]) -> None:
    out = io.decode_csv(**args)
    assert len(out) == len(expected)
    for column, want in zip(out, expected):
        if column.dtype == object:
            assert column.tolist() == want
        else:
            np.testing.assert_allclose(column, np.asarray(want, dtype=column.dtype))


def test_decode_csv_dtypes() -> None:
    floats, ints, strings = io.decode_csv(["1.5,2,x"], [[0.0], [0], [""]])
    assert (floats.dtype, ints.dtype, strings.dtype) == (np.float32, np.int32, object)


CSV_ERRORS = [
    ("testWithoutDefaultsError", {"records": [",1", "0.2,3", "3.0,"],
                                  "record_defaults": [[1.0], np.array([], dtype=np.int32)]},
     "Field 1 is required but missing in record 2!"),
    ("testWrongFieldIntError", {"records": [",1", "0.2,234a", "3.0,2"],
                                "record_defaults": [[1.0], np.array([], dtype=np.int32)]},
     "Field 1 in record 1 is not a valid int32: 234a"),
    ("testOutOfRangeError", {"records": ["1", "9999999999999999999999999", "3"],
                             "record_defaults": [[1]]},
     "Field 0 in record 1 is not a valid int32: "),
    ("testWrongFieldFloatError", {"records": [",1", "0.2,2", "3.0adf,3"],
                                  "record_defaults": [[1.0], np.array([], dtype=np.int32)]},
     "Field 0 in record 2 is not a valid float: "),
    ("testWrongFieldStringError", {"records": ['"1,a,"', "0.22", 'a"bc'],
                                   "record_defaults": [["a"]]},
     "Unquoted fields cannot have quotes/CRLFs inside"),
    ("testWrongDefaults", {"records": [",1", "0.2,2", "3.0adf,3"],
                           "record_defaults": [[1.0]]}, "Expect 1 fields but have 2 in record 0"),
    ("testShortQuotedString", {"records": ['"'], "record_defaults": [["default"]]},
     "Quoted field has to end with quote followed"),
    ("testWrongSelectColsInclLast", {"records": [",,", "4,5,6"],
                                     "record_defaults": [[0], [1], [2]],
                                     "select_cols": [0, 1, 3]},
     "Expect 3 fields but have 2 in record 0"),
    ("testWrongSelectColsLen", {"records": ["1,2,3", "4,5,6"],
                                "record_defaults": [[0], [0], [0]], "select_cols": [0]},
     "Length of select_cols and record_defaults do not match."),
    ("testWrongSelectColsSorting", {"records": ["1,2,3"], "record_defaults": [[0], [1]],
                                    "select_cols": [1, 0]}, "select_cols is not strictly"),
    ("testWrongSelectColsIndicesNegative", {"records": ["1,2,3"],
                                            "record_defaults": [[0], [1]],
                                            "select_cols": [-1, 0]},
     "select_cols contains negative values."),
    ("testWrongSelectColsIndicesTooHigh", {"records": ["1,2,3"],
                                           "record_defaults": [[0], [1]],
                                           "select_cols": [0, 3]},
     "Expect 2 fields but have 1 in record 0"),
    ("testSimpleWith2DDefaults", {"records": ["1", "2", "3"], "record_defaults": [[[0]]]},
     "Each record default should be at most rank 1"),
]


@pytest.mark.parametrize("args, message", [c[1:] for c in CSV_ERRORS],
                         ids=[c[0] for c in CSV_ERRORS])
def test_decode_csv_errors(args: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(")):
        io.decode_csv(**args)
