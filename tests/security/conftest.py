"""Fixtures of the security tests: a secret, a file holding it, and test certificates (made
with the ``openssl`` command)."""

from __future__ import annotations

import pathlib
import secrets
import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def secret() -> str:
    """A fresh shared secret for a module's clusters."""
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def token_file(secret: str, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A file holding ``secret``, readable by its owner only."""
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A folder with a CA (``ca.pem``) and certificates it signed for localhost and
    127.0.0.1, each with its key: ``server`` (servers show it, and the clients they make)
    and ``client`` (a trainer's); plus ``stranger``, signed by another CA."""
    if shutil.which("openssl") is None:
        pytest.skip("making test certificates needs the `openssl` command, which is missing")
    folder = tmp_path_factory.mktemp("certificates")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days",
                 "1", "-subj", f"/CN=convoy test {ca}", "-addext",
                 "basicConstraints=critical,CA:TRUE", "-addext",
                 "keyUsage=critical,keyCertSign,cRLSign", cwd=folder)
    for name, usage, ca in (("server", "serverAuth,clientAuth", "ca"),
                            ("client", "clientAuth", "ca"),
                            ("stranger", "clientAuth", "other-ca")):
        (folder / f"{name}.ext").write_text(
            f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "1",
                 "-extfile", f"{name}.ext", cwd=folder)
    return folder
