"""``cv.io.gfile``, ``read_file`` and ``write_file`` as TensorFlow's, on a local directory
and on the S3 test server."""

from __future__ import annotations

from pathlib import Path

import pytest

import convoy as cv
from convoy.errors import AlreadyExistsError, NotFoundError

gfile = cv.io.gfile
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3_bucket") + "/top"


def test_files_and_directories(root: str) -> None:
    gfile.makedirs(f"{root}/a/b")
    with gfile.GFile(f"{root}/a/b/f.txt", "w") as file:
        file.write("one\ntwo\n")
    with gfile.GFile(f"{root}/a/g.bin", "wb") as file:
        file.write(b"\x00\x01")
    with gfile.GFile(f"{root}/a/b/f.txt") as file:
        assert file.readline() == "one\n"
        assert file.readlines() == ["two\n"]
    assert gfile.GFile(f"{root}/a/g.bin", "rb").read() == b"\x00\x01"
    assert gfile.GFile(f"{root}/a/g.bin", "rb").size() == 2
    assert gfile.exists(f"{root}/a/b/f.txt") and gfile.isdir(f"{root}/a/b")
    assert not gfile.isdir(f"{root}/a/g.bin")
    assert gfile.listdir(f"{root}/a") == ["b", "g.bin"]
    assert gfile.glob(f"{root}/a/*.bin") == [f"{root}/a/g.bin"]
    assert list(gfile.walk(f"{root}/a")) == [(f"{root}/a", ["b"], ["g.bin"]),
                                              (f"{root}/a/b", [], ["f.txt"])]
    assert gfile.stat(f"{root}/a/b/f.txt").length == 8
    gfile.copy(f"{root}/a/g.bin", f"{root}/c.bin")
    with pytest.raises(AlreadyExistsError):
        gfile.copy(f"{root}/a/g.bin", f"{root}/c.bin")
    with pytest.raises(AlreadyExistsError):
        gfile.rename(f"{root}/a/g.bin", f"{root}/c.bin")
    gfile.rename(f"{root}/a/g.bin", f"{root}/c.bin", overwrite=True)
    assert not gfile.exists(f"{root}/a/g.bin")
    gfile.remove(f"{root}/c.bin")
    gfile.rmtree(f"{root}/a")
    assert not gfile.exists(f"{root}/a")


def test_missing_paths_are_not_found_naming_them(root: str) -> None:
    for call in (lambda p: gfile.GFile(p).read(), gfile.remove, gfile.listdir, gfile.stat,
                 cv.io.read_file):
        with pytest.raises(NotFoundError, match="missing"):
            call(f"{root}/missing")


def test_read_and_write_file(root: str) -> None:
    cv.io.write_file(f"{root}/d/w.bin", b"payload")
    assert cv.io.read_file(f"{root}/d/w.bin") == b"payload"
    cv.io.write_file(f"{root}/d/w.bin", "text")
    assert cv.io.read_file(f"{root}/d/w.bin") == b"text"


def test_an_empty_written_file_exists(root: str) -> None:
    gfile.makedirs(root)
    gfile.GFile(f"{root}/empty", "w").close()
    assert gfile.exists(f"{root}/empty") and gfile.stat(f"{root}/empty").length == 0
