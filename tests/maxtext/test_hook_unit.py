"""The MaxText hook without MaxText: a light import, and its decisions against a fake train module.

These run in the main venv in well under a second each (no ``maxtext``
marker): the wrapped ``training_loop_iteration`` is driven by hand, the
session is the real :class:`ElasticSession` over a scripted link, and
MaxText's ``checkpointing`` and ``elastic_utils`` are small fakes.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.constants import EXIT_RESTART
from protos.elastic_sidecar.v1 import trainer_pb2
from trainer_hooks import ElasticSession
from trainer_hooks.maxtext import MaxTextHook
from trainer_hooks.maxtext import hook as hook_module

from ..trainer_hooks.sidecar import FakeSidecar, call_within, free_port
from ..trainer_hooks.sidecar import resume as resume_cmd

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_maxtext_hooks_loads_neither_maxtext_nor_jax() -> None:
    code = (
        "import json, sys\n"
        "import trainer_hooks.maxtext\n"
        "heavy = ('maxtext', 'jax', 'jaxlib', 'pathwaysutils', 'orbax', 'absl', 'agent')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_the_restart_exit_code_is_the_daemons() -> None:
    assert hook_module.EXIT_RESTART == EXIT_RESTART == 42


# ---------------------------------------------------------------------------
# fakes
# ---------------------------------------------------------------------------


class ScriptedLink:
    """A SidecarLink stand-in: commands are queued up front, messages sent are kept."""

    address = "scripted"

    def __init__(self) -> None:
        self.inbox: collections.deque[trainer_pb2.SidecarCommand] = collections.deque()
        self.when_blocked: collections.deque[trainer_pb2.SidecarCommand] = collections.deque()
        """Commands that arrive only once the trainer blocks (the step boundary does not see them)."""
        self.sent: list[trainer_pb2.TrainerMessage] = []

    def send(self, msg: trainer_pb2.TrainerMessage) -> None:
        self.sent.append(msg)

    def next_command(self, timeout: float | None = None, **_: object) -> trainer_pb2.SidecarCommand | None:
        if self.inbox:
            return self.inbox.popleft()
        if self.when_blocked:
            return self.when_blocked.popleft()
        raise AssertionError("the hook waited for a command the test did not script")

    def flush_outbox(self, timeout: float = 2.0) -> None:
        pass

    def close(self) -> None:
        pass

    def kinds(self) -> list[str]:
        return [m.WhichOneof("msg") for m in self.sent]

    def last(self, kind: str) -> Any:
        return getattr([m for m in self.sent if m.WhichOneof("msg") == kind][-1], kind)


def hold(gen: int, flush: bool = False) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(hold=trainer_pb2.Hold(generation=gen, flush=flush, reason="test"))


def resume(gen: int, *slices: int) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(
        resume=trainer_pb2.Resume(generation=gen, active_slices=list(slices), source=trainer_pb2.Resume.MEMORY)
    )


def abort(gen: int, code: int = 42) -> trainer_pb2.SidecarCommand:
    return trainer_pb2.SidecarCommand(abort=trainer_pb2.Abort(generation=gen, exit_code=code, reason="test"))


@dataclass
class Manager:
    labels: list[int] = field(default_factory=list)


@dataclass
class Config:
    elastic_enabled: bool = False
    elastic_min_slice_count: int = -1
    elastic_timeout_seconds: int = 300
    elastic_max_retries: int = 10
    steps: int = 100


class PathwaysManager:
    """pathwaysutils' ``Manager`` as far as the hook's seam touches it (two CPU slices of two devices)."""

    def __init__(self) -> None:
        devs = [types.SimpleNamespace(id=i) for i in range(4)]
        self.slice_to_devices = {0: devs[:2], 1: devs[2:]}
        self.all_slice_indices = frozenset(self.slice_to_devices)
        self._active_slice_indices: frozenset[int] = frozenset()
        self.available_inactive_slices: frozenset[int] = frozenset()
        self.active_slice_indices = self.all_slice_indices
        self.retry_kwargs: dict[str, Any] = {}

    @property
    def active_slice_indices(self) -> frozenset[int]:
        return self._active_slice_indices

    @active_slice_indices.setter
    def active_slice_indices(self, value: Any) -> None:
        self._active_slice_indices = frozenset(value)

    def elastic_retry(self, **kwargs: Any) -> Any:
        self.retry_kwargs = kwargs
        return lambda f: f


@pytest.fixture
def fake_maxtext(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """``maxtext.common.checkpointing`` and ``maxtext.utils.elastic_utils``, as far as the hook uses them."""
    ckpt = types.ModuleType("maxtext.common.checkpointing")
    ckpt.wait_until_finished = lambda m: None  # type: ignore[attr-defined]
    ckpt.all_steps = lambda m: list(m.labels)  # type: ignore[attr-defined]

    def save_checkpoint(m: Manager, step: int, state: Any, config: Any, it: Any, force: bool = False) -> bool:
        assert force, "a flush must force the save past MaxText's checkpoint_period"
        m.labels.append(step)
        return True

    ckpt.save_checkpoint = save_checkpoint  # type: ignore[attr-defined]

    def load_state_if_possible(
        checkpoint_manager: Manager | None,
        data_iterator: Any,
        load_parameters_from_path: str,
        load_full_state_from_path: str,
        checkpoint_storage_concurrent_gb: int,
        abstract_unboxed_pre_state: Any,
        *rest: Any,
        **kw: Any,
    ) -> tuple[Any, Any]:
        """MaxText's restore: the newest label's state, or nothing."""
        if checkpoint_manager is None or not checkpoint_manager.labels:
            return None, None
        return {"items": ("checkpoint", max(checkpoint_manager.labels) + 1)}, None

    ckpt.load_state_if_possible = load_state_if_possible  # type: ignore[attr-defined]
    elastic = types.ModuleType("maxtext.utils.elastic_utils")
    elastic.elastic_enabled = lambda config: config.elastic_enabled  # type: ignore[attr-defined]
    elastic.elastic_manager = None  # type: ignore[attr-defined]

    def ensure_elastic_manager_initialized(config: Any) -> None:
        if elastic.elastic_manager is None:  # type: ignore[attr-defined]
            elastic.elastic_manager = PathwaysManager()  # type: ignore[attr-defined]

    elastic.ensure_elastic_manager_initialized = ensure_elastic_manager_initialized  # type: ignore[attr-defined]
    pkg, common, utils = (types.ModuleType(n) for n in ("maxtext", "maxtext.common", "maxtext.utils"))
    common.checkpointing = ckpt  # type: ignore[attr-defined]
    utils.elastic_utils = elastic  # type: ignore[attr-defined]
    for name, mod in [
        ("maxtext", pkg),
        ("maxtext.common", common),
        ("maxtext.common.checkpointing", ckpt),
        ("maxtext.utils", utils),
        ("maxtext.utils.elastic_utils", elastic),
    ]:
        monkeypatch.setitem(sys.modules, name, mod)
    return types.SimpleNamespace(checkpointing=ckpt, elastic_utils=elastic)


class Job:
    """A fake ``maxtext.trainers.pre_train.train`` with the hook installed, driven step by step."""

    def __init__(
        self,
        config: Config,
        start_slices: tuple[int, ...] = (0,),
        fail_at: int | None = None,
        *,
        address: str | None = None,
        start: bool = True,
    ) -> None:
        """``address``: connect for real (a gRPC link to a sidecar there) instead of over a scripted link."""
        import numpy as np

        self.config = config
        self.link = ScriptedLink()
        self.link.inbox.append(resume(1, *start_slices))
        self.manager = Manager()
        self.ran: list[int] = []
        self.fail_at = fail_at
        self.settings: Any = None

        def connect(address: str, **kw: Any) -> ElasticSession:
            self.settings = kw["settings"]
            if address != "scripted":
                return ElasticSession.connect(address, **kw)
            return ElasticSession(self.link, flush=kw["flush"], on_event=kw["on_event"])  # type: ignore[arg-type]

        def initialize(argv: list[str]) -> tuple[Config, None]:
            return config, None

        def training_loop_iteration(jds: dict[str, Any], pv: dict[str, Any], imm: dict[str, Any]) -> dict[str, Any]:
            if pv["step"] == self.fail_at:
                import jax

                raise jax.errors.JaxRuntimeError("DATA_LOSS: a slice went away")
            self.ran.append(pv["step"])
            return {}

        self.train = types.ModuleType("fake_train")
        self.train.initialize = initialize  # type: ignore[attr-defined]
        self.train.training_loop_iteration = training_loop_iteration  # type: ignore[attr-defined]
        self.hook = MaxTextHook(address or "scripted", "job", connect=connect).install(self.train)
        self.device_state = {"state": {"w": np.zeros(4, np.float32)}}
        if start:
            self.train.initialize(["train.py"])

    def step(self, step: int) -> None:
        pv = {"step": step, "checkpoint_manager": self.manager, "data_iterator": None}
        self.train.training_loop_iteration(self.device_state, pv, {"config": self.config})

    def run(self, first: int, last: int) -> None:
        for s in range(first, last):
            self.step(s)


# ---------------------------------------------------------------------------
# the decisions
# ---------------------------------------------------------------------------


def test_reports_maxtexts_elastic_flags_and_every_step(fake_maxtext: Any) -> None:
    job = Job(Config(elastic_min_slice_count=2, elastic_timeout_seconds=60, elastic_max_retries=4))
    assert vars(job.settings) == {
        "elastic_min_slice_count": 2,
        "elastic_timeout_seconds": 60.0,
        "elastic_max_retries": 4,
    }
    job.run(0, 3)
    assert job.link.kinds() == ["resumed", "step", "step", "step"]
    assert job.link.last("resumed").restored_from == "fresh"
    assert [m.step.step for m in job.link.sent[1:]] == [1, 2, 3]  # completed steps, 1-based


def test_hold_on_the_same_slices_flushes_and_goes_on_from_memory(fake_maxtext: Any) -> None:
    job = Job(Config())
    job.run(0, 3)
    job.link.inbox.extend([hold(2, flush=True), resume(2, 0)])
    job.run(3, 5)
    held = job.link.last("held")
    assert (held.step, held.committed_step) == (3, 3)
    assert job.manager.labels == [2], "the state after 3 steps is MaxText's label 2"
    assert job.link.last("resumed").restored_from == "memory"
    assert job.ran == [0, 1, 2, 3, 4]


def test_a_flush_of_an_already_committed_step_saves_nothing(fake_maxtext: Any) -> None:
    job = Job(Config())
    job.run(0, 3)
    job.manager.labels.append(2)
    job.link.inbox.append(trainer_pb2.SidecarCommand(flush=trainer_pb2.Flush(generation=1)))
    job.step(3)
    assert job.manager.labels == [2] and job.link.last("flushed").committed_step == 3


def test_without_elastic_a_changed_slice_set_flushes_then_exits_42(fake_maxtext: Any) -> None:
    job = Job(Config(), start_slices=(0, 1))
    job.run(0, 4)
    job.link.inbox.extend([hold(2), resume(2, 0)])
    with pytest.raises(SystemExit) as exc:
        job.step(4)
    assert exc.value.code == 42
    assert job.manager.labels == [3]
    assert job.link.last("flushed").committed_step == 4
    assert job.ran == [0, 1, 2, 3]


def test_with_elastic_a_shrink_raises_data_loss_and_a_grow_scale_up_for_elastic_retry(fake_maxtext: Any) -> None:
    import jax
    from pathwaysutils.elastic import elastic, manager

    job = Job(Config(elastic_enabled=True), start_slices=(0, 1))
    job.run(0, 2)
    job.link.inbox.extend([hold(2), resume(2, 0)])
    with pytest.raises(jax.errors.JaxRuntimeError) as shrink:
        job.step(2)
    assert elastic.is_error_due_to_slice_down(shrink.value)
    assert job.manager.labels == [1]
    job.run(2, 4)  # the next attempt restored the flushed step
    r = job.link.last("resumed")
    assert (r.generation, r.step, list(r.active_slices), r.restored_from) == (2, 2, [0], "checkpoint")

    job.link.inbox.extend([hold(3), resume(3, 0, 1)])
    with pytest.raises(manager.ScaleUpSignalError):
        job.step(4)
    assert job.manager.labels == [1, 3]
    job.step(4)
    r = job.link.last("resumed")
    assert (r.step, list(r.active_slices), r.restored_from) == (4, [0, 1], "checkpoint")


def test_a_data_loss_step_is_reported_before_it_propagates(fake_maxtext: Any) -> None:
    import jax

    job = Job(Config(elastic_enabled=True), fail_at=3)
    job.run(0, 3)
    job.link.when_blocked.extend([hold(2), resume(2, 0)])
    with pytest.raises(jax.errors.JaxRuntimeError):
        job.step(3)
    err = job.link.last("slice_error")
    assert err.step == 3 and "DATA_LOSS" in err.message
    assert job.link.kinds().index("slice_error") < job.link.kinds().index("held")


def test_without_elastic_a_data_loss_step_exits_42_after_the_sidecar_answers(fake_maxtext: Any) -> None:
    job = Job(Config(), fail_at=3)
    job.run(0, 3)
    job.link.when_blocked.extend([hold(2, flush=True), resume(2, 0)])
    with pytest.raises(SystemExit) as exc:
        job.step(3)
    assert exc.value.code == 42
    assert job.link.last("held").committed_step == 3 and job.manager.labels == [2]


def test_abort_flushes_and_exits_with_its_code(fake_maxtext: Any) -> None:
    job = Job(Config())
    job.run(0, 5)
    job.link.inbox.append(abort(1, code=3))
    with pytest.raises(SystemExit) as exc:
        job.step(5)
    assert exc.value.code == 3
    assert job.manager.labels == [4]
    assert job.ran == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------
# the self-guard: a sidecar gone past elastic_timeout_seconds ends in exit 42, never 1
# ---------------------------------------------------------------------------


def _abort_line(err: str) -> dict[str, Any]:
    lines = [ln for ln in err.splitlines() if ln.startswith("trainer_hooks.maxtext: abort ")]
    assert len(lines) == 1, err
    return json.loads(lines[0].split(" ", 2)[2])


def test_no_sidecar_at_start_exits_42_after_maxtexts_elastic_timeout(
    fake_maxtext: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens
    job = Job(Config(elastic_timeout_seconds=1), address=address, start=False)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        call_within(lambda: job.train.initialize(["train.py"]), 10)
    waited = time.monotonic() - t0
    assert exc.value.code == 42
    assert 1.0 <= waited < 3.5
    abort = _abort_line(capsys.readouterr().err)
    assert abort["exit_code"] == 42 and f"no sidecar at {address}" in abort["reason"]
    assert "elastic_timeout_seconds=1" in abort["reason"]
    assert job.manager.labels == [] and job.ran == []


def test_sidecar_gone_during_a_hold_flushes_through_maxtext_then_exits_42(
    fake_maxtext: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeSidecar() as sidecar:
        job = Job(Config(elastic_timeout_seconds=1), address=sidecar.address, start=False)
        started = threading.Thread(target=job.train.initialize, args=(["train.py"],), daemon=True)
        started.start()
        sidecar.send(resume_cmd(1, 0))
        started.join(10)
        assert not started.is_alive()
        job.run(0, 3)
        sidecar.send(hold(2))  # no flush asked: memory suffices
        session = job.hook.session
        assert session is not None
        deadline = time.monotonic() + 10
        while not session._link.inbox:
            assert time.monotonic() < deadline, "the hold never arrived"
            time.sleep(0.005)
        out: dict[str, Any] = {}

        def boundary() -> None:
            try:
                job.step(3)
            except BaseException as e:
                out["error"] = e
            out["at"] = time.monotonic()

        t = threading.Thread(target=boundary, daemon=True)
        t.start()
        ack = sidecar.wait_for_message("held")
        assert (ack.step, ack.committed_step) == (3, -1)
        gone = time.monotonic()
        sidecar.stop()
        t.join(10)
    assert not t.is_alive()
    err = out.get("error")
    assert isinstance(err, SystemExit) and err.code == 42, out
    assert 1.0 <= out["at"] - gone < 3.5
    assert job.manager.labels == [2], "the state after 3 steps, flushed as MaxText's label 2"
    assert job.ran == [0, 1, 2]
    abort = _abort_line(capsys.readouterr().err)
    assert abort["committed_step"] == 3 and "while held" in abort["reason"]


# ---------------------------------------------------------------------------
# one retry budget, the slices decided, the lost slice named, truthful flushes
# ---------------------------------------------------------------------------


def test_retries_the_sidecar_decided_spend_nothing_and_pathwaysutils_never_refuses(fake_maxtext: Any) -> None:
    import jax
    from pathwaysutils.elastic import manager

    job = Job(Config(elastic_enabled=True, elastic_max_retries=2), start_slices=(0, 1))
    mgr = fake_maxtext.elastic_utils.elastic_manager
    mgr.elastic_retry(max_retries=2, timeout=60)
    policy = mgr.retry_kwargs["retry_policy"]
    assert "max_retries" not in mgr.retry_kwargs, "pathwaysutils must not count attempts on its own"
    job.run(0, 1)
    for cycle in range(5):  # shrink and grow, ten attempts: more than elastic_max_retries=2
        gen, step = 2 + 2 * cycle, 1 + cycle
        job.link.inbox.extend([hold(gen), resume(gen, 0)])
        with pytest.raises(jax.errors.JaxRuntimeError) as shrink:
            job.step(step)
        assert policy(2 * cycle + 1, shrink.value) is True
        job.link.inbox.extend([hold(gen + 1), resume(gen + 1, 0, 1)])
        with pytest.raises(manager.ScaleUpSignalError) as grow:
            job.step(step)
        assert policy(2 * cycle + 2, grow.value) is True
        job.step(step)
    assert job.hook.seam is not None and job.hook.seam.decided_attempts == 10
    assert "slice_error" not in job.link.kinds()


def test_a_slice_loss_outside_a_step_goes_to_the_sidecar_whose_abort_exits_42(fake_maxtext: Any) -> None:
    import jax

    job = Job(Config(elastic_enabled=True), start_slices=(0, 1))
    job.run(0, 2)
    retry = fake_maxtext.elastic_utils.elastic_manager
    seam = job.hook.seam
    assert seam is not None
    job.link.when_blocked.extend([hold(2), resume(2, 0)])
    err = jax.errors.JaxRuntimeError("DATA_LOSS: save failed on slice_index=1")
    assert seam.retry_policy(1, err) is True  # the sidecar resumed on slice 0
    sent = job.link.last("slice_error")
    assert list(sent.slices) == [1] and sent.step == 2
    assert seam.allowed == frozenset({0}) and seam.reported_failures == 1
    retry.active_slice_indices = {0, 1}
    assert retry.active_slice_indices == frozenset({0}), "the next attempt runs on the decided slices only"
    job.link.when_blocked.append(abort(3, 42))
    with pytest.raises(SystemExit) as exc:
        seam.retry_policy(2, jax.errors.JaxRuntimeError("DATA_LOSS: again"))
    assert exc.value.code == 42


def test_a_drained_healthy_slice_stays_out_of_the_mesh_and_never_triggers_a_scale_up(fake_maxtext: Any) -> None:
    import jax
    from pathwaysutils.elastic import manager

    job = Job(Config(elastic_enabled=True, elastic_min_slice_count=1), start_slices=(0, 1))
    mgr = fake_maxtext.elastic_utils.elastic_manager
    job.run(0, 2)
    job.link.inbox.extend([hold(2), resume(2, 0)])  # the operator drains slice 1, which stays healthy
    with pytest.raises(jax.errors.JaxRuntimeError):
        job.step(2)
    mgr.active_slice_indices = {0, 1}  # wait_for_slices: Pathways sees both healthy
    assert mgr.active_slice_indices == frozenset({0})
    mgr.available_inactive_slices = frozenset({1})  # the monitor thread finds slice 1 up
    assert mgr.available_inactive_slices == frozenset(), "MaxText would raise ScaleUpSignalError for it"
    job.link.inbox.extend([hold(3), resume(3, 0, 1)])  # the sidecar grows back: slice 1 allowed again
    with pytest.raises(manager.ScaleUpSignalError):
        job.step(2)
    mgr.active_slice_indices = {0, 1}
    assert mgr.active_slice_indices == frozenset({0, 1})


@pytest.mark.parametrize(
    ("text", "slices"),
    [
        ("DATA_LOSS: Simulated device loss error accessing array on lost device", set()),
        ("DATA_LOSS: worker for slice_index=3 is gone", {3}),
        ("INTERNAL: slice 2 unreachable", {2}),
        ("DEADLINE_EXCEEDED: slices [0, 3] did not answer", {0, 3}),
        ("DATA_LOSS: slice loss at step 5", set()),
    ],
)
def test_names_the_slices_an_error_message_names(text: str, slices: set[int]) -> None:
    from trainer_hooks.maxtext.elastic_seam import slices_named_in

    assert slices_named_in(text) == slices


def test_the_slice_error_report_names_the_lost_slice(fake_maxtext: Any) -> None:
    import jax

    job = Job(Config())

    def failing(jds: Any, pv: Any, imm: Any) -> Any:
        raise jax.errors.JaxRuntimeError("DATA_LOSS: lost the workers of slice_index=1")

    job.run(0, 3)
    job.link.when_blocked.extend([hold(2), resume(2, 0)])
    pv = {"step": 3, "checkpoint_manager": job.manager, "data_iterator": None}
    with pytest.raises(SystemExit):
        job.hook._iteration(failing, job.device_state, pv, {"config": job.config})
    assert list(job.link.last("slice_error").slices) == [1]


def test_a_flush_of_a_consumed_state_is_acknowledged_as_failed_never_committed(fake_maxtext: Any) -> None:
    import jax.numpy as jnp

    job = Job(Config(), fail_at=3)
    job.hook.snapshot_every = 0  # the path without an in-memory snapshot (test_snapshot.py has the other)
    job.run(0, 3)
    w = jnp.zeros(4)
    w.delete()  # MaxText donated it into the step that failed
    job.device_state["state"] = {"w": w}
    job.link.when_blocked.extend([hold(2, flush=True), resume(2, 0)])
    with pytest.raises(SystemExit):
        job.step(3)
    held = job.link.last("held")
    assert "consumed" in held.flush_error and held.committed_step == -1
    assert job.manager.labels == []


def test_a_flush_that_would_read_a_lost_slice_says_so(fake_maxtext: Any) -> None:
    import jax.numpy as jnp

    job = Job(Config(elastic_enabled=True))
    job.hook.snapshot_every = 0  # without an in-memory snapshot the flush can only refuse
    seam = job.hook.seam
    assert seam is not None
    seam.mesh_slices = lambda devices: {0}  # type: ignore[method-assign]
    seam.unhealthy = lambda slices: set(slices)  # type: ignore[method-assign]  # the health check: down
    job.run(0, 3)
    job.device_state["state"] = {"w": jnp.zeros(4)}
    down = trainer_pb2.SidecarCommand(
        hold=trainer_pb2.Hold(generation=2, flush=True, reason="slice 0 lost", down_slices=[0])
    )
    job.link.inbox.extend([down, abort(3, 42)])
    with pytest.raises(SystemExit):
        job.step(3)
    held = job.link.last("held")
    assert "lost slice(s) [0]" in held.flush_error and held.committed_step == -1
    assert job.manager.labels == []


def test_maxtexts_own_periodic_checkpoint_is_reported_once_committed(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hook_module, "PERIODIC_POLL_SECONDS", 0.0)
    cfg = Config()
    cfg.enable_checkpointing = True  # type: ignore[attr-defined]
    cfg.checkpoint_period = 5  # type: ignore[attr-defined]
    cfg.save_checkpoint_on_start = False  # type: ignore[attr-defined]
    job = Job(cfg)
    job.run(0, 7)  # MaxText started saving label 5 after step index 5; not committed yet
    assert "flushed" not in job.link.kinds(), "reported before the save committed"
    job.manager.labels.append(5)
    job.run(7, 8)
    ack = job.link.last("flushed")
    assert (ack.committed_step, ack.flush_error) == (6, "")
    job.run(8, 10)
    job.manager.labels.append(10)
    job.run(10, 13)
    assert [m.flushed.committed_step for m in job.link.sent if m.WhichOneof("msg") == "flushed"] == [6, 11]


def test_a_terminal_elastic_failure_exits_42_with_its_reason(fake_maxtext: Any) -> None:
    import jax
    from pathwaysutils.elastic import manager

    from trainer_hooks.maxtext.hook import terminal_elastic_failure

    try:
        try:
            raise jax.errors.JaxRuntimeError("DATA_LOSS: lost")
        except Exception as e:
            raise manager.ElasticRuntimeError("Elastic attempt 10 failed.") from e
    except Exception as e:
        refused = e
    why = terminal_elastic_failure(refused)
    assert why is not None and "Elastic attempt 10 failed" in why and "DATA_LOSS" in why
    assert terminal_elastic_failure(TimeoutError("Timed out waiting for 2 slices.")) is not None
    assert terminal_elastic_failure(ValueError("a bug")) is None
    job = Job(Config(elastic_enabled=True))
    with pytest.raises(SystemExit) as exc:
        job.hook.terminal(why)
    assert exc.value.code == 42
