"""The production wheel holds the daemon and the hooks only; a source checkout still runs the demo.

The wheel (what the image installs, pyproject.toml) is built from a copy of the sources, the
demo's packages included, and must leave simjob, standins and bench out; the daemon's CLI from
that wheel alone (no checkout on sys.path) must run and must refuse ``demo`` with a clear line.
``make setup`` installs the checkout editable, and such an install must import the demo's packages
from the tree. Neither build may warn of a deprecation in the project's own configuration.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEEL_PACKAGES = {"agent", "trainer_hooks", "protos"}
SOURCE_ONLY = {"simjob", "standins", "bench"}


def _copy_sources(dst: Path) -> Path:
    src = dst / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in sorted(WHEEL_PACKAGES | SOURCE_ONLY):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    return src


# What setuptools prints when a project's configuration uses something it will remove.
DEPRECATIONS = ("DeprecationWarning", "BuildBackendWarning", "is deprecated", "will be removed")


def _pip(python: str, *args: str, cwd: Path) -> str:
    """Run pip; returns its verbose output, where the build backend's warnings show."""
    # --no-build-isolation: the build backend comes from this venv (setuptools is pinned in
    # constraints.txt), so the build needs no download.
    r = subprocess.run(
        [python, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "--no-input", "-v"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def _deprecations(output: str) -> list[str]:
    return [ln.strip() for ln in output.splitlines() if any(d in ln for d in DEPRECATIONS)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(tmp)
    output = _pip(sys.executable, "wheel", ".", "-w", str(tmp / "dist"), cwd=src)
    assert not _deprecations(output), _deprecations(output)
    (whl,) = (tmp / "dist").glob("elastic_sidecar-*.whl")
    return whl


def test_the_wheel_holds_the_daemon_and_the_hooks_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == WHEEL_PACKAGES, f"top-level entries {sorted(top)}"
    assert not [n for n in names if n.split("/")[0] in SOURCE_ONLY or "/tests/" in n]
    # What the daemon needs at run time is there: the generated code and the .proto files.
    assert any(n.startswith("protos/elastic_sidecar/v1/") and n.endswith("_pb2.py") for n in names)
    assert any(n.endswith(".proto") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "elastic-sidecar = agent.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def _run_from_wheel(wheel: Path, tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` with the wheel's files and this venv's dependencies, and nothing of the checkout:
    -I leaves out the working directory and the environment, -S the site .pth files (among them
    the editable install's, which would find the checkout)."""
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    paths = [str(unpacked), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    prelude = f"import sys; sys.path[:0] = {paths!r}\n"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("args", [[], ["--steps", "20"], ["--mode", "multi-controller", "--fault", "x"]])
def test_the_wheels_cli_runs_without_the_demo(wheel: Path, tmp_path: Path, args: list[str]) -> None:
    """Whatever the demo's arguments, the installed CLI answers with one line: it needs a checkout."""
    r = _run_from_wheel(
        wheel,
        tmp_path,
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('simjob') is None, 'simjob reachable'\n"
        "from agent.cli import main\n"
        f"code = main(['demo', *{args!r}])\n"
        "assert 'simjob' not in sys.modules\n"
        "sys.exit(code)\n",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("elastic-sidecar demo:") and "source checkout" in lines[0], lines
    assert "git clone" in lines[0] and "make demo" in lines[0], lines
    assert "unrecognized" not in r.stderr


def test_the_wheels_cli_still_refuses_unknown_arguments(wheel: Path, tmp_path: Path) -> None:
    fixture = REPO / "tests" / "deploy" / "fixtures" / "xpk-pathways.yaml"
    r = _run_from_wheel(
        wheel, tmp_path, f"from agent.cli import main; raise SystemExit(main(['inject', {str(fixture)!r}, '--bogus']))"
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unrecognized arguments: --bogus" in r.stderr


def test_the_wheels_cli_injects(wheel: Path, tmp_path: Path) -> None:
    fixture = REPO / "tests" / "deploy" / "fixtures" / "xpk-pathways.yaml"
    r = _run_from_wheel(
        wheel, tmp_path, f"from agent.cli import main; raise SystemExit(main(['inject', {str(fixture)!r}]))"
    )
    assert r.returncode == 0, r.stderr
    assert "trainer_hooks.maxtext" in r.stdout


def test_the_makefile_installs_the_checkout_editable_in_the_default_mode() -> None:
    """setuptools deprecates compat mode; the project's package-dir gives the same .pth without it."""
    text = (REPO / "Makefile").read_text()
    installs = [ln for ln in text.splitlines() if "pip install" in ln and " -e " in ln]
    assert len(installs) >= 2, installs
    assert "editable_mode" not in text


def test_a_compat_editable_install_imports_the_demo_from_the_tree(tmp_path: Path) -> None:
    """What ``make setup`` does, without dependencies: the demo's packages come from the checkout."""
    src = _copy_sources(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The build backend from this venv (a .pth line adds its site-packages; its own .pth files,
    # the checkout's editable finder among them, are not read from there).
    Path(site, "build-backend.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    output = _pip(python, "install", "-e", ".", cwd=src)
    assert not _deprecations(output), _deprecations(output)
    r = subprocess.run(
        [python, "-I", "-c", "import simjob, standins, bench, agent; print(simjob.__file__, agent.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(src / "simjob" / "__init__.py"), str(src / "agent" / "__init__.py")]
