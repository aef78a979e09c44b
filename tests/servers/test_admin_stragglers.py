"""``elastic-sidecar admin stragglers`` and the straggler part of ``admin status``, as a subprocess
against an in-process coordinator whose collector has judged windows."""

from __future__ import annotations

import json
from pathlib import Path

from agent.core.model import StragglerVerdict
from agent.stragglers.collector import _Track, verdict_record
from agent.stragglers.detect import Finding
from tests.servers.conftest import Job
from tests.servers.test_admin_cli import cli


def judged(job: Job) -> None:
    """The collector as after windows in which slice 2 became a straggler and was drained."""
    c = job.coord.stragglers
    for s, status, late in ((0, "healthy", [0.0, -0.01]), (2, "straggler", [0.3, 0.31])):
        tr = _Track()
        tr.lateness.extend(late)
        tr.finding = Finding("slice", s, status, f"slice {s} reason", late[-1], 0.45, 2 if s == 2 else 0, 2)
        c.tracks[s] = tr
    rec = verdict_record(StragglerVerdict(2, "slice", "drain", "keeping it costs more", 0.45, 0.31, 1000.0), 1010.0)
    rec["outcome"] = "draining slice 2"
    c.verdicts.append(rec)


async def test_stragglers_readable_and_json(job: Job, tmp_path: Path) -> None:
    await job.running()
    code, out, err = await cli(job, tmp_path, "stragglers")
    assert code == 0, err
    assert "straggler detection on" in out and "no window judged yet" in out and "verdicts: none" in out
    judged(job)
    code, out, err = await cli(job, tmp_path, "stragglers")
    assert code == 0, err
    rows = out.splitlines()
    assert rows[1].split()[:4] == ["SLICE", "STATUS", "STOOD", "OUT"]
    assert rows[3].split()[:5] == ["2", "straggler", "2/2", "+30%", "+31%"]
    assert "slice 2: drain (slowdown 45%, lateness 31%, since" in out and "[draining slice 2]" in out
    code, out, err = await cli(job, tmp_path, "stragglers", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["straggler_detect"] is True
    assert [(x["slice"], x["status"], x["lateness"]) for x in doc["straggler_slices"]] == [
        (0, "healthy", [0.0, -0.01]),
        (2, "straggler", [0.3, 0.31]),
    ]
    (v,) = doc["straggler_verdicts"]
    assert (v["slice"], v["scope"], v["action"], v["since_unix"], v["outcome"]) == (
        2,
        "slice",
        "drain",
        1000.0,
        "draining slice 2",
    )


async def test_status_shows_the_stragglers_and_the_last_verdict(job: Job, tmp_path: Path) -> None:
    await job.running()
    code, out, err = await cli(job, tmp_path, "status")
    assert code == 0 and "stragglers:" not in out, err
    judged(job)
    code, out, err = await cli(job, tmp_path, "status")
    assert code == 0, err
    assert "stragglers: slice 2 straggler" in out and "last verdict:" in out and "slice 2: drain" in out
    code, out, err = await cli(job, tmp_path, "status", "--json")
    doc = json.loads(out)
    assert doc["straggler_verdicts"][0]["action"] == "drain" and "slice" not in doc  # no worker fields


async def test_the_status_page_lists_the_straggler_verdicts(job: Job, tmp_path: Path) -> None:
    from tests.servers.test_status_page import chromium

    await job.running()
    dom = await chromium(tmp_path, job.http_url + "/", "--dump-dom")
    assert '<div id="stragglers" class="muted">none</div>' in dom
    judged(job)
    dom = await chromium(tmp_path, job.http_url + "/", "--dump-dom")
    assert '<tr data-straggler-slice="2"><td>now</td><td>2</td><td>straggler</td><td>slice 2 reason</td></tr>' in dom
    assert '<tr data-verdict="drain">' in dom and "keeping it costs more [draining slice 2]" in dom
