"""Fixtures shared across the test packages."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from convoy.data.service._common import invariants

# The dispatcher's and workers' states check their invariants after every event: in this
# process, and in the servers the tests start (they inherit the environment).
os.environ["CONVOY_VALIDATE_STATE"] = "1"
invariants.ENABLED = True


class UserModules:
    """The user's own modules, in a directory on this process's ``sys.path`` (as a script's
    directory is; not on ``PYTHONPATH``, so child processes cannot import them)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        sys.path.insert(0, str(root))

    def __call__(self, files: dict[str, str]) -> list[ModuleType]:
        """Write ``files`` ({"pkg/__init__.py": source, ...}) and import each module."""
        for name, source in files.items():
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            (self.root / name).write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return [importlib.import_module(_module_name(name)) for name in files]

    def hide(self) -> None:
        """Make the modules unimportable here too, as they are on a worker."""
        if str(self.root) in sys.path:
            sys.path.remove(str(self.root))
        for name, module in list(sys.modules.items()):
            if str(getattr(module, "__file__", None) or "").startswith(str(self.root)):
                del sys.modules[name]


def _module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.fixture
def user_modules(tmp_path: Path) -> Iterator[UserModules]:
    modules = UserModules(tmp_path / "user_code")
    yield modules
    modules.hide()


@pytest.fixture(scope="module")
def training_cluster() -> Iterator[Any]:
    """Two workers and two parameter servers (a TrainingCluster), shared by a module's tests."""
    from convoy.testing import TrainingCluster

    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _s3_server() -> Iterator[str]:
    """An S3-compatible server (moto's) on a free local port, for the whole session."""
    server_module = pytest.importorskip("moto.server")
    from convoy.testing import free_port

    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(_s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<fresh bucket>`` on the test server, the ``AWS_*`` variables pointing at it
    (in this process and in the processes it starts)."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", _s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"bkt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=_s3_server).create_bucket(Bucket=name)
    return f"s3://{name}"
