"""The light trainer install (packaging/trainer): what the MaxText image takes instead of the daemon.

Its bounds must follow the generated code (the protobuf runtime check in ``*_pb2.py``, the grpcio
check in ``*_pb2_grpc.py``), and ``trainer_hooks`` must import from the wheel with nothing from
the daemon's dependencies, in the real MaxText environment (.venv-maxtext).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
TRAINER_DIST = REPO / "packaging" / "trainer"
GENERATED = REPO / "protos" / "elastic_sidecar" / "v1"
MAXTEXT_VENV = Path(os.environ.get("MAXTEXT_VENV", REPO / ".venv-maxtext"))

# What the daemon needs and the trainer must not (pyproject's other dependencies).
DAEMON_ONLY = ("agent", "structlog", "aiohttp", "prometheus_client", "grpc_health", "grpc_reflection", "yaml")


def gencode_protobuf() -> Version:
    found = set()
    for f in GENERATED.glob("*_pb2.py"):
        m = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", f.read_text())
        assert m, f"{f.name}: no runtime version check"
        found.add(Version(".".join(m.groups())))
    assert len(found) == 1, f"generated with different protobuf versions: {found}"
    return found.pop()


def gencode_grpcio() -> Version:
    found = {
        Version(m)
        for f in GENERATED.glob("*_pb2_grpc.py")
        for m in re.findall(r"GRPC_GENERATED_VERSION = '([^']+)'", f.read_text())
    }
    assert len(found) == 1, found
    return found.pop()


def _check_bounds(requirements: list[str], where: str) -> None:
    reqs = {Requirement(r).name: Requirement(r) for r in requirements}
    pb, grpc = gencode_protobuf(), gencode_grpcio()
    spec = reqs["protobuf"].specifier
    assert spec.contains(str(pb)), f"{where}: protobuf {spec} refuses the gencode's own {pb}"
    older = Version(f"{pb.major}.{pb.minor}.{pb.micro - 1}" if pb.micro else f"{pb.major}.{pb.minor - 1}.99")
    assert not spec.contains(str(older)), f"{where}: protobuf {spec} admits {older}, older than the gencode {pb}"
    assert not spec.contains(f"{pb.major + 1}.0.0"), f"{where}: protobuf {spec} admits the next major"
    gspec = reqs["grpcio"].specifier
    assert gspec.contains(str(grpc)), f"{where}: grpcio {gspec}"
    assert not gspec.contains(f"{grpc.major}.{grpc.minor - 1}.99"), f"{where}: grpcio {gspec} admits older than {grpc}"


def test_trainer_dist_takes_only_grpcio_protobuf_and_packaging_within_the_gencode_bounds() -> None:
    project = tomllib.loads((TRAINER_DIST / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"]
    assert sorted(Requirement(d).name for d in deps) == ["grpcio", "packaging", "protobuf"]
    _check_bounds(deps, "packaging/trainer")


def test_daemon_bounds_follow_the_gencode_too() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    _check_bounds([d for d in deps if Requirement(d).name in ("grpcio", "protobuf")], "pyproject.toml")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(TRAINER_DIST)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=out,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("elastic_sidecar_trainer-*.whl")
    return whl


def test_wheel_holds_the_hooks_and_the_wire_code_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("elastic_sidecar_trainer-")}
    assert top == {"trainer_hooks", "protos"}, top
    assert "trainer_hooks/maxtext/__main__.py" in names and "protos/elastic_sidecar/v1/trainer_pb2_grpc.py" in names
    meta = Parser().parsestr(
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    )
    assert sorted(Requirement(r).name for r in meta.get_all("Requires-Dist")) == ["grpcio", "packaging", "protobuf"]


@pytest.mark.maxtext
def test_hooks_import_from_the_wheel_in_the_maxtext_env_without_the_daemon(wheel: Path, tmp_path: Path) -> None:
    python = MAXTEXT_VENV / "bin" / "python"
    assert python.exists(), f"no MaxText venv at {MAXTEXT_VENV} (make setup-maxtext, or set MAXTEXT_VENV)"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    reqs = [
        Requirement(r)
        for r in Parser().parsestr((next(site.glob("*.dist-info")) / "METADATA").read_text()).get_all("Requires-Dist")
    ]
    script = f"""
import importlib.abc, importlib.metadata as md, sys
blocked = {DAEMON_ONLY!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"the trainer install must not need {{name}}")
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(site)!r})
for r in {[str(r) for r in reqs]!r}:
    from packaging.requirements import Requirement
    req = Requirement(r)
    have = md.version(req.name)
    assert req.specifier.contains(have), f"{{req.name}} {{have}} outside {{req.specifier}}"
import trainer_hooks, trainer_hooks.maxtext.hook, trainer_hooks.link
from protos.elastic_sidecar.v1 import trainer_pb2
assert trainer_hooks.__file__.startswith({str(site)!r}), trainer_hooks.__file__
print("ok", trainer_pb2.DESCRIPTOR.package)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [str(python), "-I", "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok elastic_sidecar.v1"), proc.stderr[-3000:]
