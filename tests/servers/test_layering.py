"""The operator servers depend on a narrow interface (agent/servers/contract.py), not on the daemons."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVERS = sorted((REPO / "agent" / "servers").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any level (TYPE_CHECKING blocks and function bodies included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_no_server_module_imports_the_coordinator_or_the_worker() -> None:
    assert len(SERVERS) >= 6
    offenders = {
        p.name: sorted(m for m in imported_modules(p) if m in ("agent.coordinator", "agent.worker")) for p in SERVERS
    }
    assert not any(offenders.values()), offenders


def test_auth_does_not_import_config() -> None:
    assert not {m for m in imported_modules(REPO / "agent" / "auth.py") if m == "agent.config"}


def test_importing_the_servers_loads_neither_daemon() -> None:
    code = (
        "import sys, agent.servers.admin, agent.servers.http, agent.servers.status, agent.auth\n"
        "print(sorted(m for m in ('agent.coordinator', 'agent.worker', 'agent.config') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
