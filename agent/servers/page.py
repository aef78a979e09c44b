"""The one-page status view served on ``/``: no external assets, refreshes from ``/status`` every second.

The HTML carries no job data; the inline script fetches ``status`` (relative,
so it also works behind ``kubectl port-forward`` or a path-prefix proxy) and
builds the page with ``textContent`` only: reasons are operator text.
"""

STATUS_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>elastic-sidecar</title>
<style>
  :root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2330; background: #f5f6f8; }
  body { margin: 0; padding: 16px 24px; }
  h1 { font-size: 18px; margin: 0 0 4px; }
  h2 { font-size: 14px; margin: 18px 0 6px; text-transform: uppercase; letter-spacing: .05em; color: #5a6275; }
  #summary { display: flex; flex-wrap: wrap; gap: 8px 20px; font-size: 14px; margin: 8px 0; }
  #summary b { font-variant-numeric: tabular-nums; }
  .phase { padding: 2px 10px; border-radius: 10px; color: #fff; background: #5a6275; font-weight: 600; }
  .phase-running { background: #1e8e3e; } .phase-holding, .phase-waiting { background: #e37400; }
  .phase-failed { background: #c5221f; } .phase-completed { background: #1a73e8; }
  #slices { display: flex; flex-wrap: wrap; gap: 10px; }
  .slice { width: 150px; min-height: 84px; border-radius: 6px; padding: 8px 10px; color: #fff;
           box-shadow: 0 1px 2px rgba(0,0,0,.2); font-size: 12px; }
  .slice .name { font-size: 15px; font-weight: 700; }
  .slice .state { text-transform: uppercase; font-weight: 600; letter-spacing: .04em; }
  .slice ul { margin: 4px 0 0; padding-left: 14px; }
  .slice .detail { margin-top: 4px; opacity: .9; }
  .state-active { background: #1e8e3e; } .state-up { background: #1a73e8; }
  .state-draining { background: #e37400; } .state-down { background: #c5221f; }
  table { border-collapse: collapse; font-size: 13px; width: 100%; background: #fff; }
  th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e3e5ea; vertical-align: top; }
  th { color: #5a6275; font-weight: 600; }
  td.t { white-space: nowrap; font-variant-numeric: tabular-nums; color: #5a6275; }
  #error { display: none; background: #fce8e6; color: #a50e0e; padding: 6px 10px; border-radius: 4px; margin: 8px 0; }
  .muted { color: #5a6275; font-size: 13px; }
</style>
</head>
<body>
<h1 id="title">elastic-sidecar</h1>
<div id="error"></div>
<div id="summary"></div>
<h2>Slices</h2>
<div id="slices"><span class="muted">loading...</span></div>
<h2>Pending notices</h2>
<div id="notices" class="muted">none</div>
<h2>Stragglers</h2>
<div id="stragglers" class="muted">none</div>
<h2>Recovery timeline</h2>
<table id="timeline"><thead><tr><th>time</th><th>gen</th><th>phase</th><th>trigger</th><th>reason</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function clock(unix) {
  if (!unix) return "";
  const d = new Date(unix * 1000);
  return d.toLocaleTimeString([], {hour12: false}) + "." + String(d.getMilliseconds()).padStart(3, "0");
}
function render(s) {
  document.getElementById("title").textContent =
    "elastic-sidecar " + s.role + (s.job ? " \u2014 " + s.job : "");
  const sum = document.getElementById("summary");
  sum.replaceChildren();
  sum.append(el("span", {"class": "phase phase-" + s.phase, "id": "phase"}, s.phase));
  const facts = [["generation", s.generation], ["step", s.last_step], ["committed", s.last_committed_step]];
  if (s.role === "coordinator") {
    facts.push(["active", (s.active_slices || []).join(",") || "-"],
               ["retries", s.retries_used + "/" + s.elastic_max_retries],
               ["min slices", s.elastic_min_slice_count],
               ["trainer", s.trainer_attached ? "attached" : "detached"]);
    if (s.trainer_processes > 1)
      facts.push(["processes", (s.trainer_processes_attached || []).length + "/" + s.trainer_processes + " attached"]);
    if (s.operator_hold) facts.push(["operator", "hold"]);
  } else {
    facts.push(["slice", s.slice], ["host", s.host], ["coordinator", s.coordinator_connected ? "connected" : "not connected"]);
  }
  for (const [k, v] of facts) {
    const span = el("span", {}, k + " ");
    span.append(el("b", {}, v));
    sum.append(span);
  }
  const box = document.getElementById("slices");
  box.replaceChildren();
  for (const sl of s.slices || []) {
    const d = el("div", {"class": "slice state-" + sl.state, "data-slice": sl.slice, "data-state": sl.state});
    d.append(el("div", {"class": "name"}, "slice " + sl.slice), el("div", {"class": "state"}, sl.state));
    const ul = el("ul");
    for (const h of sl.hosts || []) {
      const mark = !h.registered ? "not registered" : (h.healthy ? "ok" : "unhealthy");
      ul.append(el("li", {}, "h" + h.host + " " + (h.node || "?") + " (" + mark + ")"));
    }
    d.append(ul);
    if (sl.detail) d.append(el("div", {"class": "detail"}, sl.detail));
    box.append(d);
  }
  const notices = document.getElementById("notices");
  notices.replaceChildren();
  const pending = s.pending_notices || [];
  if (!pending.length) notices.textContent = "none";
  else {
    const t = el("table");
    t.append(el("tr"));
    for (const h of ["slice", "kind", "source", "deadline", "reason"]) t.lastChild.append(el("th", {}, h));
    for (const n of pending) {
      const left = n.deadline_unix ? Math.round(n.deadline_unix - Date.now() / 1000) + " s" : "-";
      const tr = el("tr");
      for (const v of [n.slice, n.kind, n.source, left, n.reason]) tr.append(el("td", {}, v));
      t.append(tr);
    }
    notices.append(t);
  }
  const strag = document.getElementById("stragglers");
  strag.replaceChildren();
  const verdicts = s.straggler_verdicts || [];
  const watched = (s.straggler_slices || []).filter(x => x.status && x.status !== "healthy");
  if (!verdicts.length && !watched.length) strag.textContent = s.straggler_detect ? "none" : "detection off";
  else {
    const t = el("table");
    t.append(el("tr"));
    for (const h of ["time", "slice", "action", "reason"]) t.lastChild.append(el("th", {}, h));
    for (const x of watched) {
      const tr = el("tr", {"data-straggler-slice": x.slice});
      for (const v of ["now", x.slice, x.status, x.reason]) tr.append(el("td", {}, v));
      t.append(tr);
    }
    for (const v of verdicts.slice().reverse()) {
      const tr = el("tr", {"data-verdict": v.action});
      const who = v.scope === "job" ? "job" : v.slice;
      for (const c of [clock(v.time_unix), who, v.action, v.reason + (v.outcome ? " [" + v.outcome + "]" : "")])
        tr.append(el("td", {}, c));
      t.append(tr);
    }
    strag.append(t);
  }
  const body = document.querySelector("#timeline tbody");
  body.replaceChildren();
  for (const r of (s.recent_decisions || []).slice().reverse()) {
    const tr = el("tr");
    tr.append(el("td", {"class": "t"}, clock(r.time_unix)), el("td", {}, r.generation), el("td", {}, r.phase),
              el("td", {}, r.trigger), el("td", {}, r.reason));
    body.append(tr);
  }
}
async function refresh() {
  const err = document.getElementById("error");
  try {
    const r = await fetch("status", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    err.style.display = "none";
  } catch (e) {
    err.textContent = "status unavailable: " + e.message + " (retrying every second)";
    err.style.display = "block";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"""
