"""Issue 56 in the demo: a second worker sidecar for host 1.0 runs beside the first for a while.

Two sidecar processes claiming one host (a stale pod beside its replacement, a manifest mistake) must
cost no failure recovery, no shrink and no lost step: the newer one speaks for the host, the older one
is refused and stands by, and the run completes.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from simjob.demo_common import PY, flags
from simjob.harness import DEMO_JOB
from tests.e2e.test_fault_matrix import _said, outcomes, scenario  # noqa: F401 (outcomes: the fixture)

pytestmark = pytest.mark.e2e
BESIDE_SECONDS = 25.0
"""How long the second sidecar runs beside the first."""


def test_a_second_sidecar_for_one_host_costs_no_recovery(outcomes: list[dict[str, Any]], tmp_path: Path) -> None:  # noqa: F811
    with scenario(
        outcomes,
        tmp_path,
        "duplicate-sidecar",
        f"a second worker sidecar for host 1.0 beside the first for {BESIDE_SECONDS:g} s",
        steps=400,
        how="at step 15 a second `agent worker` for slice 1 host 0 (another pod and node, the same Pathways "
        f"worker) starts, and is killed {BESIDE_SECONDS:g} s later",
    ) as sc:
        sc.until_step(15)
        sc.mark_fault()
        job = sc.demo.job  # type: ignore[union-attr]
        cmd = [PY, "-m", "agent", "worker"] + flags(
            job=DEMO_JOB,
            coordinator=job.coord_addr,
            slice=1,
            host=0,
            node="gke-demo-slice1-host0-stale",
            node_pool="demo-pool-1",
            pod=f"{DEMO_JOB}-worker-1-0-stale",
            health_target=f"127.0.0.1:{job.pw_ports[(1, 0)]}",
            log_format="json",
            peer_token_file=job.peer_token_file,
            http_listen="none",
        )
        log = (job.logs / "host-1.0-second.log").open("wb")
        second = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=job.env)
        try:
            end = time.monotonic() + BESIDE_SECONDS
            sc.until("the second sidecar's time", lambda: time.monotonic() >= end, timeout=BESIDE_SECONDS + 30)
            assert second.poll() is None, "the second sidecar exited"
        finally:
            second.kill()
            second.wait()
            log.close()
        sc.finish()
        sc.check()
        sc.no_shrink()
        sc.retries(0)
        said = [_said(ln) for ln in (job.logs / "coordinator.log").read_text().splitlines()]
        sc.notes["coordinator_said"] = next((ln for ln in said if "two sidecars claim one host" in ln), None)
        assert sc.notes["coordinator_said"], "the coordinator never reported the two sidecars"
