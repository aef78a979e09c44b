"""``elastic-sidecar admin``: look at a running job and steer it through the coordinator's admin API.

    elastic-sidecar admin status                        # slices, phase, generation, steps
    elastic-sidecar admin status --watch 5              # again every 5 s until Ctrl-C
    elastic-sidecar admin status --json | jq .active_slices
    elastic-sidecar admin events --backlog 50 --follow  # the decisions, with their reasons
    elastic-sidecar admin drain 2 --reason "bad ICI link on slice 2"
    elastic-sidecar admin undrain 2 --reason "link replaced"   # undo an operator drain
    elastic-sidecar admin undrain 1 --force --reason "stale notice"   # any drain, a notice's too
    elastic-sidecar admin checkpoint --reason "before the upgrade"   # flush now; prints the committed step
    elastic-sidecar admin hold --reason "node pool upgrade"
    elastic-sidecar admin resume --reason "upgrade done"
    elastic-sidecar admin abort --reason "wrong data" [--restart]

The address defaults to 127.0.0.1:29311 (the admin API listens on loopback:
run it in the coordinator's container, ``kubectl exec ... -c elastic-sidecar``,
or through ``kubectl port-forward``). The token comes from ``--token-file`` or
``ES_ADMIN_TOKEN_FILE``, the same variable the coordinator reads.

Exit codes: 0 done; 1 the job refused the command (FAILED_PRECONDITION: it does
not fit the job's state, e.g. resume while nothing is held) or another server
error; 2 bad usage, unreadable token file, or INVALID_ARGUMENT (the message
names the field); 3 unauthenticated (missing or wrong token); 4 unavailable or
timed out (nothing listens at the address, or --timeout passed); 130 status --watch
stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import grpc

from agent import constants as C
from agent.auth import read_token_file
from agent.config import ConfigError, address, is_loopback, nonneg_int, positive_float
from agent.servers.status import STRAGGLER_FIELDS, status_dict, to_dict
from protos.elastic_sidecar.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_TIMEOUT = 10.0
DEFAULT_CHECKPOINT_TIMEOUT = 120.0
DEFAULT_WATCH_SECONDS = 2.0
# Cursor home, then erase the screen (ECMA-48 CUP and ED), as watch(1) redraws.
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_EXIT_BY_CODE = {
    grpc.StatusCode.OK: C.ADMIN_EXIT_OK,
    grpc.StatusCode.INVALID_ARGUMENT: C.ADMIN_EXIT_USAGE,
    grpc.StatusCode.OUT_OF_RANGE: C.ADMIN_EXIT_USAGE,
    grpc.StatusCode.UNAUTHENTICATED: C.ADMIN_EXIT_UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: C.ADMIN_EXIT_UNAUTHENTICATED,
    grpc.StatusCode.UNAVAILABLE: C.ADMIN_EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: C.ADMIN_EXIT_UNAVAILABLE,
}
_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED: "give the admin token with --token-file or ES_ADMIN_TOKEN_FILE",
    grpc.StatusCode.UNAVAILABLE: "is the coordinator's admin API listening there? see --address or ES_ADMIN_ADDRESS",
    # Another port of the sidecar (peer, trainer link) answers gRPC without the Admin service.
    grpc.StatusCode.UNIMPLEMENTED: (
        f"that address serves gRPC but not the admin API: give --address (ES_ADMIN_ADDRESS) the sidecar's "
        f"--admin-listen (port {C.ADMIN_PORT} by default), not its --listen or --trainer-listen"
    ),
}


def exit_code_for(code: grpc.StatusCode) -> int:
    return _EXIT_BY_CODE.get(code, C.ADMIN_EXIT_REFUSED)


def _connection_options(p: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes, before or after the command name."""

    def d(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    p.add_argument(
        "--address",
        type=address,
        default=d(os.environ.get("ES_ADMIN_ADDRESS", f"127.0.0.1:{C.ADMIN_PORT}")),
        help=f"admin API HOST:PORT (default 127.0.0.1:{C.ADMIN_PORT}; env ES_ADMIN_ADDRESS)",
    )
    p.add_argument(
        "--token-file",
        default=d(os.environ.get("ES_ADMIN_TOKEN_FILE")),
        help="file holding the admin token (env ES_ADMIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--tls-ca-file",
        default=d(os.environ.get("ES_TLS_CA_FILE")),
        help="PEM CA certificate(s): connect over TLS and verify the server with them (env ES_TLS_CA_FILE)",
    )
    p.add_argument(
        "--tls-server-name",
        default=d(None),
        help="name to verify the server certificate against, when it differs from the address's host",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=d(None),
        help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT:g}; checkpoint: "
        f"{DEFAULT_CHECKPOINT_TIMEOUT:g}, also how long the trainer gets to commit)",
    )
    p.add_argument("--json", action="store_true", default=d(False), help="machine-readable output")


def add_admin_args(p: argparse.ArgumentParser) -> None:
    _connection_options(p, top=True)
    sub = p.add_subparsers(
        dest="command", metavar="{status,events,stragglers,hold,resume,checkpoint,drain,undrain,abort}"
    )
    sub.required = True

    def cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        _connection_options(c, top=False)
        return c

    st = cmd("status", "slices with their state and hosts, then phase, generation and steps")
    st.add_argument(
        "--watch",
        type=positive_float,
        nargs="?",
        const=DEFAULT_WATCH_SECONDS,
        default=None,
        metavar="SECONDS",
        help=f"show it again every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C (exit 130); "
        "with --json one line each",
    )
    ev = cmd("events", "the coordinator's recent decisions with their reasons (a worker's: its local events)")
    ev.add_argument("--backlog", type=nonneg_int, default=20, help="how many recent decisions first (default 20)")
    ev.add_argument("--follow", action="store_true", help="keep printing new decisions until interrupted")
    cmd(
        "stragglers",
        "each slice's recent lateness at the cross-slice collective and the straggler detector's verdicts "
        "(docs/stragglers.md)",
    )
    for name, what in (
        ("hold", "hold training at the next step boundary (with a flush) until an operator resumes"),
        ("resume", "end an operator hold; training resumes when enough slices are up"),
    ):
        cmd(name, what).add_argument("--reason", required=True, help="why (goes into the logs and the journal)")
    cp = cmd("checkpoint", "make the current step durable now (Orbax save + wait); prints the committed step")
    cp.add_argument("--reason", required=True, help="why (goes into the logs and the journal)")
    dr = cmd("drain", "take a slice out of training at the next step boundary (until a replacement registers)")
    dr.add_argument("slice", type=nonneg_int, help="slice index")
    dr.add_argument("--reason", required=True, help="why (goes into the logs and the journal)")
    ud = cmd(
        "undrain",
        "undo an operator drain: the slice counts again and training grows back onto it once its hosts are up "
        "(a drain started by a maintenance notice lifts with the notice, or with --force)",
    )
    ud.add_argument("slice", type=nonneg_int, help="slice index")
    ud.add_argument("--reason", required=True, help="why (goes into the logs and the journal)")
    ud.add_argument(
        "--force",
        action="store_true",
        help="lift a drain a notice started too (and a drain planned for the slice): for a notice known to be wrong",
    )
    ab = cmd("abort", "stop the job: the trainer flushes and exits 3 (stop) or 42 (--restart: xpk restarts it)")
    ab.add_argument("--reason", required=True, help="why (goes into the logs and the journal)")
    ab.add_argument("--restart", action="store_true", help="exit 42 so xpk restarts the job from its checkpoint")


def _fail(ns: argparse.Namespace, message: str, code: int) -> int:
    print(f"elastic-sidecar admin {ns.command}: {message}", file=sys.stderr)
    return code


def run(ns: argparse.Namespace) -> int:
    """Carry out one admin command; returns the exit code."""
    try:
        token = read_token_file(ns.token_file, "--token-file") if ns.token_file else None
        ca = None
        if ns.tls_ca_file:
            try:
                with open(ns.tls_ca_file, "rb") as f:
                    ca = f.read()
            except OSError as e:
                raise ConfigError(f"--tls-ca-file {ns.tls_ca_file}: cannot read it: {e.strerror or e}") from None
    except ConfigError as e:
        return _fail(ns, str(e), C.ADMIN_EXIT_USAGE)
    if token is not None and ca is None and not is_loopback(ns.address):
        print(
            f"elastic-sidecar admin: warning: sending the admin token to {ns.address} without TLS (--tls-ca-file)",
            file=sys.stderr,
        )
    metadata = token.metadata() if token is not None else None
    if ca is not None:
        options = [("grpc.ssl_target_name_override", ns.tls_server_name)] if ns.tls_server_name else []
        channel = grpc.secure_channel(ns.address, grpc.ssl_channel_credentials(root_certificates=ca), options=options)
    else:
        channel = grpc.insecure_channel(ns.address)
    stub = admin_pb2_grpc.AdminStub(channel)
    try:
        return _COMMANDS[ns.command](ns, stub, metadata)
    except grpc.RpcError as e:
        code = e.code()  # type: ignore[attr-defined]
        hint = _HINTS.get(code)
        detail = e.details() or ""  # type: ignore[attr-defined]
        return _fail(ns, f"{code.name}: {detail}" + (f" ({hint})" if hint else ""), exit_code_for(code))
    finally:
        channel.close()


def _timeout(ns: argparse.Namespace, default: float = DEFAULT_TIMEOUT) -> float:
    return ns.timeout if ns.timeout is not None else default


def _print_json(d: Any) -> None:
    print(json.dumps(d, indent=2), flush=True)


# -- commands -----------------------------------------------------------------


def _status(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    def fetch() -> admin_pb2.Status:
        return stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md, timeout=_timeout(ns))

    if ns.watch is not None:
        return watch_status(fetch, ns.watch, ns.json, sys.stdout)
    st = fetch()
    if ns.json:
        _print_json(status_dict(st))
    else:
        print(render_status(st))
    return C.ADMIN_EXIT_OK


def watch_status(
    fetch: Callable[[], admin_pb2.Status],
    every: float,
    as_json: bool,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show the status every ``every`` seconds until Ctrl-C. A terminal gets each one on a cleared
    screen; a pipe or file gets them one after another (JSON: one line each), with no escape codes.
    A coordinator that stops answering is shown as such and asked again, as it may be restarting."""
    tty = out.isatty()
    try:
        while True:
            try:
                st = fetch()
                text = json.dumps(status_dict(st)) if as_json else render_status(st)
            except grpc.RpcError as e:
                code, detail = e.code(), e.details() or ""  # type: ignore[attr-defined]
                if exit_code_for(code) != C.ADMIN_EXIT_UNAVAILABLE:
                    raise
                if as_json:
                    text = json.dumps({"error": code.name, "detail": detail})
                else:
                    text = f"{code.name}: {detail} (asking again in {every:g} s)"
            if as_json:
                out.write(text + "\n")
            else:
                header = f"every {every:g} s, {time.strftime('%H:%M:%S')} (Ctrl-C to stop)"
                out.write((CLEAR_SCREEN if tty else "") + header + "\n\n" + text + "\n" + ("" if tty else "\n"))
            out.flush()
            sleep(every)
    except KeyboardInterrupt:
        return C.ADMIN_EXIT_INTERRUPTED


def render_status(st: admin_pb2.Status) -> str:
    """The readable status: a table of slices, then the job's phase, generation and steps."""
    rows = [("SLICE", "STATE", "HOSTS", "DETAIL")]
    for sl in st.slices:
        hosts = " ".join(
            f"h{h.host}:{h.node or '?'}"
            + ("" if h.registered and h.healthy else ("(unhealthy)" if h.registered else "(missing)"))
            for h in sl.hosts
        )
        rows.append((str(sl.slice), sl.state, hosts, sl.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + ("  " + r[3] if r[3] else "") for r in rows]
    lines = [ln.rstrip() for ln in lines]
    lines.append("")
    if st.role == "worker":
        lines.append(
            f"worker of {st.job}: slice {st.slice} host {st.host}, {st.phase}, generation {st.generation}, "
            f"coordinator {'connected' if st.coordinator_connected else 'not connected'}"
        )
    else:
        active = ",".join(map(str, st.active_slices)) or "none"
        # The core holds an operator's hold in its waiting phase: say what it is.
        phase = f"held by an operator ({st.phase})" if st.operator_hold else st.phase
        lines.append(f"job {st.job}: phase {phase}, generation {st.generation}, active slices {active}")
        committed = str(st.last_committed_step) if st.last_committed_step >= 0 else "none"
        lines.append(f"steps: last {st.last_step}, committed {committed}")
        min_slices = "all" if st.elastic_min_slice_count == -1 else str(st.elastic_min_slice_count)
        lines.append(
            f"policy: min slices {min_slices}, timeout {st.elastic_timeout_seconds:g} s, "
            f"recoveries used {st.retries_used} of {st.elastic_max_retries}"
        )
        lines.append(
            f"trainer {'attached' if st.trainer_attached else 'not attached'}"
            + ("; held by an operator" if st.operator_hold else "")
        )
    if st.pending_notices:
        lines.append("pending notices:")
        now = time.time()
        for n in st.pending_notices:
            when = f"deadline in {n.deadline_unix - now:.0f} s" if n.deadline_unix else "no deadline"
            lines.append(f"  slice {n.slice}: {n.kind} from {n.source}, {when}: {n.reason}")
    if st.straggler_verdicts or any(x.status not in ("", "healthy") for x in st.straggler_slices):
        standing = [f"slice {x.slice} {x.status}" for x in st.straggler_slices if x.status not in ("", "healthy")]
        lines.append("stragglers: " + (", ".join(standing) or "none now"))
        if st.straggler_verdicts:
            lines.append("  last verdict: " + render_verdict(st.straggler_verdicts[-1]))
    if st.last_reason:
        lines.append(f"last decision: {st.last_reason}")
    return "\n".join(lines)


def _pct(msg: Any, name: str) -> str:
    return f"{getattr(msg, name):.0%}" if msg.HasField(name) else "-"


def render_verdict(v: admin_pb2.StragglerVerdict) -> str:
    who = "the job" if v.scope == "job" else f"slice {v.slice}"
    since = f", since {time.strftime('%H:%M:%S', time.localtime(v.since_unix))}" if v.HasField("since_unix") else ""
    outcome = f" [{v.outcome}]" if v.outcome else ""
    return (
        f"{time.strftime('%H:%M:%S', time.localtime(v.time_unix))} {who}: {v.action} "
        f"(slowdown {_pct(v, 'slowdown')}, lateness {_pct(v, 'lateness')}{since}): {v.reason}{outcome}"
    )


def render_stragglers(st: admin_pb2.Status) -> str:
    """Each slice's standing and recent lateness, then the verdicts, oldest first."""
    lines = [f"straggler detection {'on' if st.straggler_detect else 'off'}"]
    rows = [("SLICE", "STATUS", "STOOD OUT", "LATENESS (oldest first)", "REASON")]
    for x in st.straggler_slices:
        late = " ".join(f"{v:+.0%}" for v in x.lateness) or "-"
        rows.append((str(x.slice), x.status, f"{x.hits}/{x.counted}", late, x.reason))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines += ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    else:
        lines.append("no window judged yet")
    lines.append("verdicts:" if st.straggler_verdicts else "verdicts: none")
    lines += ["  " + render_verdict(v) for v in st.straggler_verdicts]
    return "\n".join(ln.rstrip() for ln in lines)


def _stragglers(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    st = stub.GetStatus(admin_pb2.GetStatusRequest(), metadata=md, timeout=_timeout(ns))
    if st.role != "coordinator":
        return _fail(ns, "stragglers are judged by the coordinator: give its admin address", C.ADMIN_EXIT_USAGE)
    if ns.json:
        doc = status_dict(st)
        _print_json({k: doc.get(k, [] if k != "straggler_detect" else False) for k in STRAGGLER_FIELDS})
    else:
        print(render_stragglers(st))
    return C.ADMIN_EXIT_OK


def render_event(ev: admin_pb2.DecisionEvent) -> str:
    t = time.strftime("%H:%M:%S", time.localtime(ev.time_unix)) + f".{int(ev.time_unix * 1000) % 1000:03d}"
    active = "[" + ",".join(map(str, ev.active_slices)) + "]"
    phases = " (" + ", ".join(f"{k} {v:.3f} s" for k, v in ev.phases.items()) + ")" if ev.phases else ""
    return f"{t}  gen {ev.generation:<3} {ev.phase:<9} {active:<10} {ev.trigger:<18} {ev.reason}{phases}"


def _events(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    req = admin_pb2.WatchEventsRequest(backlog=ns.backlog)
    call = stub.WatchEvents(req, metadata=md, timeout=None if ns.follow else _timeout(ns))
    try:
        count = None
        if not ns.follow:
            # The server says how many backlog records come before the live ones.
            initial = dict(call.initial_metadata() or ())
            count = int(initial.get("backlog-count", ns.backlog))
            if count == 0:
                return C.ADMIN_EXIT_OK
        shown = 0
        for ev in call:
            print(json.dumps(to_dict(ev)) if ns.json else render_event(ev), flush=True)
            shown += 1
            if count is not None and shown >= count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        call.cancel()
    return C.ADMIN_EXIT_OK


def _reply(ns: argparse.Namespace, reply: admin_pb2.CommandReply) -> int:
    if ns.json:
        _print_json(to_dict(reply))
    else:
        print(f"{ns.command}: {reply.reason} (generation {reply.generation}, phase {reply.phase})")
    return C.ADMIN_EXIT_OK


def _hold(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    return _reply(ns, stub.Hold(admin_pb2.HoldRequest(reason=ns.reason), metadata=md, timeout=_timeout(ns)))


def _resume(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    return _reply(ns, stub.Resume(admin_pb2.ResumeRequest(reason=ns.reason), metadata=md, timeout=_timeout(ns)))


def _drain(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    req = admin_pb2.DrainSliceRequest(slice=ns.slice, reason=ns.reason)
    return _reply(ns, stub.DrainSlice(req, metadata=md, timeout=_timeout(ns)))


def _undrain(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    req = admin_pb2.UndrainSliceRequest(slice=ns.slice, reason=ns.reason, force=ns.force)
    return _reply(ns, stub.UndrainSlice(req, metadata=md, timeout=_timeout(ns)))


def _abort(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    req = admin_pb2.AbortRequest(reason=ns.reason, restart=ns.restart)
    return _reply(ns, stub.Abort(req, metadata=md, timeout=_timeout(ns)))


def _checkpoint(ns: argparse.Namespace, stub: admin_pb2_grpc.AdminStub, md: Any) -> int:
    wait = _timeout(ns, DEFAULT_CHECKPOINT_TIMEOUT)
    req = admin_pb2.CheckpointRequest(reason=ns.reason, timeout_seconds=wait)
    t0 = time.monotonic()
    # The server gives up at `wait` and says so; the call deadline leaves room for that answer.
    reply = stub.Checkpoint(req, metadata=md, timeout=wait + 5.0)
    if ns.json:
        d = to_dict(reply)
        d["round_trip_seconds"] = round(time.monotonic() - t0, 3)
        _print_json(d)
    else:
        print(
            f"committed step {reply.committed_step} (flush {reply.flush_seconds:.2f} s, "
            f"generation {reply.generation}, {time.monotonic() - t0:.2f} s in all)"
        )
    return C.ADMIN_EXIT_OK


_COMMANDS = {
    "status": _status,
    "events": _events,
    "stragglers": _stragglers,
    "hold": _hold,
    "resume": _resume,
    "drain": _drain,
    "undrain": _undrain,
    "abort": _abort,
    "checkpoint": _checkpoint,
}
