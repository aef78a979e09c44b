"""Detection: a fault until the coordinator's hold decision, by kind of fault.

A :class:`bench.common.Rig` with the coordinator's journal on: *detection* is the journal's first record
at or after the fault in which the slice is no longer up, *decision* the first with a ``HoldTrainer``.
Kinds: :data:`FAULTS` on the host's processes, and :data:`NOTICES` from a Pub/Sub emulator and the host's
stand-in metadata server, counted from their delivery to the daemon (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

from agent import constants as C
from bench.common import PY, Rig, free_port, log, median, percentile, read_jsonl, rnd, wait_until

JOB = "bench-detect"
SLICES = 4
FAULTS = ("kill", "hang", "not_serving")
NOTICES = ("pubsub_notice", "metadata_notice")
PROJECT = "bench-project"


def pubsub_missing() -> str | None:
    try:
        import google.cloud.pubsub_v1  # noqa: F401
    except ImportError:
        return "not available: google-cloud-pubsub is not installed (pip install 'elastic-sidecar[pubsub]')"
    return None


class DetectionRig(Rig):
    """The rig with a journal; with ``notices``, a Pub/Sub emulator and a metadata server a host."""

    def __init__(self, workdir: Path, notices: bool) -> None:
        self.notices, self.message_id = notices, ""
        self.emulator: Any = None
        self.publisher: Any = None
        self.topic = ""
        args = ["--elastic-min-slice-count", "1", "--elastic-timeout-seconds", "120"]
        args += ["--elastic-max-retries", "100000", "--journal", str(workdir / "journal.jsonl")]
        super().__init__(workdir, JOB, SLICES, coordinator_args=args)
        self.metadata = {s: free_port() for s in range(SLICES)}

    def start(self) -> None:
        self.pubsub_note = pubsub_missing() if self.notices else None
        if self.notices and self.pubsub_note is None:
            from simjob.pubsub_emulator import PubSubEmulator

            try:
                self.emulator = PubSubEmulator(project=PROJECT).start()
            except Exception as e:  # noqa: BLE001 - e.g. no emulator on this machine: the row says so
                self.pubsub_note = f"not available here: {type(e).__name__}: {str(e)[:200]}"
        if self.emulator is not None:
            self.topic, sub = self.emulator.create_topic_and_subscription(PROJECT, f"{JOB}-events", f"{JOB}-events")
            self.publisher = self.emulator.publisher_client()
            self.cmd += ["--pubsub-subscription", sub]
            self.coordinator_env["PUBSUB_EMULATOR_HOST"] = self.emulator.host
        self.start_coordinator()
        for s in range(SLICES):
            self.replace(s)
        self.start_trainer()

    def replace(self, s: int) -> None:
        self.kill_host(s)
        if not self.notices:
            self.start_host(s)
            return
        port = self.metadata[s]
        md = [PY, "-m", "standins.metadata_server", "--port", str(port)]
        self.start_host(s, worker_args=["--metadata-url", f"http://127.0.0.1:{port}/computeMetadata/v1"], extra=[md])

    def running_on_all(self) -> bool:
        recs = read_jsonl(self.workdir / "journal.jsonl")
        return bool(recs) and recs[-1]["phase"] == "running" and recs[-1]["active_slices"] == list(range(SLICES))

    def inject(self, kind: str, s: int) -> float:
        """Cause the fault (or send the notice) for slice ``s``; returns when (wall clock)."""
        group = self.hosts[(s, 0)][0].pid
        t = time.time()
        if kind in ("kill", "hang"):
            os.killpg(group, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        elif kind == "not_serving":
            os.kill(group, signal.SIGUSR1)
        elif kind == "metadata_notice":
            url = f"http://127.0.0.1:{self.metadata[s]}/stand-in/instance/maintenance-event"
            req = urllib.request.Request(url, data=b"TERMINATE_ON_HOST_MAINTENANCE", method="PUT")
            t = time.time()
            with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback stand-in
                r.read()
        else:
            from simjob.notice_samples import gce_system_event

            data, attrs = gce_system_event("terminateOnHostMaintenance", self.node(s, 0), project=PROJECT)
            t = time.time()
            self.message_id = self.publisher.publish(self.topic, data, **attrs).result(timeout=30)
        return t

    def received(self) -> float | None:
        """When the coordinator's subscriber received the last published notice (its log's ``received_at``)."""
        for r in read_jsonl(self.workdir / "coordinator.log"):
            if r.get("message") == "pubsub notice received" and r.get("message_id") == self.message_id:
                return float(r["received_at"])
        return None

    def stop(self) -> None:
        super().stop()
        if self.emulator is not None:
            self.publisher.transport.close()
            self.emulator.stop()


def measure(rig: DetectionRig, kind: str, s: int, timeout: float = 15.0) -> dict[str, Any]:
    # A precondition, not a measurement: on a loaded machine nine processes take long to start and register.
    if not wait_until(rig.running_on_all, 90):
        return {"kind": kind, "slice": s, "error": "the job was not running on every slice before the fault"}
    time.sleep(0.3)
    t = sent = rig.inject(kind, s)

    def found() -> tuple[dict[str, Any] | None, dict[str, Any]] | None:
        recs = [r for r in read_jsonl(rig.workdir / "journal.jsonl") if r["time"] >= t]
        det = next((r for r in recs if s not in r.get("up_slices", [])), None)
        dec = next((r for r in recs if any(a["type"] == "HoldTrainer" for a in r.get("actions", []))), None)
        return (det, dec) if dec is not None and (det is not None or kind in NOTICES) else None

    got = wait_until(found, timeout)
    det, dec = got or (None, None)
    out: dict[str, Any] = {"kind": kind, "slice": s}
    if got and kind == "pubsub_notice":
        arrived = rig.received()
        if arrived is None:
            out["error"] = "decided, but the coordinator did not log when it received the notice"
        else:
            t = arrived
            out["sent_to_decision_s"] = rnd(dec["time"] - sent) if dec else None
    rec = dec or det or {}
    out |= {
        "detection_s": rnd(det["time"] - t) if det else None,
        "decision_s": rnd(dec["time"] - t) if dec else None,
        "trigger": rec.get("trigger"),
        "cause": (rec.get("event_detail") or {}).get("cause"),
        "reason": rec.get("reason", "")[:160],
    }
    if got is None:
        out["error"] = f"no decision within {timeout:g} s"
        for name in ("coordinator.log", f"host-{s}.0.log"):  # why, on stderr where a failing run is read
            f = rig.workdir / name
            log(f"  {name}:\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:] if f.exists() else []))
    if kind == "not_serving":
        os.kill(rig.hosts[(s, 0)][0].pid, signal.SIGUSR1)  # serving again
    else:
        rig.replace(s)
    return out


def row(kind: str, ss: list[dict[str, Any]], note: str | None) -> dict[str, Any]:
    if note:
        return {"kind": kind, "available": False, "runs": 0, "errors": 0, "note": note}
    dec = [x["decision_s"] for x in ss if x.get("decision_s") is not None]
    sent = [x["sent_to_decision_s"] for x in ss if x.get("sent_to_decision_s") is not None]
    errors = sorted({str(x["error"])[:300] for x in ss if x.get("error")})
    return {
        "kind": kind,
        "available": True,
        "runs": len(dec),
        "errors": sum(1 for x in ss if x.get("error")),
        **({"error_reasons": errors} if errors else {}),
        "detection_seconds_median": rnd(median(x.get("detection_s") for x in ss)),
        "decision_seconds_median": rnd(median(dec)),
        "decision_seconds_p90": rnd(percentile(dec, 90)),
        "decision_seconds_max": rnd(max(dec)) if dec else None,
        **(
            {"sent_to_decision_seconds_median": rnd(median(sent)), "sent_to_decision_seconds_max": max(sent)}
            if sent
            else {}
        ),
        "via": sorted({f"{x.get('trigger')}({x['cause']})" if x.get("cause") else str(x.get("trigger")) for x in ss}),
    }


def run(root: Path, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    reps = repeats or (1 if quick else 5)
    samples: list[dict[str, Any]] = []
    notes: dict[str, str | None] = {}

    def one(rig: DetectionRig, kind: str, s: int, rep: int) -> None:
        log(f"detection: {kind} on slice {s} ({rep + 1}/{reps})")
        samples.append(m := measure(rig, kind, s))
        log(f"  -> detection {m.get('detection_s')} s, decision {m.get('decision_s')} s {m.get('error') or ''}")

    # The faults share one rig; each notice round gets a fresh one, because the decision core keeps a
    # slice "draining" after a notice even once its hosts are replaced.
    rigs = [("faults", False, [(k, r) for r in range(reps) for k in FAULTS])]
    rigs += [(f"notices-{r}", True, [(k, r) for k in NOTICES]) for r in range(reps)]
    for name, notices, plan in rigs:
        rig = DetectionRig(root / name, notices)
        try:
            rig.start()
            for i, (kind, rep) in enumerate(plan):
                if kind != "pubsub_notice" or rig.emulator is not None:
                    one(rig, kind, i % (SLICES - 1) + 1, rep)
        finally:
            rig.stop()
        notes["pubsub_notice"] = notes.get("pubsub_notice") or rig.pubsub_note
    rows = [row(k, [x for x in samples if x["kind"] == k], notes.get(k)) for k in FAULTS + NOTICES]
    config: dict[str, Any] = {"slices": SLICES, "repeats": reps, "elastic_min_slice_count": 1}
    config |= {"heartbeat_interval_s": C.HEARTBEAT_INTERVAL_SECONDS, "heartbeat_timeout_s": C.HEARTBEAT_TIMEOUT_SECONDS}
    return {"quick": quick, "results": rows, "config": config, "samples": samples}
