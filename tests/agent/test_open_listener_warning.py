"""A coordinator whose peer port is open beyond loopback without a peer token warns at start."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import cli
from agent import log as logmod


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Stands in for the coordinator's serve(): the start-up up to it, without the daemon."""
    from agent import coordinator

    seen: list[object] = []
    for name in [n for n in os.environ if n.startswith("ES_")]:  # flags' environment defaults
        monkeypatch.delenv(name)

    async def serve(cfg: object) -> int:
        seen.append(cfg)
        return 0

    monkeypatch.setattr(coordinator, "serve", serve)
    yield seen
    # cli.main pointed the logs at the test's captured stdout, closed by now: back onto the real one.
    logmod.configure("json", "warning")


def _start(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert cli.main(["coordinator", "--num-slices", "2", "--trainer-listen", "127.0.0.1:1", *args]) == 0
    return [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]


def test_an_open_peer_port_without_a_token_warns(served: list[object], capsys: pytest.CaptureFixture[str]) -> None:
    lines = _start(capsys, "--listen", "0.0.0.0:0")
    warnings = [ln for ln in lines if ln["severity"] == "WARNING"]
    assert len(warnings) == 1, lines
    assert "--listen 0.0.0.0:0 is not a loopback address" in str(warnings[0]["message"])
    assert "--peer-token-file" in str(warnings[0]["message"])
    assert len(served) == 1  # a warning, not a refusal: the coordinator still starts


@pytest.mark.parametrize("token", [False, True], ids=["loopback", "open-with-token"])
def test_loopback_or_a_peer_token_starts_quietly(
    served: list[object], capsys: pytest.CaptureFixture[str], tmp_path: Path, token: bool
) -> None:
    if token:
        (tmp_path / "peer-token").write_text("s3cret-peer-token-of-some-length\n")
        args = ["--listen", "0.0.0.0:0", "--peer-token-file", str(tmp_path / "peer-token")]
    else:
        args = ["--listen", "127.0.0.1:0"]
    lines = _start(capsys, *args)
    assert not [ln for ln in lines if ln["severity"] == "WARNING"], lines
    assert len(served) == 1
