"""The benchmarks' own arithmetic without running anything: the combined JSON's provenance, ports,
and detection's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import detection
from bench.__main__ import combine


def section(name: str, sha: str | None, dirty: bool, started: str = "2026-12-01 00:00:00 UTC") -> dict[str, Any]:
    return {
        "name": name,
        "git_sha": sha,
        "dirty": dirty,
        "started_at": started,
        "machine": {"cores": 2},
        "config": {},
        "results": [{"x": 1}],
    }


def test_combined_file_names_the_newest_runs_commit_only_when_every_run_was_clean() -> None:
    one = combine([section("flush", "a" * 40, False), section("scale", "a" * 40, False)])
    assert one["git_sha"] == "a" * 40 and one["dirty"] is False
    assert [r["benchmark"] for r in one["results"]] == ["flush", "scale"]
    later = combine([section("flush", "b" * 40, False, "2026-12-01 02:00:00 UTC"), section("scale", "a" * 40, False)])
    assert later["git_sha"] == "b" * 40 and later["git_shas"] == ["a" * 40, "b" * 40]
    mixed = combine([section("flush", "a" * 40, False), section("scale", "b" * 40, True)])
    assert mixed["git_sha"] is None and mixed["git_shas"] == ["a" * 40, "b" * 40] and mixed["dirty"] is True
    assert combine([section("flush", None, False)])["git_sha"] is None


def test_free_port_never_hands_out_one_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may give a closed port to the next ``bind(0)``; a rig's servers must not share one."""
    from bench import common

    ports = iter([40001, 40001, 40001, 40002])

    class OneSocket:
        def __init__(self, *a: Any) -> None:
            self.port = next(ports)

        def __enter__(self) -> OneSocket:
            return self

        def __exit__(self, *a: Any) -> None:
            pass

        def bind(self, addr: tuple[str, int]) -> None:
            assert addr == ("127.0.0.1", 0)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(common, "_HANDED_OUT", set())
    monkeypatch.setattr(common.socket, "socket", OneSocket)
    assert [common.free_port(), common.free_port()] == [40001, 40002]


def test_a_detection_row_summarises_the_decisions_and_says_what_could_not_run() -> None:
    samples = [
        {"kind": "pubsub_notice", "decision_s": 0.1, "sent_to_decision_s": 0.3, "trigger": "NodeNotice"},
        {"kind": "pubsub_notice", "decision_s": 0.2, "sent_to_decision_s": 0.5, "trigger": "NodeNotice"},
        {"kind": "pubsub_notice", "error": "no decision within 15 s", "trigger": None},
    ]
    r = detection.row("pubsub_notice", samples, None)
    assert (r["runs"], r["errors"], r["decision_seconds_median"], r["decision_seconds_max"]) == (2, 1, 0.15, 0.2)
    assert r["sent_to_decision_seconds_median"] == 0.4 and r["error_reasons"] == ["no decision within 15 s"]
    assert "sent_to_decision_seconds_median" not in detection.row("kill", [{"kind": "kill", "decision_s": 0.01}], None)
    gone = detection.row("pubsub_notice", [], "not available: google-cloud-pubsub is not installed")
    assert gone["available"] is False and gone["runs"] == 0 and "not installed" in gone["note"]


def test_waiting_on_a_process_stops_once_it_has_exited_after_one_last_look() -> None:
    from typing import cast

    from bench.common import wait_until

    class Exited:
        def poll(self) -> int:
            return 0

    proc = cast(Any, Exited())
    looks: list[int] = []
    assert wait_until(lambda: looks.append(1), 60.0, proc=proc) is None
    assert len(looks) == 2, "one look, and one more once the process is seen to have exited"
    answers = iter([None, "written as it ended"])
    assert wait_until(lambda: next(answers), 60.0, proc=proc) == "written as it ended"


def test_the_runner_gives_each_benchmark_a_directory_and_removes_it_unless_asked_to_keep_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bench import __main__ as runner
    from bench import footprint

    seen: list[Path] = []

    def fake_run(root: Path, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
        assert root.is_dir() and quick and repeats == 2
        (root / "log").write_text("x")
        seen.append(root)
        return {"results": []}

    monkeypatch.setattr(footprint, "run", fake_run)
    runner.run_one("footprint", runner.build_parser().parse_args(["footprint", "--quick", "--repeats", "2"]))
    assert not seen[-1].exists(), "a temporary directory is removed"
    ns = runner.build_parser().parse_args(["footprint", "--quick", "--repeats", "2", "--workdir", str(tmp_path)])
    runner.run_one("footprint", ns)
    assert seen[-1] == tmp_path / "footprint" and (seen[-1] / "log").exists(), "--workdir keeps the files"


def test_the_runner_forwards_every_scale_option_under_a_name_scale_run_takes() -> None:
    import inspect

    from bench import __main__ as runner
    from bench import scale

    ns = runner.build_parser().parse_args(["scale", "--sizes", "200", "--streams-per-connection", "2"])
    opts = {k: getattr(ns, k) for k in runner.SCALE_OPTIONS}
    bound = inspect.signature(scale.run).bind(Path("wd"), quick=True, repeats=None, **opts).arguments
    assert bound["sizes"] == [200] and bound["streams_per_connection"] == 2
