"""``elastic-sidecar drill`` against the demo's stand-in Kubernetes API (``demo --kube-api``).

The demo runs in the background; the drill deletes one pod of slice 1 through the official
``kubernetes`` client, which kills that host; the stand-in provisioner brings a replacement, listed
as a new pod. The drill must see every phase and judge that the job held its state.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simjob.ports import free_port

pytest.importorskip("kubernetes")
pytestmark = pytest.mark.e2e


def drill(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "agent", "drill", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_drill_against_the_demo_holds_and_reports_every_phase(tmp_path: Path) -> None:
    admin = f"127.0.0.1:{free_port()}"
    kc = tmp_path / "kubeconfig"
    log = open(tmp_path / "demo.out", "w")  # noqa: SIM115
    demo = subprocess.Popen(
        [sys.executable, "-m", "agent", "demo", "--steps", "600", "--step-seconds", "0.1", "--no-faults"]
        + ["--admin-address", admin, "--kube-api", "--kubeconfig-out", str(kc), "--workdir", str(tmp_path / "job")]
        + ["--replacement-delay", "2", "--run-timeout", "300", "--quiet"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while not kc.exists():
            assert demo.poll() is None, (tmp_path / "demo.out").read_text()
            assert time.monotonic() < deadline, "the demo wrote no kubeconfig"
            time.sleep(0.2)
        common = ["--kubeconfig", str(kc), "--admin-address", admin, "--timeout", "200"]
        # Refused before anything is deleted: exit 2 naming the value.
        bad = drill(*common, "--jobset", "elastic-demo", "--slice", "9")
        assert bad.returncode == 2 and "--slice 9" in bad.stderr, bad.stderr
        bad = drill(*common, "--jobset", "no-such-job", "--slice", "1")
        assert bad.returncode == 2 and "jobset no-such-job" in bad.stderr and "not found" in bad.stderr, bad.stderr

        out = tmp_path / "drill.json"
        run = drill(*common, "--jobset", "elastic-demo", "--slice", "1", "--json", str(out))
        assert run.returncode == 0, run.stdout + run.stderr
        report = json.loads(out.read_text())
        assert report["verdict"] == "held", report
        assert report["lost_steps"] <= 1 and report["jobset_restarts"] == 0, report
        assert report["restored_from"] == "memory", report
        assert report["step_at_deletion"] > 0, "the drill waits for the job to train before it deletes"
        phases = report["phases"]
        for name in ("detected", "held", "resumed", "replacement_running", "grown_back"):
            assert isinstance(phases[f"{name}_seconds"], float | int), phases
        assert phases["detected_seconds"] <= phases["held_seconds"] <= phases["resumed_seconds"], phases
        assert phases["replacement_running_seconds"] <= phases["grown_back_seconds"], phases
        assert report["replacement_pod"] not in (None, report["pod"]), report
        assert report["pod"].startswith("elastic-demo-worker-1-0-"), report
        assert "HELD" in run.stdout
        # The demo killed the host of the deleted pod, as its own kill fault does.
        assert demo.poll() is None
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()
        log.close()
