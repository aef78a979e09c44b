"""The hook's version window (trainer_hooks/maxtext/compat.py) and ``python -m trainer_hooks.maxtext --check``.

The table logic runs on injected versions; the ``maxtext`` tests run the real
check in the MaxText venv, once as installed and once with a stand-in
pathwaysutils 0.1.11 first on ``PYTHONPATH`` (nothing is downloaded).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.maxtext.harness import REPO, require_maxtext_venv
from trainer_hooks.maxtext import __main__ as entry
from trainer_hooks.maxtext import compat

VERIFIED = {"maxtext": "0.2.5", "pathwaysutils": "0.1.13", "orbax-checkpoint": "0.12.8", "jax": "0.12.0.1"}


def verdicts(**changed: str | None) -> dict[str, compat.Finding]:
    versions = {**VERIFIED, **{k.replace("_", "-"): v for k, v in changed.items()}}
    return {f.package: f for f in compat.assess(versions)}


def test_the_verified_releases_are_inside_the_window() -> None:
    found = verdicts()
    assert set(found) == set(VERIFIED)
    assert all(f.ok for f in found.values()), [str(f) for f in found.values()]
    assert compat.split(list(found.values()), allow_untested=False) == ([], [])


@pytest.mark.parametrize("version", ["0.1.11", "0.1.12", "0.1.7"])
def test_pathwaysutils_before_0_1_13_is_a_known_defect_even_with_the_override(version: str) -> None:
    found = verdicts(pathwaysutils=version)
    f = found["pathwaysutils"]
    assert (f.verdict, f.version) == ("known defect", version)
    assert "deletes every live array at each elastic event" in f.reason
    assert not f.overridable
    refused, warned = compat.split(list(found.values()), allow_untested=True)
    assert (refused, warned) == ([f], [])


@pytest.mark.parametrize(
    ("package", "version", "bound"),
    [
        ("pathwaysutils", "0.1.14", "<=0.1.13"),
        ("pathwaysutils", "0.2.0.dev1", "<=0.1.13"),
        ("maxtext", "0.2.6", "<=0.2.5"),
        ("maxtext", "0.2.4", ">=0.2.5"),
        ("orbax-checkpoint", "0.12.4", ">=0.12.8"),
        ("jax", "0.12.1", "<=0.12.0.1"),
        ("jax", "0.11.0", ">=0.12.0.1"),
    ],
)
def test_a_release_never_verified_is_untested_and_runs_only_with_the_override(
    package: str, version: str, bound: str
) -> None:
    found = verdicts(**{package: version})
    f = found[package]
    assert f.verdict == "untested" and f.overridable
    assert f.reason.startswith(f"outside {bound}: "), f.reason
    assert [g.package for g in found.values() if not g.ok] == [package]
    assert compat.split(list(found.values()), allow_untested=False) == ([f], [])
    assert compat.split(list(found.values()), allow_untested=True) == ([], [f])


def test_a_missing_package_or_an_unreadable_version_is_named() -> None:
    found = verdicts(orbax_checkpoint=None, jax="not-a-version")
    assert found["orbax-checkpoint"].verdict == "not installed"
    assert str(found["orbax-checkpoint"]).startswith("orbax-checkpoint (not installed): not installed")
    assert (found["jax"].verdict, found["jax"].reason) == ("untested", "not a PEP 440 version")
    refused, warned = compat.split(list(found.values()), allow_untested=True)
    assert [f.package for f in refused] == ["orbax-checkpoint"]
    assert [f.package for f in warned] == ["jax"]


def test_installed_reads_each_package_once_and_marks_the_absent() -> None:
    asked: list[str] = []

    def version(name: str) -> str:
        asked.append(name)
        if name == "jax":
            raise compat.metadata.PackageNotFoundError(name)
        return VERIFIED[name]

    assert compat.installed(version) == {**VERIFIED, "jax": None}
    assert asked == list(compat.PACKAGES)


@pytest.mark.parametrize(("raw", "allow"), [("", False), ("0", False), (" 1 ", True)])
def test_the_override_is_1_or_nothing(raw: str, allow: bool) -> None:
    assert compat.allow_untested_from_env({"ELASTIC_SIDECAR_ALLOW_UNTESTED": raw}) is allow


def test_a_bad_override_value_is_named() -> None:
    with pytest.raises(ValueError, match="ELASTIC_SIDECAR_ALLOW_UNTESTED='yes'"):
        compat.allow_untested_from_env({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "yes"})


class Said(list[tuple[str, dict[str, Any]]]):
    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        self.append((kind, fields))


def start(env: dict[str, str], seams: list[str] | None = None, **changed: str) -> tuple[int | None, Said]:
    said = Said()
    versions = {**VERIFIED, **{k.replace("_", "-"): v for k, v in changed.items()}}
    try:
        compat.check_at_start(said, "hook", env=env, version=versions.__getitem__, seams=lambda: seams or [])
    except SystemExit as e:
        return int(e.code or 0), said
    return None, said


def test_at_start_the_verified_releases_start_silently(capsys: pytest.CaptureFixture[str]) -> None:
    assert start({}) == (None, [])
    assert capsys.readouterr().err == ""


def test_at_start_an_untested_release_exits_2_naming_it_and_the_override(capsys: pytest.CaptureFixture[str]) -> None:
    code, said = start({}, pathwaysutils="0.1.14")
    assert code == 2
    ((kind, fields),) = said
    assert kind == "incompatible"
    assert fields["differs"] == [str(verdicts(pathwaysutils="0.1.14")["pathwaysutils"])]
    err = capsys.readouterr().err
    assert "hook: error: not what the hook was verified against: pathwaysutils 0.1.14: untested" in err
    assert "ELASTIC_SIDECAR_ALLOW_UNTESTED=1" in err


def test_at_start_the_override_runs_an_untested_release_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, said = start({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}, pathwaysutils="0.1.14")
    assert code is None
    assert [kind for kind, _ in said] == ["untested"]
    assert said[0][1]["allowed"][0].startswith("pathwaysutils 0.1.14: untested")
    assert "hook: WARNING: untested release allowed by ELASTIC_SIDECAR_ALLOW_UNTESTED=1" in capsys.readouterr().err


def test_at_start_the_override_does_not_run_a_known_defect(capsys: pytest.CaptureFixture[str]) -> None:
    code, said = start({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}, pathwaysutils="0.1.11", jax="0.12.1")
    assert code == 2
    assert [kind for kind, _ in said] == ["untested", "incompatible"]
    assert said[0][1]["allowed"][0].startswith("jax 0.12.1: untested")
    (differs,) = said[1][1]["differs"]
    assert differs.startswith("pathwaysutils 0.1.11: known defect") and "live array" in differs
    capsys.readouterr()


def test_at_start_a_missing_seam_is_refused_whatever_the_override() -> None:
    code, said = start({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}, seams=["x.y missing (AttributeError; z)"])
    assert code == 2
    assert said == [("incompatible", {"differs": ["x.y missing (AttributeError; z)"]})]


def test_at_start_a_bad_override_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert start({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "true"}) == (2, [])
    assert "ELASTIC_SIDECAR_ALLOW_UNTESTED='true'" in capsys.readouterr().err


def check(env: dict[str, str], **changed: str) -> int:
    versions = {**VERIFIED, **changed}
    return compat.check_command("hook", env=env, version=versions.__getitem__, location=lambda p: f"/site/{p}")


def test_check_prints_every_version_where_it_was_found_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert check({}) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [f"{str(f)}  [/site/{f.package}]" for f in verdicts().values()]
    assert out[-1] == "compatible: every release inside the window"


def test_check_exits_2_for_untested_and_0_under_the_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert check({}, jax="0.13.0") == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("incompatible: jax 0.13.0: untested: outside <=0.12.0.1")
    assert last.endswith("(ELASTIC_SIDECAR_ALLOW_UNTESTED=1 would run it)")
    assert check({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}, jax="0.13.0") == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "compatible with untested releases (allowed)"
    assert "WARNING: untested release allowed by ELASTIC_SIDECAR_ALLOW_UNTESTED=1: jax 0.13.0" in captured.err


def test_check_refuses_a_known_defect_under_the_override_and_says_what_to_install(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert check({"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}, pathwaysutils="0.1.12") == 2
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("incompatible: pathwaysutils 0.1.12: known defect")
    assert "refused even with ELASTIC_SIDECAR_ALLOW_UNTESTED=1: install pathwaysutils>=0.1.13,<=0.1.13" in last


def test_help_renders_every_bound_of_the_table_with_its_reason() -> None:
    text = entry.parser().format_help()
    flat = " ".join(text.split())
    for b in compat.BOUNDS:
        row = [b.package, b.requires, *b.outside.value.split()]
        assert any(line.split()[: len(row)] == row for line in text.splitlines()), row
        assert " ".join(b.reason.split()) in flat, b.reason
    assert "--allow-untested" in text and "ELASTIC_SIDECAR_ALLOW_UNTESTED=1" in text


def test_the_entry_passes_maxtexts_arguments_through_and_spells_the_override_as_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ELASTIC_SIDECAR_ALLOW_UNTESTED", "0")  # restored after the test, whatever main sets
    ran: list[list[str]] = []
    monkeypatch.setattr(entry, "run", ran.append)
    entry.main(["base.yml", "run_name=r", "--check"])
    assert ran == [["base.yml", "run_name=r", "--check"]]  # after MaxText's first argument, all MaxText's
    assert os.environ["ELASTIC_SIDECAR_ALLOW_UNTESTED"] == "0"
    entry.main(["--allow-untested", "--alsologtostderr", "base.yml", "steps=3"])
    assert ran[1] == ["--alsologtostderr", "base.yml", "steps=3"]
    assert os.environ["ELASTIC_SIDECAR_ALLOW_UNTESTED"] == "1"


def test_the_entrys_check_runs_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "run", lambda args: pytest.fail(f"--check started the hook with {args}"))
    monkeypatch.setattr(compat, "check_command", lambda prefix: 7)
    with pytest.raises(SystemExit) as exc:
        entry.main(["--check"])
    assert exc.value.code == 7


# The real check in the MaxText venv: a subprocess, as a user runs it in their image.


def run_check(
    pythonpath: list[Path], *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    python = require_maxtext_venv()
    child = {k: v for k, v in os.environ.items() if k != "ELASTIC_SIDECAR_ALLOW_UNTESTED"}
    child.update(env or {}, PYTHONPATH=os.pathsep.join(str(p) for p in [*pythonpath, REPO]))
    return subprocess.run(
        [str(python), "-m", "trainer_hooks.maxtext", "--check", *extra],
        cwd=REPO,
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
    )


def fake_pathwaysutils(root: Path, version: str) -> Path:
    """A distribution importlib.metadata finds before the installed one: its dist-info and a stub package."""
    (root / f"pathwaysutils-{version}.dist-info").mkdir(parents=True)
    (root / f"pathwaysutils-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: pathwaysutils\nVersion: {version}\n"
    )
    (root / "pathwaysutils").mkdir()
    (root / "pathwaysutils" / "__init__.py").write_text("")
    return root


@pytest.mark.maxtext
def test_check_in_the_maxtext_venv_names_the_versions_and_exits_0() -> None:
    r = run_check([])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for package in compat.PACKAGES:
        (line,) = [ln for ln in lines if ln.startswith(f"{package} ")]
        assert ": ok: inside the verified window" in line, line
    assert any(ln.startswith("maxtext 0.2.5: ok") for ln in lines)
    assert any(ln.startswith("pathwaysutils 0.1.13: ok") for ln in lines)
    assert lines[-1] == "compatible: every release inside the window"


@pytest.mark.maxtext
def test_check_with_pathwaysutils_0_1_11_first_on_the_path_exits_2_naming_the_deletion(tmp_path: Path) -> None:
    fake = fake_pathwaysutils(tmp_path / "site", "0.1.11")
    for env in ({}, {"ELASTIC_SIDECAR_ALLOW_UNTESTED": "1"}):
        r = run_check([fake], env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("pathwaysutils ")]
        assert line.startswith("pathwaysutils 0.1.11: known defect"), line
        assert "deletes every live array at each elastic event" in line
        assert line.endswith(f"[{fake}]"), line
        assert r.stdout.splitlines()[-1].startswith("incompatible: pathwaysutils 0.1.11: known defect")


@pytest.mark.maxtext
def test_check_with_an_untested_pathwaysutils_runs_under_the_flag_with_a_warning(tmp_path: Path) -> None:
    fake = fake_pathwaysutils(tmp_path / "site", "0.1.14")
    refused = run_check([fake])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "pathwaysutils 0.1.14: untested" in refused.stdout
    allowed = run_check([fake], "--allow-untested")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert (
        "WARNING: untested release allowed by ELASTIC_SIDECAR_ALLOW_UNTESTED=1: pathwaysutils 0.1.14" in allowed.stderr
    )


@pytest.mark.maxtext
def test_check_imports_none_of_the_packages_it_checks() -> None:
    python = require_maxtext_venv()
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['trainer_hooks.maxtext', '--check']\n"
        "try:\n"
        "    runpy.run_module('trainer_hooks.maxtext', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'maxtext', 'orbax', 'pathwaysutils', 'numpy'})\n"
        "print('RESULT', code, heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ELASTIC_SIDECAR_ALLOW_UNTESTED", None)
    r = subprocess.run([str(python), "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines()[-1] == "RESULT 0 []", r.stdout + r.stderr
