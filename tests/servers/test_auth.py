"""Token files, listener configuration and TLS of the admin API."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from agent.auth import BearerToken, presented_token, read_token_file
from agent.cli import build_parser
from agent.config import ConfigError, CoordinatorConfig, WorkerConfig
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc
from tests.servers.conftest import start_job, write_token

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_es_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("ES_"):
            monkeypatch.delenv(k)


# ---------------------------------------------------------------------------
# token files
# ---------------------------------------------------------------------------


def test_a_token_file_is_stripped_and_compared_in_constant_time(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  s3cr3t-value\n\n")
    tok = read_token_file(f, "--admin-token-file")
    assert tok.matches("s3cr3t-value") and not tok.matches("s3cr3t-valu") and not tok.matches("")
    assert not tok.matches("s3cr3t-välue")
    assert tok.metadata() == (("authorization", "Bearer s3cr3t-value"),)
    assert "s3cr3t" not in repr(tok) and str(f) in repr(tok)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", ["is empty"]),
        (" \n\t\n", ["is empty"]),
        ("REPLACE-ME-admin-token\n", ["placeholder", "REPLACE-ME", "deploy/README.md"]),
        ("two words", ["printable ASCII", "' '"]),
        ("tökén", ["printable ASCII"]),
    ],
    ids=["empty", "blank", "placeholder", "space", "non-ascii"],
)
def test_bad_token_files_are_refused_naming_the_flag_and_file(tmp_path: Path, content: str, words: list[str]) -> None:
    f = tmp_path / "token"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        read_token_file(f, "--peer-token-file")
    assert str(e.value).startswith(f"--peer-token-file {f}")
    for w in words:
        assert w in str(e.value)


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--admin-token-file .*nope: no such file"):
        read_token_file(tmp_path / "nope", "--admin-token-file")


def test_presented_token_parsing() -> None:
    assert presented_token(()) is None
    assert presented_token((("authorization", "Bearer abc"),)) == "abc"
    assert presented_token((("authorization", "bearer  abc "),)) == "abc"
    assert presented_token((("authorization", "Basic abc"),)) == ""
    assert presented_token((("x-other", "Bearer abc"),)) is None


def test_the_daemon_refuses_a_placeholder_token_at_start_with_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("REPLACE-ME-peer-token\n")
    r = subprocess.run(
        [sys.executable, "-m", "agent", "worker", "--slice", "0", "--peer-token-file", str(f)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"elastic-sidecar worker: --peer-token-file {f} holds the repository's placeholder")
    assert "Traceback" not in r.stderr and not r.stdout


# ---------------------------------------------------------------------------
# listener flags
# ---------------------------------------------------------------------------


def coordinator(*argv: str) -> CoordinatorConfig:
    return CoordinatorConfig.from_args(build_parser().parse_args(["coordinator", "--num-slices", "2", *argv]))


def test_listener_defaults_and_none(tmp_path: Path) -> None:
    cfg = coordinator()
    assert (cfg.admin_listen, cfg.http_listen) == ("127.0.0.1:29311", "127.0.0.1:29312")
    assert cfg.admin_token is None and cfg.peer_token is None and cfg.tls_cert is None
    cfg = coordinator("--admin-listen", "none", "--http-listen", "NONE")
    assert (cfg.admin_listen, cfg.http_listen) == (None, None)
    w = WorkerConfig.from_args(build_parser().parse_args(["worker", "--slice", "1"]))
    assert (w.admin_listen, w.http_listen, w.peer_token) == (None, None, None)
    w = WorkerConfig.from_args(
        build_parser().parse_args(
            ["worker", "--slice", "1", "--http-listen", "0.0.0.0:29312", "--admin-listen", "127.0.0.1:0"]
        )
    )
    assert (w.http_listen, w.admin_listen) == ("0.0.0.0:29312", "127.0.0.1:0")


def test_env_fallbacks_for_the_new_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_token(tmp_path / "admin", "admin-token-value")
    monkeypatch.setenv("ES_ADMIN_TOKEN_FILE", str(tmp_path / "admin"))
    monkeypatch.setenv("ES_HTTP_LISTEN", "none")
    cfg = coordinator()
    assert cfg.admin_token is not None and cfg.admin_token.matches("admin-token-value")
    assert cfg.http_listen is None


def test_a_non_loopback_admin_address_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--admin-listen 0\.0\.0\.0:29311 is not a loopback address"):
        coordinator("--admin-listen", "0.0.0.0:29311")
    write_token(tmp_path / "t")
    assert coordinator("--admin-listen", "0.0.0.0:29311", "--admin-token-file", str(tmp_path / "t")).admin_token
    assert coordinator("--admin-listen", "[::1]:29311").admin_listen == "[::1]:29311"
    assert coordinator("--admin-listen", "localhost:29311").admin_listen == "localhost:29311"


def test_tls_needs_both_files_in_pem(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="--tls-cert-file needs --tls-key-file too"):
        coordinator("--tls-cert-file", str(tmp_path / "c.pem"))
    with pytest.raises(ConfigError, match="--tls-key-file needs --tls-cert-file too"):
        coordinator("--tls-key-file", str(tmp_path / "c.pem"))
    with pytest.raises(ConfigError, match=r"--tls-cert-file .*c\.pem: expected a PEM file with a CERTIFICATE block"):
        coordinator("--tls-cert-file", str(tmp_path / "c.pem"), "--tls-key-file", str(tmp_path / "c.pem"))


# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test needs the openssl command (Debian package openssl)"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=elastic-sidecar-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def test_the_admin_api_over_tls_with_the_cli(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    token = write_token(tmp_path / "admin-token")
    j = await start_job(tmp_path, admin_token=token, tls_cert=cert.read_bytes(), tls_key=key.read_bytes())
    try:
        assert j.coord.admin is not None and j.coord.admin.tls
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel(j.admin_address, creds) as ch:
            st = await admin_pb2_grpc.AdminStub(ch).GetStatus(admin_pb2.GetStatusRequest(), metadata=token.metadata())
        assert st.role == "coordinator"
        base = [sys.executable, "-m", "agent", "admin", "--address", j.admin_address]
        base += ["--token-file", str(tmp_path / "admin-token"), "--timeout", "5"]

        async def cli(*argv: str) -> tuple[int, str, str]:
            p = await asyncio.create_subprocess_exec(
                *argv, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(p.communicate(), 60)
            assert p.returncode is not None
            return p.returncode, out.decode(), err.decode()

        code, out, err = await cli(*base, "--tls-ca-file", str(cert), "status", "--json")
        assert code == 0, err
        assert '"role": "coordinator"' in out
        # Plain text against a TLS port: nothing sensible answers.
        code, _, err = await cli(*base, "status")
        assert code == 4 and "UNAVAILABLE" in err, err
        # A CA that did not sign the server's certificate: refused by the client.
        (tmp_path / "other").mkdir()
        other, _ = self_signed(tmp_path / "other")
        code, _, err = await cli(*base, "--tls-ca-file", str(other), "status")
        assert code == 4 and "UNAVAILABLE" in err, err
    finally:
        await j.coord.stop(grace=0.1)


def test_bearer_token_equality_does_not_leak() -> None:
    a, b = BearerToken("x" * 10, "a"), BearerToken("x" * 10, "b")
    assert a == b and a != BearerToken("y" * 10, "a")
