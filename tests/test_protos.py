"""The checked-in gRPC code is exactly what protoc makes of the .proto files.

When this fails, run ``make protos`` (``python -m protos.generate``) and commit
the regenerated files.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from protos import generate  # noqa: E402

ROOT = generate.ROOT
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def _generated(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in (root / "protos").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("protos-fresh")
    generate.generate(out)
    return _generated(out)


def test_there_are_protos() -> None:
    assert generate.proto_files(), "no .proto files under protos/"
    assert "protos/elastic_sidecar/v1/peer.proto" in generate.proto_files()
    assert "protos/elastic_sidecar/v1/trainer.proto" in generate.proto_files()


def test_every_proto_generates_all_three_files(fresh: dict[str, bytes]) -> None:
    for proto in generate.proto_files():
        stem = proto.removesuffix(".proto")
        for suffix in GENERATED_SUFFIXES:
            assert stem + suffix in fresh, f"protoc made no {stem + suffix}"


def test_checked_in_code_is_not_stale(fresh: dict[str, bytes]) -> None:
    checked_in = _generated(ROOT)
    missing = sorted(set(fresh) - set(checked_in))
    orphans = sorted(set(checked_in) - set(fresh))
    stale = sorted(name for name in set(fresh) & set(checked_in) if fresh[name] != checked_in[name])
    hint = "; run `make protos` (python -m protos.generate) and commit the result"
    assert not missing, f"generated files not checked in: {missing}{hint}"
    assert not orphans, f"generated files without a .proto: {orphans}{hint}"
    assert not stale, f"generated files out of date: {stale}{hint}"


@pytest.mark.parametrize("proto", generate.proto_files())
def test_every_proto_declares_its_package(proto: str) -> None:
    text = (ROOT / proto).read_text()
    assert re.search(r'^syntax = "proto3";', text, re.M), f"{proto} does not declare proto3"
    m = re.search(r"^package\s+([\w.]+)\s*;", text, re.M)
    assert m, f"{proto} has no package"
    # The package follows the directory (protos/elastic_sidecar/v1 -> elastic_sidecar.v1).
    assert m.group(1) == ".".join(Path(proto).parent.parts[1:]), f"{proto}: package {m.group(1)}"


@pytest.mark.parametrize("proto", generate.proto_files())
def test_generated_modules_import(proto: str) -> None:
    dotted = proto.removesuffix(".proto").replace("/", ".")
    pb2 = importlib.import_module(dotted + "_pb2")
    grpc_mod = importlib.import_module(dotted + "_pb2_grpc")
    assert pb2.DESCRIPTOR.name == proto
    assert pb2.DESCRIPTOR.package == ".".join(Path(proto).parent.parts[1:])
    assert pb2.DESCRIPTOR.message_types_by_name, f"{proto} defines no messages"
    for service in pb2.DESCRIPTOR.services_by_name:
        for suffix in ("Stub", "Servicer"):
            assert hasattr(grpc_mod, service + suffix), f"{dotted}_pb2_grpc has no {service}{suffix}"
        assert hasattr(grpc_mod, f"add_{service}Servicer_to_server")
