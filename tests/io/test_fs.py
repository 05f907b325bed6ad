"""The file-system layer on local paths, memory:// and the S3 test server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convoy import _fs
from convoy.errors import (
    AlreadyExistsError,
    NotFoundError,
    UnavailableError,
    UnimplementedError,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3_bucket") + "/prefix"


def test_write_read_list_remove(root: str) -> None:
    _fs.makedirs(_fs.join(root, "d"))
    _fs.atomic_write(_fs.join(root, "d", "a.bin"), b"abc")
    with _fs.open_file(_fs.join(root, "d", "b.txt"), "w") as file:
        file.write("hello\n")
    assert _fs.read_bytes(_fs.join(root, "d", "a.bin")) == b"abc"
    with _fs.open_file(_fs.join(root, "d", "b.txt"), "r") as file:
        assert file.read() == "hello\n"
    assert _fs.listdir(_fs.join(root, "d")) == ["a.bin", "b.txt"]
    assert _fs.glob(_fs.join(root, "d", "*.bin")) == [_fs.join(root, "d", "a.bin")]
    assert _fs.exists(_fs.join(root, "d", "a.bin")) and _fs.isdir(_fs.join(root, "d"))
    assert _fs.stat(_fs.join(root, "d", "a.bin"))["size"] == 3
    _fs.rename(_fs.join(root, "d", "a.bin"), _fs.join(root, "d", "c.bin"))
    assert _fs.listdir(_fs.join(root, "d")) == ["b.txt", "c.bin"]
    _fs.remove(_fs.join(root, "d", "c.bin"))
    assert not _fs.exists(_fs.join(root, "d", "c.bin"))
    _fs.rmtree(_fs.join(root, "d"))
    assert not _fs.exists(_fs.join(root, "d"))


def test_missing_raises_not_found_naming_the_url(s3_bucket: str) -> None:
    missing = _fs.join(s3_bucket, "nope.bin")
    with pytest.raises(NotFoundError, match="nope.bin"):
        _fs.read_bytes(missing)
    with pytest.raises(NotFoundError, match="nope.bin"):
        _fs.open_file(missing, "rb")
    with pytest.raises(NotFoundError, match="nope.bin"):
        _fs.remove(missing)


def test_write_if_absent_lets_one_writer_win(root: str) -> None:
    path = _fs.join(root, "once")
    assert _fs.write_if_absent(path, b"first")
    assert not _fs.write_if_absent(path, b"second")
    assert _fs.read_bytes(path) == b"first"


def test_a_failed_write_leaves_no_object(s3_bucket: str) -> None:
    path = _fs.join(s3_bucket, "partial.bin")
    with pytest.raises(RuntimeError), _fs.open_file(path, "wb") as file:
        file.write(b"x" * 1000)
        raise RuntimeError("interrupted")
    assert not _fs.exists(path)


def test_url_is_never_a_local_path(s3_bucket: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _fs.makedirs(s3_bucket + "/a/b")
    _fs.atomic_write(s3_bucket + "/a/b/x", b"1")
    assert os.listdir(tmp_path) == []


def test_missing_bucket_is_not_found(s3_bucket: str) -> None:
    url = s3_bucket + "-missing/x"
    with pytest.raises(NotFoundError, match="-missing/x"):
        _fs.read_bytes(url)
    with pytest.raises(NotFoundError, match="-missing/x"):
        _fs.atomic_write(url, b"1")


def test_unreachable_server_is_unavailable_after_a_bounded_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from convoy.testing import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setattr(_fs, "_BACKOFF", 0.01)
    monkeypatch.setattr(_fs, "ATTEMPTS", 2)
    with pytest.raises(UnavailableError, match="s3://bkt/x"):
        _fs.read_bytes("s3://bkt/x")


def test_missing_backend_names_the_extra() -> None:
    with pytest.raises(UnimplementedError, match=r"unknown URL scheme nosuch://"):
        _fs.exists("nosuch://x/y")


def test_memory_urls() -> None:
    _fs.atomic_write("memory://convoy-test/a", b"1")
    assert _fs.listdir("memory://convoy-test") == ["a"]
    with pytest.raises(AlreadyExistsError):
        _fs.open_file("memory://convoy-test/a", "xb")
    _fs.rmtree("memory://convoy-test")


def test_a_url_whose_backend_is_not_installed_names_the_extra() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(UnimplementedError, match=r"gs:// .*pip install 'convoy\[gcs\]'"):
        _fs.exists("gs://bucket/x")


def test_a_refused_request_is_permission_denied_naming_the_url() -> None:
    # (the S3 test server grants everything: the mapping of the backends' PermissionError)
    from convoy.errors import PermissionDeniedError

    error = _fs._translate(PermissionError("Access Denied"), "s3://bkt/key")
    assert isinstance(error, PermissionDeniedError) and "s3://bkt/key" in str(error)
