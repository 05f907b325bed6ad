"""The file-system layer on local paths, memory:// and the S3 test server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from convoy._base import fs as _fs
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


def test_the_backends_permission_error_is_permission_denied_naming_the_url() -> None:
    from convoy.errors import PermissionDeniedError

    error = _fs._translate(PermissionError("Access Denied"), "s3://bkt/key")
    assert isinstance(error, PermissionDeniedError) and "s3://bkt/key" in str(error)


def _server_checks_credentials(endpoint: str, after: str) -> str:
    """Make the S3 test server check every request's credentials and IAM policies after
    ``after`` more requests ("inf": never); returns its previous setting."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=after.encode(),
                                     headers={"Content-Type": "text/plain"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.loads(answer.read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"])


@pytest.fixture
def read_only(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``(bucket URL, its object data.bin)`` on the S3 server checking credentials, the
    ``AWS_*`` keys those of an IAM user allowed only to read."""
    import json

    import boto3

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    boto3.client("s3", endpoint_url=endpoint).put_object(
        Bucket=s3_bucket.removeprefix("s3://"), Key="data.bin", Body=b"abc")
    iam = boto3.client("iam", endpoint_url=endpoint)
    iam.create_user(UserName="reader")
    allowed = {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [allowed]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    previous = _server_checks_credentials(endpoint, "0")
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        yield s3_bucket, f"{s3_bucket}/data.bin"
    finally:
        _server_checks_credentials(endpoint, previous)
        iam.delete_access_key(UserName="reader", AccessKeyId=key["AccessKeyId"])
        iam.delete_user_policy(UserName="reader", PolicyName="read")
        iam.delete_user(UserName="reader")


def test_a_write_the_bucket_policy_refuses_is_permission_denied_naming_the_url(
        read_only: tuple[str, str]) -> None:
    from convoy.errors import PermissionDeniedError
    from convoy.io import gfile

    bucket, readable = read_only
    assert gfile.read_file(readable) == b"abc"  # what the policy allows goes through
    with pytest.raises(PermissionDeniedError, match=f"{bucket}/new.bin"):
        gfile.write_file(f"{bucket}/new.bin", b"x")
    with pytest.raises(PermissionDeniedError, match=f"{bucket}/ckpt"):
        _fs.atomic_write(f"{bucket}/ckpt/checkpoint.json", b"{}")


def test_an_unknown_access_key_is_permission_denied_naming_the_url(
        read_only: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from convoy.errors import PermissionDeniedError
    from convoy.io import gfile

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    _, readable = read_only
    with pytest.raises(PermissionDeniedError, match=readable):
        gfile.read_file(readable)
