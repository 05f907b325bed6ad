"""CsvDataset and make_csv_dataset. Scenarios ported from TensorFlow's
tensorflow/python/data/experimental/kernel_tests/csv_dataset_test.py and
make_csv_dataset_test.py in our own words; each test names its source."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest

from convoy.data import Dataset, experimental
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)
CsvDataset = experimental.CsvDataset


@pytest.fixture
def write(tmp_path):
    counter = iter(range(1000))

    def write(rows, linebreak="\n", compression=None):
        path = tmp_path / f"file_{next(counter)}.csv"
        content = linebreak.join(rows).encode()
        if compression == "GZIP":
            content = gzip.compress(content)
        elif compression == "ZLIB":
            content = zlib.compress(content)
        path.write_bytes(content)
        return str(path)

    return write


def rows(ds):
    return [tuple(x.item() if isinstance(x, np.generic) else x for x in r) for r in ds]


def test_types(write):
    """testInt / testFloat / testString / testMixedTypes."""
    path = write(["1,2.5,hello,4", "5,6.5,goodbye,8"])
    ds = CsvDataset(path, [np.int32, np.float32, bytes, [np.int64(0)]])
    got = list(ds)
    assert rows(got) == [(1, 2.5, b"hello", 4), (5, 6.5, b"goodbye", 8)]
    assert [type(x) for x in got[0]] == [np.int32, np.float32, bytes, np.int64]


def test_empty_fields_take_defaults(write):
    """testWithEmptyFields."""
    ds = CsvDataset(write([",,,", "1,1,1,", ",2,2,2"]), [[0]] * 4)
    assert rows(ds) == [(0, 0, 0, 0), (1, 1, 1, 0), (0, 2, 2, 2)]


@pytest.mark.parametrize("content, message", [
    (['1,2"3,4'], "Unquoted fields cannot have quotes inside"),
    (['"a"b","c","d"'], "Quote inside a string has to be escaped by another quote"),
    (["0,"], "Field 1 is required but missing in record!"),
    (["0,1,2,3"], "Expect 2 fields but have more in record"),
    (["", "1,2"], "Expect 2 fields but have 1 in record"),
    (['a,"b'], "Reached end of file without closing quoted field in record")])
def test_errors(write, content, message):
    """testErrWithUnquotedQuotes, testErrWithUnescapedQuotes, testErrorWithMissingDefault,
    testErrorWithFewerDefaultsThanFields, testErrorWithEmptyRecord,
    testErrorWithTerminateMidRecord."""
    defaults = [[]] * 2 if "required" in message or "Expect 2" in message else [[""]] * 3
    if "closing" in message:
        defaults = [[""]] * 2
    with pytest.raises(InvalidArgumentError, match=message):
        list(CsvDataset(write(content), defaults))


def test_more_defaults_than_fields(write):
    """testErrorWithMoreDefaultsThanFields."""
    with pytest.raises(InvalidArgumentError, match="Expect 5 fields but have 4 in record"):
        list(CsvDataset(write(["0,1,2,3"]), [[0.0]] * 5))


def test_ignore_errors_skips_bad_records(write):
    """testIgnoreErrWithUnescapedQuotes / testIgnoreErrWithUnquotedQuotes."""
    for content in (['1,"2"3",4', '1,"2"3",4",5,5', 'a,b,"c"d"', "e,f,g"],
                    ['1,2"3,4', 'a,b,c"d', '9,8"7,6,5', "e,f,g"]):
        ds = CsvDataset(write(content), [[""]] * 3).ignore_errors()
        assert list(ds) == [(b"e", b"f", b"g")]


def test_quoting_options(write):
    """testWithQuoted, testWithNoQuoteDelimAndUnquotedQuotes, testWithUseQuoteDelimFalse,
    testWithFieldDelim, testWithNaValue."""
    assert rows(CsvDataset(write(['"a","b","c :)","d"']), [[""]] * 4)) == \
        [(b"a", b"b", b"c :)", b"d")]
    assert rows(CsvDataset(write(['1,2"3,4']), [[""]] * 3, use_quote_delim=False)) == \
        [(b"1", b'2"3', b"4")]
    assert rows(CsvDataset(write(['1,2,"3,4"']), [[""]] * 4, use_quote_delim=False)) == \
        [(b"1", b"2", b'"3', b'4"')]
    assert rows(CsvDataset(write(["1:2:3:4"]), [[0]] * 4, field_delim=":")) == [(1, 2, 3, 4)]
    assert rows(CsvDataset(write(["1,NA,3,4"]), [[0]] * 4, na_value="NA")) == [(1, 0, 3, 4)]


def test_newlines_in_quotes(write):
    """testWithNewLine / testWithNewLineInUnselectedCol / testWithWindowsLineBreaks."""
    ds = CsvDataset(write(['a,b,"""c""\n0","d\ne"', "f,g,h,i"]), [[""]] * 4)
    assert rows(ds) == [(b"a", b"b", b'"c"\n0', b"d\ne"), (b"f", b"g", b"h", b"i")]
    ds = CsvDataset(write(['1,"2\n3",4', "5,6,7"]), [[""]], select_cols=[0])
    assert rows(ds) == [(b"1",), (b"5",)]
    ds = CsvDataset(write(["1,2", "3,4"], linebreak="\r\n"), [[0]] * 2)
    assert rows(ds) == [(1, 2), (3, 4)]


def test_select_and_exclude_cols(write):
    """testWithSelectCols, testWithSelectColsTooHigh, testWithExcludeCol,
    testWithSelectandExcludeCol."""
    path = write(["1,2,3,4", '"5","6","7","8"'])
    assert rows(CsvDataset(path, [[""]] * 2, select_cols=[1, 2])) == \
        [(b"2", b"3"), (b"6", b"7")]
    with pytest.raises(InvalidArgumentError, match="Expect 2 fields but have 1 in record"):
        list(CsvDataset(path, [[0]] * 2, select_cols=[3, 4]))
    assert rows(CsvDataset(path, [[""]], exclude_cols=[1, 2, 3])) == [(b"1",), (b"5",)]
    with pytest.raises(InvalidArgumentError,
                       match="Either select_cols or exclude_cols should be empty"):
        CsvDataset(path, [[""]], select_cols=[0], exclude_cols=[1])


def test_header_and_files(write):
    """testWithHeader, testWithHeaderAndNoRecords, testErrorWithHeaderEmptyFile,
    testWithEmptyFile, testWithMultipleFiles, testWithLeadingAndTrailingSpaces."""
    assert rows(CsvDataset(write(["col1,col2", "1,2"]), [[0]] * 2, header=True)) == [(1, 2)]
    assert rows(CsvDataset(write(["col1,col2"]), [[0]] * 2, header=True)) == []
    with pytest.raises(InvalidArgumentError, match="Can't read header of file"):
        list(CsvDataset(write([]), [[0]] * 2, header=True))
    assert rows(CsvDataset(write([""]), [[""]] * 2)) == []
    files = [write(["1,2", "3,4"]), write(["5,6"])]
    assert rows(CsvDataset(files, [[0]] * 2)) == [(1, 2), (3, 4), (5, 6)]
    assert rows(CsvDataset(Dataset.from_tensor_slices(np.array(files, dtype=object)),
                           [[0]] * 2)) == [(1, 2), (3, 4), (5, 6)]
    assert rows(CsvDataset(write(["0, 1, 2, 3"]), [[0.0]] * 4)) == [(0.0, 1.0, 2.0, 3.0)]


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compression(write, compression):
    """testWithCompressionType."""
    path = write(["1,2", "3,4"], compression=compression)
    assert rows(CsvDataset(path, [[0]] * 2, compression_type=compression)) == [(1, 2), (3, 4)]


# ----- make_csv_dataset ------------------------------------------------------------------------

def test_make_csv_dataset_with_label_and_inferred_types(write):
    """testMakeCSVDataset / testMakeCSVDataset_withTypeInference..."""
    path = write(["int,float,bigint,string,label", "1,1.5,5000000000,a,0",
                  "2,2.5,3,b,1", "3,,4,c,0"])
    ds = experimental.make_csv_dataset(path, batch_size=2, label_name="label",
                                       num_epochs=1, shuffle=False)
    (features, labels), (features2, labels2) = list(ds)
    assert sorted(features) == ["bigint", "float", "int", "string"]
    assert features["int"].dtype == np.int32 and features["bigint"].dtype == np.int64
    assert features["float"].dtype == np.float32
    assert features["string"].tolist() == [b"a", b"b"]
    assert labels.tolist() == [0, 1] and labels2.tolist() == [0]
    assert features2["float"].tolist() == [0.0]


def test_make_csv_dataset_select_columns_and_defaults(write):
    """testMakeCSVDataset_withSelectColumns / ..._withColumnDefaults..."""
    path = write(["a,b,c", "1,2,3", "4,5,6"])
    ds = experimental.make_csv_dataset(path, 2, select_columns=["a", 2],
                                       column_defaults=[[0], [0.0]], num_epochs=1,
                                       shuffle=False)
    batch = next(iter(ds))
    assert batch["a"].tolist() == [1, 4] and batch["c"].tolist() == [3.0, 6.0]


def test_make_csv_dataset_errors(write):
    """testMakeCSVDataset_withBadInputs."""
    path = write(["a,b", "1,2"])
    with pytest.raises(InvalidArgumentError, match="must be one of the columns"):
        experimental.make_csv_dataset(path, 2, label_name="z")
    with pytest.raises(InvalidArgumentError, match="Cannot infer column names"):
        experimental.make_csv_dataset(path, 2, header=False)
    with pytest.raises(InvalidArgumentError, match="duplicate column names"):
        experimental.make_csv_dataset(path, 2, column_names=["a", "a"])


def test_make_csv_dataset_shuffles_and_repeats(write):
    """testMakeCSVDataset_withShuffle / num_epochs=None repeats and drops the remainder."""
    path = write(["x"] + [str(i) for i in range(10)])
    ds = experimental.make_csv_dataset(path, 3, shuffle_seed=4, num_epochs=None)
    batches = [b["x"].tolist() for _, b in zip(range(10), ds)]
    assert all(len(b) == 3 for b in batches)
    assert sorted(sum(batches[:3], [])) != sum(batches[:3], [])  # shuffled
