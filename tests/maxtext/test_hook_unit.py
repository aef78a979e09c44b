"""The MaxText hook without MaxText: a light import, and its decisions against a fake train module.

These run in the main venv in well under a second each (no ``maxtext``
marker): the wrapped ``training_loop_iteration`` is driven by hand, the
session is the real :class:`ElasticSession` over a scripted link, and
MaxText's ``checkpointing`` and ``elastic_utils`` are small fakes.
"""

from __future__ import annotations

import collections
import enum
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
from trainer_hooks.maxtext.interval import SnapshotInterval
from trainer_hooks.session import is_slice_down

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


class EmergencyManager(Manager):
    """Orbax's emergency ``CheckpointManager`` as MaxText names it (``enable_emergency_checkpoint``)."""


class ReplicatorManager(Manager):
    """Orbax's ``ReplicatorCheckpointManager`` as MaxText names it (``enable_multi_tier_checkpointing``)."""


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
    ckpt.EmergencyCheckpointManager = EmergencyManager  # type: ignore[attr-defined]
    ckpt.EmergencyReplicatorCheckpointManager = ReplicatorManager  # type: ignore[attr-defined]
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
        **hook_kw: Any,
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
        self.step_seconds = 0.0

        def connect(address: str, **kw: Any) -> ElasticSession:
            self.settings = kw["settings"]
            # Every step reported: these tests count the reports (their coalescing: tests/trainer_hooks).
            if address != "scripted":
                return ElasticSession.connect(address, report_interval=0.0, **kw)
            return ElasticSession(  # type: ignore[arg-type]
                self.link, flush=kw["flush"], on_event=kw["on_event"], report_interval=0.0
            )

        def initialize(argv: list[str]) -> tuple[Config, None]:
            return config, None

        def training_loop_iteration(jds: dict[str, Any], pv: dict[str, Any], imm: dict[str, Any]) -> dict[str, Any]:
            if pv["step"] == self.fail_at:
                import jax

                raise jax.errors.JaxRuntimeError("DATA_LOSS: a slice went away")
            self.ran.append(pv["step"])
            if self.step_seconds:
                time.sleep(self.step_seconds)
            return {}

        self.train = types.ModuleType("fake_train")
        self.train.initialize = initialize  # type: ignore[attr-defined]
        self.train.training_loop_iteration = training_loop_iteration  # type: ignore[attr-defined]
        self.hook = MaxTextHook(address or "scripted", "job", connect=connect, **hook_kw).install(self.train)
        self.device_state: dict[str, Any] = {"state": {"w": np.zeros(4, np.float32)}}
        self.data_iterator: Any = None
        if start:
            self.train.initialize(["train.py"])

    def step(self, step: int) -> None:
        pv = {"step": step, "checkpoint_manager": self.manager, "data_iterator": self.data_iterator}
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


def test_the_hooks_own_seconds_per_step_leave_out_the_step_itself_and_the_attempts_first_boundary(
    fake_maxtext: Any,
) -> None:
    job = Job(Config())
    job.step_seconds = 0.05
    job.step(0)  # the attempt's first boundary (its resume is acknowledged there): not a per-step cost
    assert job.hook.snapshot_counts()["hook_seconds_per_step"] is None
    job.run(1, 4)
    own = job.hook.snapshot_counts()["hook_seconds_per_step"]
    assert isinstance(own, float) and 0.0 < own < job.step_seconds / 2


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
    job.hook.interval = SnapshotInterval(0)  # the path without an in-memory snapshot
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
    job.hook.interval = SnapshotInterval(0)  # without an in-memory snapshot the flush can only refuse
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


# ---------------------------------------------------------------------------
# snapshots: the hook's side (Orbax's Snapshotter itself: test_snapshot_orbax.py)
# ---------------------------------------------------------------------------


class FakeSnapshotter:
    """Orbax's Pathways ``Snapshotter`` as far as the hook drives it (``save``, ``latest``, ``join``,
    ``load``, the queue of one), with a failure to inject into the next ``save``."""

    def __init__(self, replica_axis_index: int) -> None:
        import queue

        self.replica_axis_index = replica_axis_index
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.saves: list[int] = []
        self.fail_next: BaseException | None = None
        self.newest: tuple[int, Any] | None = None
        self.replicas_lost = False
        self.copy_in_flight = False

    def save(self, step: int, tree: Any) -> None:
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        self.saves.append(step)
        if self.copy_in_flight:  # the thread has taken it and still waits for the copy
            self._queue.put((step, tree))
            self._queue.get()
            return
        self.newest = (step, tree)

    @property
    def latest(self) -> Any:
        return None if self.newest is None else types.SimpleNamespace(step=self.newest[0])

    def join(self) -> None:
        pass

    def load(self, abstract: Any) -> Any:
        if self.replicas_lost or self.newest is None:
            raise RuntimeError("No active replicas found.")
        _, tree = self.newest
        return {"state": {k: tree["state"][k] for k in abstract["state"]}, "data": tree["data"]}


class GrainLikeIterator:
    """MaxText's ``MultiHostDataLoadIterator`` around a grain iterator: ``local_iterator.get_state()``."""

    def __init__(self, position: int = 0) -> None:
        self.local_iterator = self
        self.position = position

    def get_state(self) -> dict[str, int]:
        return {"next_index": self.position}

    def set_state(self, state: dict[str, int]) -> None:
        self.position = state["next_index"]


def snapshot_job(monkeypatch: pytest.MonkeyPatch, every: int = 1, **kw: Any) -> tuple[Job, list[FakeSnapshotter]]:
    """An elastic job on slices 0 and 1 whose mesh keeps a replica per slice (the layout is the real
    code's business, tested on real meshes in test_snapshot_orbax.py)."""
    from trainer_hooks.maxtext.snapshot import Layout

    made: list[FakeSnapshotter] = []

    def make(axis: int) -> FakeSnapshotter:
        made.append(FakeSnapshotter(axis))
        return made[-1]

    usable = Layout(True, "test: a replica per slice", axis="data", axis_index=1, replicas=2, slices=(0, 1))
    monkeypatch.setattr(hook_module, "state_layout", lambda mesh, state, slice_map: usable)
    job = Job(Config(elastic_enabled=True), start_slices=(0, 1), snapshot_every=every, make_snapshotter=make, **kw)
    job.device_state["mesh"] = object()
    return job, made


def hook_lines(err: str, kind: str) -> list[dict[str, Any]]:
    prefix = f"{hook_module.LOG_PREFIX}: {kind} "
    return [json.loads(line[len(prefix) :]) for line in err.splitlines() if line.startswith(prefix)]


def test_a_snapshot_holds_the_step_boundarys_state_and_data_position_and_is_never_waited_for(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, made = snapshot_job(monkeypatch)
    job.data_iterator = GrainLikeIterator()
    for step in range(4):
        job.data_iterator.position = 10 * step  # where the batch of step index `step` starts
        job.step(step)
    snap = made[0]
    assert snap.replica_axis_index == 1
    assert snap.saves == [1, 2, 3], "nothing to save at the attempt's own start"
    assert snap.newest is not None
    newest, tree = snap.newest
    assert newest == 3 and json.loads(tree["data"]) == {"json": {"next_index": 30}}
    assert set(tree["state"]) == {"['w']"}
    snap._queue.put("a save still copying")  # the queue of one is full: skipped, not waited for
    job.step(4)
    assert snap.saves == [1, 2, 3] and job.hook.snapshots.skipped == 1 and job.ran[-1] == 4


@pytest.mark.parametrize(("enabled", "period", "ceiling"), [(True, 7, 7), (False, 7, 0), (True, 0, 0)])
def test_auto_takes_maxtexts_checkpoint_period_as_the_interval_it_stops_at(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, enabled: bool, period: int, ceiling: int
) -> None:
    job, _ = snapshot_job(monkeypatch, every=-1)
    job.config.enable_checkpointing = enabled  # type: ignore[attr-defined]
    job.config.checkpoint_period = period  # type: ignore[attr-defined]
    job.config.save_checkpoint_on_start = False  # type: ignore[attr-defined]
    job.run(0, 2)
    assert job.hook.interval.auto and job.hook.interval.ceiling == ceiling


def test_a_failed_snapshot_never_turns_snapshots_off(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job, made = snapshot_job(monkeypatch)
    job.run(0, 3)
    made[0].fail_next = RuntimeError("pinned host memory exhausted")
    job.run(3, 6)
    assert made[0].saves == [1, 2, 4, 5] and job.ran == [0, 1, 2, 3, 4, 5]
    failed = hook_lines(capsys.readouterr().err, "snapshot_failed")
    assert [f["step"] for f in failed] == [3] and "exhausted" in failed[0]["error"]
    assert job.hook.interval.every == 1 and job.hook.snapshots.failed == 1


def test_a_background_copy_that_fails_is_reported_once_it_is_over_and_the_previous_snapshot_stays(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job, made = snapshot_job(monkeypatch, every=2)
    job.run(0, 3)
    snap = made[0]
    snap.copy_in_flight = True
    job.run(3, 6)  # the save of step 4 is handed over; its copy is still awaited at step 5
    assert hook_lines(capsys.readouterr().err, "snapshot_failed") == [], "a copy still running is no failure"
    snap._queue.task_done()  # Orbax's thread: the copy failed (logged), the newest snapshot is still step 2
    snap.copy_in_flight = False
    job.run(6, 7)
    failed = hook_lines(capsys.readouterr().err, "snapshot_failed")
    assert [f["step"] for f in failed] == [4]
    assert snap.newest is not None and snap.newest[0] == 6 and snap.saves == [2, 4, 6]


def test_a_slice_loss_inside_a_snapshot_takes_the_slice_error_path_and_snapshots_go_on(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax

    job, made = snapshot_job(monkeypatch)
    job.run(0, 3)
    made[0].fail_next = jax.errors.JaxRuntimeError("DATA_LOSS: device_put to pinned_host: slice_index=1 gone")
    job.link.when_blocked.append(resume(2, 0))
    with pytest.raises(jax.errors.JaxRuntimeError) as err:
        job.step(3)  # the error surfaced in the snapshot's save, before the step ran
    sent = job.link.last("slice_error")
    assert sent.step == 3 and list(sent.slices) == [1]
    assert job.hook.seam is not None and job.hook.seam.retry_policy(1, err.value) is True
    assert job.hook._device_state is None, "the failed attempt's device state is released"
    job.run(3, 6)  # the next attempt
    assert job.link.last("resumed").step == 3
    assert made[0].saves == [1, 2, 4, 5], "snapshots stay on after a failure during one"
    assert len(made) == 1, "one Snapshotter for the process: the newest snapshot outlives the attempt"


def test_the_restore_ladder_takes_the_newest_snapshot_unless_a_committed_checkpoint_is_newer(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    job, made = snapshot_job(monkeypatch)
    job.data_iterator = GrainLikeIterator()
    for step in range(4):
        job.data_iterator.position = 10 * step
        job.device_state["state"] = {"w": np.full(4, step, np.float32)}
        job.step(step)
    load = fake_maxtext.checkpointing.load_state_if_possible
    assert getattr(load, "_elastic_sidecar_hook", None) is job.hook, "the restore seam is wrapped"
    abstract = {"w": np.zeros(4, np.float32)}

    # 1. The snapshot (step 3) is newer than any checkpoint: state and data position from it.
    fresh_iterator = GrainLikeIterator()
    restored, params = load(job.manager, fresh_iterator, "", "", 1, abstract)
    assert params is None and restored["items"]["w"].tolist() == [3.0] * 4
    assert fresh_iterator.position == 30, "the data position saved with the snapshot"
    # 2. A committed checkpoint of step 5 (label 4) is newer: MaxText restores it, never the older snapshot.
    job.manager.labels.append(4)
    assert load(job.manager, GrainLikeIterator(), "", "", 1, abstract) == ({"items": ("checkpoint", 5)}, None)
    # 3. The snapshot at least as new, but every replica lost: the checkpoint rung.
    job.manager.labels[:] = [1]
    made[0].replicas_lost = True
    assert load(job.manager, GrainLikeIterator(), "", "", 1, abstract) == ({"items": ("checkpoint", 2)}, None)
    # 4. No checkpoint either: a fresh start.
    job.manager.labels.clear()
    assert load(job.manager, GrainLikeIterator(), "", "", 1, abstract) == (None, None)

    lines = hook_lines(capsys.readouterr().err, "restored")
    assert [(r["source"], r["step"]) for r in lines] == [
        ("snapshot", 3),
        ("checkpoint", 5),
        ("checkpoint", 2),
        ("fresh", 0),
    ]
    assert lines[0]["data"] == "restored" and lines[0]["committed_step"] == 0
    assert "older than the newest committed checkpoint" in lines[1]["why"]
    assert "No active replicas" in lines[2]["why"] and "No active replicas" in lines[3]["why"]


@pytest.mark.parametrize(
    ("kind", "bare"), [(Manager, False), (EmergencyManager, True), (ReplicatorManager, True)], ids=lambda x: str(x)
)
def test_a_snapshot_restore_has_the_shape_maxtext_expects_of_each_checkpoint_manager(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, kind: type, bare: bool
) -> None:
    """MaxText's ``setup_training_state`` overlays ``restored`` itself for the emergency and replicator
    (multi-tier) managers and ``restored["items"]`` for the plain one: a snapshot comes back the same way."""
    import numpy as np

    job, _ = snapshot_job(monkeypatch)
    job.manager = kind()
    job.device_state["state"] = {"w": np.full(4, 2.0, np.float32)}
    job.run(0, 3)
    load = fake_maxtext.checkpointing.load_state_if_possible
    restored, params = load(job.manager, None, "", "", 1, {"w": np.zeros(4, np.float32)})
    assert params is None
    state = restored if bare else restored["items"]
    assert set(state) == {"w"} and state["w"].tolist() == [2.0] * 4, restored


def test_a_snapshot_whose_state_disagrees_with_its_step_is_not_restored(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    job, _ = snapshot_job(monkeypatch)
    job.device_state["state"] = {"w": np.zeros(4, np.float32), "optimizer": {"step": np.uint32(7)}}
    job.run(0, 4)  # the snapshot says step 3, its state's optimizer step says 7
    abstract = {"w": np.zeros(4, np.float32), "optimizer": {"step": np.uint32(0)}}
    job.manager.labels.append(0)
    load = fake_maxtext.checkpointing.load_state_if_possible
    assert load(job.manager, None, "", "", 1, abstract) == ({"items": ("checkpoint", 1)}, None)
    (line,) = hook_lines(capsys.readouterr().err, "restored")
    assert "holds step 7" in line["why"]


def test_maxtexts_own_scale_up_signal_is_a_grow_that_spends_no_retry_and_reaches_no_sidecar_as_an_error(
    fake_maxtext: Any,
) -> None:
    from pathwaysutils.elastic import manager

    job = Job(Config(elastic_enabled=True), start_slices=(0, 1))
    job.run(0, 3)

    def scale_up(jds: Any, pv: Any, imm: Any) -> Any:
        raise manager.ScaleUpSignalError()  # maybe_elastic_scale_up, at the top of the step

    pv = {"step": 3, "checkpoint_manager": job.manager, "data_iterator": None}
    with pytest.raises(manager.ScaleUpSignalError) as grow:
        job.hook._iteration(scale_up, job.device_state, pv, {"config": job.config})
    assert job.manager.labels == [2], "the intact state of the boundary is kept (no snapshots here: a flush)"
    seam = job.hook.seam
    assert seam is not None and seam.retry_policy(1, grow.value) is True
    assert (seam.grows, seam.reported_failures, seam.decided_attempts) == (1, 0, 0)
    assert "slice_error" not in job.link.kinds()
    assert job.hook._device_state is None
    job.run(3, 5)  # the next attempt acknowledges the mesh it built
    r = job.link.last("resumed")
    assert (r.step, list(r.active_slices)) == (3, [0, 1])


@pytest.mark.parametrize(("raw", "every"), [("", -1), ("auto", -1), ("AUTO", -1), ("0", 0), ("1", 1), (" 25 ", 25)])
def test_snapshot_every_takes_a_number_or_auto(raw: str, every: int) -> None:
    from trainer_hooks.maxtext.snapshot import snapshot_every_from_env

    assert snapshot_every_from_env({"ELASTIC_SIDECAR_SNAPSHOT_EVERY": raw}) == every


def test_a_bad_snapshot_every_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ELASTIC_SIDECAR_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("ELASTIC_SIDECAR_SNAPSHOT_EVERY", "often")
    with pytest.raises(SystemExit) as exc:
        hook_module.main([])
    assert exc.value.code == 2
    assert "ELASTIC_SIDECAR_SNAPSHOT_EVERY='often'" in capsys.readouterr().err


def test_maxtext_or_pathwaysutils_not_as_built_for_exits_2_naming_what_differs(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainer_hooks.maxtext import compat

    found = compat.differences()
    # The fake MaxText has no pre-training module and a checkpointing module without latest_step.
    assert any(f.startswith("maxtext.trainers.pre_train.train.initialize missing") for f in found)
    assert any(f.startswith("maxtext.common.checkpointing.latest_step missing") for f in found)

    monkeypatch.setenv("ELASTIC_SIDECAR_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("ELASTIC_SIDECAR_SNAPSHOT_EVERY", raising=False)
    monkeypatch.delenv("ELASTIC_SIDECAR_ALLOW_UNTESTED", raising=False)
    verified = {"maxtext": "0.2.5", "pathwaysutils": "0.1.13", "orbax-checkpoint": "0.12.8", "jax": "0.12.0.1"}
    monkeypatch.setattr(compat, "installed", lambda *a: {**verified, "maxtext": "0.2.6"})
    monkeypatch.setattr(compat, "differences", lambda: ["maxtext.common.checkpointing.latest_step missing"])
    with pytest.raises(SystemExit) as exc:
        hook_module.main([])
    assert exc.value.code == 2
    (line,) = hook_lines(capsys.readouterr().err, "incompatible")
    assert line["differs"][0].startswith("maxtext 0.2.6: untested: outside <=0.2.5")
    assert line["differs"][1:] == ["maxtext.common.checkpointing.latest_step missing"]


def test_maxtexts_own_scale_up_keeps_the_boundarys_state_as_a_snapshot_not_a_checkpoint(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathwaysutils.elastic import manager

    job, made = snapshot_job(monkeypatch, every=5)
    job.run(0, 3)

    def scale_up(jds: Any, pv: Any, imm: Any) -> Any:
        raise manager.ScaleUpSignalError()

    pv = {"step": 3, "checkpoint_manager": job.manager, "data_iterator": None}
    with pytest.raises(manager.ScaleUpSignalError):
        job.hook._iteration(scale_up, job.device_state, pv, {"config": job.config})
    assert made[0].saves == [3] and job.manager.labels == [], "a snapshot of step 3, no checkpoint written"
    (restart,) = hook_lines(capsys.readouterr().err, "restart")
    assert restart["kept"] == "snapshot of step 3"


def test_a_grow_the_sidecar_decides_keeps_the_boundary_as_a_snapshot_and_a_shrink_still_flushes(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import jax
    from pathwaysutils.elastic import manager

    job, made = snapshot_job(monkeypatch, every=100)
    job.run(0, 3)
    job.link.inbox.extend([hold(2), resume(2, 0)])
    with pytest.raises(jax.errors.JaxRuntimeError):
        job.step(3)
    assert job.manager.labels == [2], "a shrink flushes: a replica of the state may be unreadable"
    job.run(3, 5)
    saves_before = list(made[-1].saves)
    job.link.inbox.extend([hold(3), resume(3, 0, 1)])
    with pytest.raises(manager.ScaleUpSignalError):
        job.step(5)
    assert made[-1].saves == [*saves_before, 5], "the grow's boundary is kept as a snapshot of step 5"
    assert job.manager.labels == [2], "no checkpoint written for the grow"
    shrink, grow = hook_lines(capsys.readouterr().err, "restart")
    assert shrink["committed_step"] == 3 and "kept" not in shrink
    assert grow["kept"] == "snapshot of step 5" and "committed_step" not in grow
    job.step(5)  # the next attempt, on both slices
    r = job.link.last("resumed")
    assert (r.step, list(r.active_slices)) == (5, [0, 1])


# ---------------------------------------------------------------------------
# data paths a snapshot cannot keep: refused at start, never replayed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"colocated_python_data_input": True}, "colocated_python_data_input=true"),
        ({"expansion_factor_real_data": 0.5}, "expansion_factor_real_data=0.5"),
        ({"enable_rampup_batch_size": True}, "enable_rampup_batch_size=true"),
    ],
    ids=["colocated", "iterator-list", "rampup"],
)
def test_a_data_path_whose_position_a_snapshot_cannot_keep_exits_2_at_start_naming_the_flag(
    fake_maxtext: Any, capsys: pytest.CaptureFixture[str], flags: dict[str, Any], named: str
) -> None:
    config = Config(elastic_enabled=True)
    config.dataset_type = "grain"  # type: ignore[attr-defined]
    for k, v in flags.items():
        setattr(config, k, v)
    job = Job(config, start=False, snapshot_every=1)
    with pytest.raises(SystemExit) as exc:
        job.train.initialize(["train.py"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {named}:" in err and "ELASTIC_SIDECAR_SNAPSHOT_EVERY=0" in err, err
    assert job.link.sent == [], "refused before the sidecar hears of the job"


@pytest.mark.parametrize("every", [0, 1])
def test_the_same_flags_start_without_snapshots_or_on_synthetic_data(fake_maxtext: Any, every: int) -> None:
    config = Config(elastic_enabled=True)
    config.colocated_python_data_input = True  # type: ignore[attr-defined]
    config.dataset_type = "grain" if every == 0 else "synthetic"  # type: ignore[attr-defined]
    job = Job(config, snapshot_every=every)
    job.run(0, 2)
    assert job.ran == [0, 1]


class DatasetType(str, enum.Enum):  # noqa: UP042 (as MaxText declares it: str() is "DatasetType.X")
    """MaxText 0.2.5's config holds its data set as this str enum (configs/types.py), not a plain str."""

    SYNTHETIC = "synthetic"
    TFDS = "tfds"


@pytest.mark.parametrize("synthetic", ["synthetic", DatasetType.SYNTHETIC], ids=["str", "enum"])
def test_synthetic_data_takes_snapshots_whatever_its_iterator(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, synthetic: object
) -> None:
    job, made = snapshot_job(monkeypatch)
    job.config.dataset_type = synthetic  # type: ignore[attr-defined]
    job.data_iterator = iter([])  # MaxText's SyntheticDataIterator has no position: none is needed
    job.step(0)
    assert job.ran == [0] and made


@pytest.mark.parametrize("tfds", ["tfds", DatasetType.TFDS], ids=["str", "enum"])
def test_an_iterator_without_a_readable_position_exits_2_before_the_first_snapshot(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tfds: object
) -> None:
    job, made = snapshot_job(monkeypatch)
    job.config.dataset_type = tfds  # type: ignore[attr-defined]
    job.data_iterator = iter([])  # no grain get_state: its position would be lost
    with pytest.raises(SystemExit) as exc:
        job.step(0)
    assert exc.value.code == 2 and job.ran == [] and made == []
    assert "dataset_type=tfds" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# bounded recovery
# ---------------------------------------------------------------------------


def test_a_copy_that_never_finishes_makes_the_restore_take_the_checkpoint_within_its_bound(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    job, made = snapshot_job(monkeypatch)
    assert job.hook.snapshots.wait_seconds == hook_module.RECOVERY_WAIT_FRACTION * job.config.elastic_timeout_seconds
    job.run(0, 3)
    never = threading.Event()
    made[0].join = lambda: never.wait()  # type: ignore[method-assign]  # a copy to a dead host
    job.hook.snapshots.wait_seconds = 0.2
    job.manager.labels.append(0)
    load = fake_maxtext.checkpointing.load_state_if_possible
    try:
        result = load(job.manager, None, "", "", 1, {"w": np.zeros(4, np.float32)})
    finally:
        never.set()
    assert result == ({"items": ("checkpoint", 1)}, None)
    (line,) = hook_lines(capsys.readouterr().err, "restored")
    assert line["source"] == "checkpoint" and "did not finish within 0.2 s" in line["why"], line


def test_no_slice_both_healthy_and_decided_is_a_slice_loss_for_elastic_retry_not_a_value_error(
    fake_maxtext: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import jax

    job = Job(Config(elastic_enabled=True), start_slices=(0,))
    mgr = fake_maxtext.elastic_utils.elastic_manager
    with pytest.raises(jax.errors.JaxRuntimeError) as err:
        mgr.active_slice_indices = frozenset({1})  # wait_for_slices found only slice 1 healthy
    assert is_slice_down(err.value) and "no slice is both healthy and decided" in str(err.value)
    assert hook_lines(capsys.readouterr().err, "elastic_error") == [
        {"healthy": [1], "decided": [0], "why": "no slice both healthy and decided"}
    ]
    mgr.active_slice_indices = frozenset({0, 1})
    assert mgr.active_slice_indices == frozenset({0}) and job.hook.seam is not None


def test_a_restart_releases_the_attempts_python_vars(fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import jax

    job, _ = snapshot_job(monkeypatch)
    job.run(0, 3)
    assert job.hook._python_vars is not None
    job.link.inbox.append(resume(2, 0))  # a shrink: the attempt ends
    with pytest.raises(jax.errors.JaxRuntimeError):
        job.step(3)
    assert job.hook._python_vars is None and job.hook._device_state is None


def test_a_grow_whose_snapshot_load_fails_goes_back_to_the_smaller_mesh_never_to_a_checkpoint(
    fake_maxtext: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unit level with fakes (the real MaxText grow: test_multislice_snapshot_maxtext.py's grow test)."""
    import jax
    import numpy as np

    job, made = snapshot_job(monkeypatch)
    monkeypatch.setattr(job.hook, "_mesh_slices", lambda: (0,))  # MaxText's mesh spans slice 0
    job.link.inbox.clear()
    job.link.inbox.append(resume(1, 0))
    job.hook.seam.allow({0})  # type: ignore[union-attr]
    job.run(0, 3)
    job.link.inbox.append(resume(2, 0, 1))  # the grow
    with pytest.raises(Exception) as grow:
        job.step(3)
    assert "ScaleUpSignalError" in type(grow.value).__name__
    made[0].replicas_lost = True  # the load onto the larger mesh fails
    job.manager.labels.append(0)  # a committed checkpoint of step 1: never restored
    load = fake_maxtext.checkpointing.load_state_if_possible
    with pytest.raises(jax.errors.JaxRuntimeError) as back:
        load(job.manager, None, "", "", 1, {"w": np.zeros(4, np.float32)})
    assert is_slice_down(back.value) and job.hook.seam is not None
    assert job.hook.seam.allowed == frozenset({0}), "the next attempt builds the smaller mesh"
    assert job.hook.seam.retry_policy(1, back.value) is True, "a decided retry: no sidecar failure"
    (failed,) = hook_lines(capsys.readouterr().err, "grow_failed")
    assert failed["back_to"] == [0] and failed["retry_at"] == 3 + hook_module.GROW_RETRY_STEPS
    made[0].replicas_lost = False  # the next attempt, on slice 0: the snapshot of step 3 loads
    restored, _ = load(job.manager, None, "", "", 1, {"w": np.zeros(4, np.float32)})
    assert "w" in restored["items"]
    (line,) = hook_lines(capsys.readouterr().err, "restored")
    assert (line["source"], line["step"]) == ("snapshot", 3)
    job.run(3, 3 + hook_module.GROW_RETRY_STEPS)  # trains on slice 0
    with pytest.raises(Exception) as again:
        job.step(3 + hook_module.GROW_RETRY_STEPS)  # the grow is tried again
    assert "ScaleUpSignalError" in type(again.value).__name__


def test_the_attempt_waits_for_the_prepared_train_step_where_it_jits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train_utils.jit_train_and_eval_step`` waits for the prepare of its mesh's slices still compiling the
    train step, then builds the jit as MaxText's would; it waits for nothing on another mesh."""
    from trainer_hooks.maxtext.prepare import NextMeshCompiler

    built: list[Any] = []
    train_utils = types.ModuleType("maxtext.utils.train_utils")
    train_utils.jit_train_and_eval_step = lambda config, model, mesh, *a, **k: built.append(mesh) or ("p", None)  # type: ignore[attr-defined]
    utils = types.ModuleType("maxtext.utils")
    utils.train_utils = train_utils  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "maxtext", types.ModuleType("maxtext"))
    monkeypatch.setitem(sys.modules, "maxtext.utils", utils)
    monkeypatch.setitem(sys.modules, "maxtext.utils.train_utils", train_utils)

    release = threading.Event()

    def compile(argv: Any, slices: Any, ready: Any) -> dict[str, Any]:
        ready("initial_state")
        assert release.wait(10)
        ready("train_step")
        return {}

    events: list[tuple[str, dict[str, Any]]] = []
    hook = MaxTextHook("scripted", "job")
    hook._next_mesh = NextMeshCompiler(lambda: [], lambda k, f: events.append((k, f)), compile=compile)
    assert hook._wrap_train_step_jit() is True
    assert hook._next_mesh((0, 2, 3)) is not None

    def mesh(*slices: int) -> Any:
        return types.SimpleNamespace(
            devices=types.SimpleNamespace(flat=[types.SimpleNamespace(slice_index=s) for s in slices])
        )

    config = types.SimpleNamespace(elastic_timeout_seconds=10)
    other = mesh(0, 1, 2, 3)
    assert train_utils.jit_train_and_eval_step(config, "model", other) == ("p", None)
    assert built == [other] and events == [], "another mesh's prepare: no wait"
    timer = threading.Timer(0.2, release.set)
    timer.start()
    ours = mesh(0, 0, 2, 2, 3, 3)
    assert train_utils.jit_train_and_eval_step(config, "model", ours) == ("p", None)
    assert built == [other, ours]
    waited = [f for k, f in events if k == "prepare_waited"]
    assert [(f["slices"], f["program"]) for f in waited] == [([0, 2, 3], "train_step")], events
    assert release.is_set(), "the jit was built before the prepare was done with the train step"
