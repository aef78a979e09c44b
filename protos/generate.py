"""Generate the Python gRPC code for protos/ with grpcio-tools.

    python -m protos.generate            # write next to the .proto files
    python -m protos.generate --out DIR  # write under DIR (the staleness test)

The generated *_pb2*.py files are never edited by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def proto_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "protos").rglob("*.proto"))


def generate(out: Path) -> None:
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *proto_files(),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}: {' '.join(args)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT, help="output root (default: the repository)")
    ns = ap.parse_args(argv)
    generate(ns.out)
    print(f"generated code for {len(proto_files())} proto file(s) under {ns.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
