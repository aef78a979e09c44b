"""Property tests of the decision core over random event sequences.

Two random worlds drive ``decide``:

* a *chaotic* one (:class:`World`): a policy plus a list of abstract
  operations (a worker joins or is lost with a random incarnation, health
  flips, the trainer attaches with current or random generation and settings,
  detaches, reports slice errors, acknowledges holds and resumes, time passes,
  sometimes past every deadline). Acknowledgements mostly carry the generation
  of the last HoldTrainer/ResumeTrainer emitted and sometimes a stale one.
* a *faithful* one (:class:`FaithfulWorld`): the trainer is a model of
  ``trainer_hooks/session.py``. It only gets commands sent while its link is
  up, ignores commands older than the newest it acted on, greets every
  (re)connect with its generation and mesh, and its reports queue while the
  link is down. Its process, its link and the coordinator process (without a
  state file) restart at random.

Checked after every step:

1. the generation never decreases;
2. every ResumeTrainer runs on at least ``policy.min_slices`` slices;
3. every ResumeTrainer's slices are up after the decision, and were up before
   it too unless the event itself brought that slice up;
4. every hold ends: from every prefix, a healing suffix (fresh hosts
   everywhere, the trainer back, every pending command acknowledged, time
   past every deadline) ends RUNNING on every slice with no hold pending, or
   terminal; in the faithful world the trainer then runs that generation on
   those slices too. And with only time passing, nothing waits forever;
5. entering FAILED emits AbortTrainer(exit_code=42) and ExitCoordinator(42),
   and while FAILED the last actions emitted still are those;
6. decide is deterministic and leaves its input alone;

plus: reasons are non-empty, terminal phases are sticky and silent, and the
non-RUNNING live phases always carry a deadline.

The examples per property come from the hypothesis profile (tests/conftest.py): ``ci`` by
default, ``--hypothesis-profile=explore`` for a longer hunt.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, note, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st

from agent.core.decide import decide
from agent.core.drains import lift_overdue as _lift_overdue
from agent.core.membership import settle as _settle
from agent.core.model import (
    AbortTrainer,
    Decision,
    ExitCoordinator,
    HoldTrainer,
    NodeNotice,
    OperatorCommand,
    Phase,
    Policy,
    ResumeTrainer,
    State,
    Tick,
    TrainerAttached,
    TrainerDetached,
    TrainerFinished,
    TrainerFlushed,
    TrainerHeld,
    TrainerResumed,
    TrainerSettings,
    TrainerSliceError,
    TrainerStepped,
    WorkerHealth,
    WorkerJoined,
    WorkerLost,
    initial_state,
)
from agent.durable import statefile

PROPERTY = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------


@st.composite
def policies(draw) -> Policy:
    n = draw(st.sampled_from([1, 2, 2, 3, 4]))
    return Policy(
        num_slices=n,
        hosts_per_slice=draw(st.integers(1, 2)),
        elastic_min_slice_count=draw(st.sampled_from([-1, -1, *range(1, n + 1)])),
        elastic_timeout_seconds=draw(st.sampled_from([10.0, 60.0, 300.0])),
        elastic_max_retries=draw(st.sampled_from([1, 2, 3, 5, 10])),
    )


DT = st.sampled_from([0.0, 0.0, 0.001, 0.5, 2.0])
SLICE = st.integers(0, 3)
HOST = st.integers(0, 1)
STALE = st.sampled_from([False, False, False, True])
SETTINGS = st.one_of(
    st.none(),
    st.none(),
    st.none(),
    st.builds(
        TrainerSettings,
        st.integers(-2, 5),
        st.sampled_from([-1.0, 0.0, 5.0, 60.0, 300.0]),
        st.integers(0, 6),
    ),
)
TICK_DT = st.one_of(
    st.floats(0, 15, allow_nan=False),
    st.floats(0, 15, allow_nan=False),
    st.sampled_from([9.999, 10.0, 59.9, 60.0, 300.0, 1000.0]),
)

OPS = st.one_of(
    st.tuples(st.just("join"), SLICE, HOST, st.sampled_from(["fresh", "fresh", "current", "old"]), DT),
    st.tuples(st.just("join"), SLICE, HOST, st.just("fresh"), DT),
    st.tuples(
        st.just("lose"),
        SLICE,
        HOST,
        st.sampled_from(["current", "current", "old"]),
        st.sampled_from(["stream_closed", "heartbeat_timeout", "shutdown"]),
        DT,
    ),
    st.tuples(st.just("health"), SLICE, HOST, st.booleans(), st.sampled_from(["current", "current", "old"]), DT),
    st.tuples(
        st.just("attach"),
        st.sampled_from(["trainer", "trainer", "state", "random"]),
        st.integers(0, 8),
        st.integers(-1, 50),
        st.sampled_from(["trainer", "trainer", "state", "random"]),
        st.frozensets(SLICE, max_size=4),
        SETTINGS,
        DT,
    ),
    st.tuples(st.just("detach"), DT),
    st.tuples(st.just("step"), DT),
    st.tuples(
        st.just("slice_error"), st.frozensets(st.integers(0, 4), max_size=2), st.sampled_from(["state", "old"]), DT
    ),
    st.tuples(st.just("held"), STALE, st.integers(1, 3), DT),
    st.tuples(st.just("held"), STALE, st.integers(1, 3), DT),
    st.tuples(st.just("resumed"), STALE, st.integers(1, 3), DT),
    st.tuples(st.just("resumed"), STALE, st.integers(1, 3), DT),
    st.tuples(st.just("flushed"), DT),
    st.tuples(st.just("finished"), st.integers(0, 9)),
    st.tuples(st.just("finished"), st.integers(0, 4)),
    st.tuples(
        st.just("notice"),
        SLICE,
        st.sampled_from(["future", "future", "past", "cleared", "foreign", "pool"]),
        st.floats(0, 100, allow_nan=False),
        DT,
    ),
    st.tuples(
        st.just("operator"),
        st.sampled_from(["hold", "resume", "resume", "drain", "undrain", "checkpoint", "abort", "bogus"]),
        st.integers(-1, 4),
        st.booleans(),
        DT,
    ),
    st.tuples(st.just("tick"), TICK_DT),
    st.tuples(st.just("tick"), TICK_DT),
)

BOOTS = st.sampled_from(["running", "running", "partial", "fresh"])
"""Where a scenario starts: a running job, half the hosts and the trainer up, or nothing yet."""
SCENARIOS = st.tuples(policies(), BOOTS, st.lists(OPS, min_size=8, max_size=50))


# --------------------------------------------------------------------------
# the harness: the outside world around decide()
# --------------------------------------------------------------------------


@dataclass
class World:
    state: State
    now: float = 0.0
    last_hold: HoldTrainer | None = None
    last_resume: ResumeTrainer | None = None
    last_actions: tuple = ()
    resume_acked: int = -1
    """Generation of the newest resume the trainer acknowledged."""
    trainer_gen: int = 0
    """Newest generation the simulated trainer acted on."""
    trainer_active: frozenset[int] = frozenset()
    trainer_step: int = -1
    serial: int = 0
    incarnations: dict = field(default_factory=dict)
    """(slice, host) -> every incarnation it ever had, oldest first."""
    log: list = field(default_factory=list)

    @classmethod
    def new(cls, policy: Policy, boot: str) -> World:
        w = cls(initial_state(policy, 0.0))
        if boot == "fresh":
            return w
        for s in range(policy.num_slices):
            for h in range(policy.hosts_per_slice):
                if boot == "running" or (s + h) % 2 == 0:
                    w.apply(WorkerJoined(s, h, w.fresh(s, h), node=f"node-{s}-{h}"), 0.1)
        w.apply(TrainerAttached(0, -1), 0.1)
        if boot == "running":
            assert w.last_resume is not None
            w.ack_resume(w.last_resume)
        return w

    def copy(self) -> World:
        return dataclasses.replace(
            self, incarnations={k: list(v) for k, v in self.incarnations.items()}, log=list(self.log)
        )

    # -- one step, with the per-step invariants ---------------------------

    def apply(self, event, dt: float = 0.0) -> Decision:
        self.now += dt
        before = self.state
        maps = (dict(before.hosts), dict(before.slice_errors))
        d = decide(before, event, self.now)
        self.log.append((round(self.now, 3), event, d.reason))
        check_step(before, event, self.now, d)
        assert decide(before, event, self.now) == d, "decide is not deterministic"  # (6)
        assert (dict(before.hosts), dict(before.slice_errors)) == maps, "decide changed its input"
        self.state = d.state
        for a in d.actions:
            if isinstance(a, HoldTrainer):
                self.last_hold = a
            elif isinstance(a, ResumeTrainer):
                self.last_resume = a
        if d.actions and before.phase != Phase.FAILED:  # a late trainer's abort repeats the failure
            self.last_actions = d.actions
        if self.state.phase == Phase.FAILED:  # (5)
            assert any(isinstance(a, AbortTrainer) and a.exit_code in (3, 42) for a in self.last_actions)
            assert ExitCoordinator in {type(a) for a in self.last_actions}
        return d

    def fresh(self, s: int, h: int) -> str:
        self.serial += 1
        inc = f"i{self.serial}"
        self.incarnations.setdefault((s, h), []).append(inc)
        return inc

    def current(self, s: int, h: int) -> str:
        rec = self.state.hosts.get((s, h))
        return rec.incarnation if rec is not None else self.old(s, h)

    def old(self, s: int, h: int) -> str:
        known = self.incarnations.get((s, h), [])
        return known[0] if known else "never"

    # -- the trainer's acknowledgements ----------------------------------

    def ack_hold(self, gen: int) -> Decision:
        step = self.trainer_step = max(self.trainer_step, 0) + 1
        d = self.apply(TrainerHeld(gen, step, step - 1))
        if self.last_hold is not None and gen == self.last_hold.generation:
            self.trainer_gen = max(self.trainer_gen, gen)
        return d

    def ack_resume(self, r: ResumeTrainer) -> Decision:
        step = self.trainer_step = max(self.trainer_step, 0) + 1
        d = self.apply(TrainerResumed(r.generation, step, r.active, str(r.source)))
        self.resume_acked = max(self.resume_acked, r.generation)
        self.trainer_gen = max(self.trainer_gen, r.generation)
        self.trainer_active = r.active
        return d

    # -- abstract operations ----------------------------------------------

    def run(self, op: tuple) -> None:
        p = self.state.policy
        kind = op[0]
        if kind in ("join", "lose", "health"):
            s, h = op[1] % p.num_slices, op[2] % p.hosts_per_slice
        if kind == "join":
            which, dt = op[3], op[4]
            inc = self.fresh(s, h) if which == "fresh" else self.current(s, h) if which == "current" else self.old(s, h)
            self.apply(WorkerJoined(s, h, inc, node=f"node-{s}-{h}"), dt)
        elif kind == "lose":
            inc = self.current(s, h) if op[3] == "current" else self.old(s, h)
            self.apply(WorkerLost(s, h, inc, op[4]), op[5])
        elif kind == "health":
            inc = self.current(s, h) if op[4] == "current" else self.old(s, h)
            self.apply(WorkerHealth(s, h, inc, op[3], "" if op[3] else "pathways worker unreachable"), op[5])
        elif kind == "attach":
            _, gen_kind, rand_gen, step, active_kind, rand_active, trainer_settings, dt = op
            gen = {"trainer": self.trainer_gen, "state": self.state.generation, "random": rand_gen}[gen_kind]
            active = {
                "trainer": self.trainer_active,
                "state": self.state.active,
                "random": frozenset(x % p.num_slices for x in rand_active),
            }[active_kind]
            if step >= 0:
                self.trainer_step = step
            self.apply(TrainerAttached(gen, step, active, trainer_settings), dt)
        elif kind == "detach":
            self.apply(TrainerDetached(), op[1])
        elif kind == "step":
            self.trainer_step = max(self.trainer_step, 0) + 1
            self.apply(TrainerStepped(self.trainer_step, self.trainer_gen), op[1])
        elif kind == "slice_error":
            _, slices, gen_kind, dt = op
            gen = self.state.generation if gen_kind == "state" else max(0, self.state.generation - 1)
            self.apply(TrainerSliceError(slices, "DATA_LOSS: slice unreachable", max(self.trainer_step, 0), gen), dt)
        elif kind == "held":
            _, stale, delta, dt = op
            gen = self.last_hold.generation if self.last_hold is not None else self.state.generation
            self.now += dt
            self.ack_hold(gen - delta if stale else gen)
        elif kind == "resumed":
            _, stale, delta, dt = op
            r = self.last_resume or ResumeTrainer(self.state.generation, self.state.active, "checkpoint", "none yet")
            if stale:
                r = dataclasses.replace(r, generation=r.generation - delta)
            self.now += dt
            self.ack_resume(r)
        elif kind == "flushed":
            self.apply(TrainerFlushed(self.trainer_gen, max(self.trainer_step, 0)), op[1])
        elif kind == "finished":
            if op[1] == 0:  # rare: it ends the scenario
                self.apply(TrainerFinished(max(self.trainer_step, 0)))
            else:
                self.apply(Tick(), 0.1)
        elif kind == "notice":
            _, sl, how, event_time, dt = op
            sl %= p.num_slices
            node = "somewhere-else" if how == "foreign" else f"node-{sl}-0"
            notice = NodeNotice(
                kind="terminate_on_host_maintenance",
                source="pubsub",
                node="" if how == "pool" else node,
                node_pool="pool-x" if how == "pool" else "",
                deadline=self.now + dt + (60.0 if how != "past" else -1.0),
                event_time=event_time,
                cleared=how == "cleared",
            )
            self.apply(notice, dt)
        elif kind == "operator":
            _, what, sl, restart, dt = op
            if what == "abort" and sl != 0:
                what = "checkpoint"  # keep aborts rare
            # ``restart`` doubles as undrain's ``force`` (lift a notice's drain too).
            self.apply(OperatorCommand(what, "test", slice=sl, restart=restart, force=restart), dt)
        elif kind == "tick":
            self.apply(Tick(), op[1])
        else:  # pragma: no cover
            raise AssertionError(op)

    def tick_past_deadline(self) -> Decision:
        """Past the current deadline (set perhaps under an earlier policy) and one timeout."""
        until = max(self.now, self.state.deadline or self.now) + self.state.policy.elastic_timeout_seconds
        return self.apply(Tick(), until - self.now + 1)

    # -- the healing suffix -------------------------------------------------

    def heal(self) -> None:
        """Everything comes back; the trainer acknowledges whatever is pending."""
        p = self.state.policy
        self.apply(Tick(), 1.0)  # replacements register after any reported slice error
        for s in range(p.num_slices):
            for h in range(p.hosts_per_slice):
                self.apply(WorkerJoined(s, h, self.fresh(s, h), node=f"node-{s}-{h}"))
        self.apply(Tick(), p.settle_seconds + 0.01)  # the replacements settle
        if not self.state.trainer.attached:
            self.apply(TrainerAttached(self.trainer_gen, self.trainer_step, self.trainer_active))
        if self.state.operator_hold:
            self.apply(OperatorCommand("resume", "healing"))
        for _ in range(10):
            st_ = self.state
            if st_.phase.terminal:
                break
            if st_.phase == Phase.HOLDING:
                assert self.last_hold is not None and self.last_hold.generation == st_.generation, (
                    "HOLDING, but the last HoldTrainer emitted is not of the current generation"
                )
                self.ack_hold(self.last_hold.generation)
            elif self.last_resume is not None and self.last_resume.generation > self.resume_acked:
                self.ack_resume(self.last_resume)
            elif st_.phase == Phase.RUNNING:
                # A grow that waited for the resume's acknowledgement starts at the next tick.
                self.apply(Tick(), 0.0)
                if self.state.phase == Phase.RUNNING:
                    break
            else:
                self.apply(Tick(), 1.0)
        self.tick_past_deadline()


def check_step(before: State, event, now: float, d: Decision) -> None:
    after = d.state
    assert isinstance(d.reason, str) and d.reason.strip(), f"empty reason for {event!r}"
    assert after.generation >= before.generation, "generation decreased"  # (1)
    if before.phase.terminal:
        late_trainer = before.phase == Phase.FAILED and isinstance(event, TrainerAttached)
        allowed = tuple(a for a in d.actions if late_trainer and isinstance(a, AbortTrainer))
        assert after.phase == before.phase and d.actions == allowed, "a terminal phase changed or acted"
    if after.phase in (Phase.STARTING, Phase.HOLDING, Phase.WAITING) and not (
        after.operator_hold and after.phase == Phase.WAITING
    ):
        assert after.deadline is not None, f"{after.phase} without a deadline can wait forever"
    if isinstance(event, OperatorCommand) and d.rejected:
        assert d.state == before and d.actions == (), "a refused operator command changed something"
    up_after = after.up_slices()
    # The up slices carried over from earlier states (State.carry_up) are what every host says.
    assert up_after == after.up_slices_afresh(), "carried-over up slices differ from the hosts'"
    assert before.up_slices() == before.up_slices_afresh()
    # Time alone brings a replacement host up once it has settled, and lifts a notice's drain of hosts
    # still up long after the disruption was to be over.
    up_before = _lift_overdue(_settle(before, now), now)[0].up_slices()
    brought_up: frozenset[int] = frozenset()
    if isinstance(event, WorkerJoined) or isinstance(event, WorkerHealth) and event.healthy:
        brought_up = frozenset({event.slice})
    if isinstance(event, OperatorCommand) and event.kind == "undrain" and event.slice is not None:
        brought_up = frozenset({event.slice})
    if isinstance(event, NodeNotice) and event.cleared:
        brought_up = before.policy.all_slices
    for a in d.actions:
        if isinstance(a, ResumeTrainer):
            assert a.active, "resume on no slices"
            assert len(a.active) >= after.policy.min_slices, (  # (2)
                f"resume on {sorted(a.active)} below min_slices={after.policy.min_slices}"
            )
            assert a.active <= up_after, f"resume on down slice(s) {sorted(a.active - up_after)}"  # (3)
            assert a.active - brought_up <= up_before, (  # (3), before the decision
                f"resume on slice(s) {sorted(a.active - brought_up - up_before)} that were down"
            )
            assert a.generation == after.generation and after.phase == Phase.RUNNING
            assert after.active == a.active
        elif isinstance(a, HoldTrainer) and after.phase == Phase.WAITING:
            # Only an operator's hold of a trainer held already: the same generation, no flush.
            assert isinstance(event, OperatorCommand) and event.kind == "hold" and after.operator_hold
            assert a.generation == before.generation == after.generation and not a.flush
        elif isinstance(a, HoldTrainer):
            assert a.generation == after.generation and after.phase == Phase.HOLDING
            assert a.generation > before.generation or before.phase == Phase.HOLDING
    if after.phase == Phase.FAILED and before.phase != Phase.FAILED:  # (5)
        code = 3 if isinstance(event, OperatorCommand) and event.kind == "abort" and not event.restart else 42
        aborts = [a for a in d.actions if isinstance(a, AbortTrainer)]
        assert aborts and all(a.exit_code == code for a in aborts)
        assert ExitCoordinator(code, aborts[0].reason) in d.actions
        assert after.exit_code == code
    if after.operator_hold and after.phase == Phase.RUNNING and not before.phase == Phase.STARTING:
        assert not any(isinstance(a, ResumeTrainer) for a in d.actions) or not before.operator_hold, (
            "resumed while an operator holds"
        )


def assert_healed(w: World) -> None:
    s = w.state
    assert s.phase in (Phase.RUNNING, Phase.FAILED, Phase.COMPLETED), f"stuck in {s.phase}"  # (4)
    if s.phase == Phase.RUNNING:
        assert s.deadline is None
        assert w.last_hold is None or (
            w.last_resume is not None and w.last_resume.generation >= w.last_hold.generation
        ), "RUNNING with a hold pending"
        assert s.active == s.policy.all_slices == s.up_slices(), "healed, but not running on every slice"
        assert s.trainer.attached


def assert_nothing_waits_forever(w: World) -> None:
    """Only time passes (nobody acknowledges, nothing comes back): every wait ends."""
    # Four: time itself may start one more hold (a notice's drain lifted long after its window: a grow).
    for _ in range(4):
        w.tick_past_deadline()
    if w.state.operator_hold and w.state.phase == Phase.WAITING:
        return  # an operator's hold lasts until an operator resumes, by design
    assert w.state.phase in (Phase.RUNNING, Phase.FAILED, Phase.COMPLETED), f"{w.state.phase} after four timeouts"


def heal_and_check(w: World, check, heal: bool = True) -> None:
    """Heal (or just age) a copy of the world, the prefix stays as it is, and check how it ends."""
    healed = w.copy()
    try:
        if heal:
            healed.heal()
        check(healed)
    except AssertionError:
        for line in healed.log:
            note(repr(line))
        raise


# --------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------


@PROPERTY
@given(SCENARIOS)
def test_step_invariants_and_every_hold_ends_after_any_prefix(scenario):
    policy, boot, ops = scenario
    w = World.new(policy, boot)
    heal_and_check(w, assert_healed)
    for op in ops:
        w.run(op)
        heal_and_check(w, assert_healed)
        heal_and_check(w, assert_nothing_waits_forever, heal=False)


@PROPERTY
@given(SCENARIOS, st.data())
def test_decide_is_deterministic_and_pure(scenario, data):
    policy, boot, ops = scenario
    w = World.new(policy, boot)
    for op in ops:
        w.run(op)
    state = w.state
    snapshot = dataclasses.replace(state, hosts=dict(state.hosts), slice_errors=dict(state.slice_errors))
    for event in (
        Tick(),
        WorkerJoined(0, 0, "x"),
        WorkerLost(0, 0, w.current(0, 0), "stream_closed"),
        TrainerSliceError(frozenset({0}), "lost", 1, state.generation),
        TrainerHeld(state.generation, 1, 0),
        TrainerAttached(state.generation + 1, 3, frozenset({0})),
    ):
        now = w.now + data.draw(st.sampled_from([0.0, 1.0, 1e4]))
        first = decide(state, event, now)
        assert decide(state, event, now) == first
        assert dataclasses.replace(state, hosts=dict(state.hosts), slice_errors=dict(state.slice_errors)) == snapshot


def test_the_scenarios_reach_every_phase():
    """A guard on the generator: random scenarios exercise every phase."""
    seen: set[Phase] = set()

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(SCENARIOS)
    def collect(scenario):
        policy, boot, ops = scenario
        w = World.new(policy, boot)
        for op in ops:
            w.run(op)
            seen.add(w.state.phase)

    collect()
    assert seen == set(Phase)


# --------------------------------------------------------------------------
# a faithful trainer: commands reach it only over a live link
# --------------------------------------------------------------------------


@dataclass
class SimTrainer:
    """The trainer hooks (``trainer_hooks/session.py``) reduced to their protocol.

    It acts on a command only if it arrived while the link was up, ignores
    commands older than the newest it has acted on, and greets the sidecar on
    every (re)connect with its generation, step in memory and current mesh.
    Reports made while the link is down go out after the next greeting.
    """

    link: bool = False
    generation: int = 0
    step: int = -1
    active: frozenset[int] = frozenset()
    mode: str = "starting"
    """starting | running | held | error (waits for a newer generation) | gone."""
    newer_than: int = -1
    inbox: list = field(default_factory=list)
    outbox: list = field(default_factory=list)


@dataclass
class FaithfulWorld(World):
    trainer: SimTrainer = field(default_factory=SimTrainer)
    policy0: Policy | None = None
    """The coordinator's own configuration (before adopting the trainer's settings)."""

    @classmethod
    def new(cls, policy: Policy, boot: str) -> FaithfulWorld:
        w = cls(initial_state(policy, 0.0), policy0=policy)
        if boot == "fresh":
            return w
        for s in range(policy.num_slices):
            for h in range(policy.hosts_per_slice):
                if boot == "running" or (s + h) % 2 == 0:
                    w.apply(WorkerJoined(s, h, w.fresh(s, h)), 0.1)
        w.link_up()
        if boot == "running":
            w.drain()
        return w

    def copy(self) -> FaithfulWorld:
        t = self.trainer
        w = super().copy()
        w.trainer = dataclasses.replace(t, inbox=list(t.inbox), outbox=list(t.outbox))
        return w

    def apply(self, event, dt: float = 0.0) -> Decision:
        d = super().apply(event, dt)
        if self.state.trainer.attached and self.trainer.link:
            self.trainer.inbox.extend(a for a in d.actions if isinstance(a, HoldTrainer | ResumeTrainer | AbortTrainer))
        return d

    # -- the trainer's side ---------------------------------------------------

    def say(self, event, dt: float = 0.0) -> None:
        if self.trainer.link:
            self.apply(event, dt)
        else:
            self.now += dt
            self.trainer.outbox.append(event)

    def link_up(self, trainer_settings: TrainerSettings | None = None, dt: float = 0.0) -> None:
        t = self.trainer
        if t.link or t.mode == "gone":
            return
        t.link = True
        held = t.mode in ("held", "error")
        self.apply(TrainerAttached(t.generation, t.step, t.active, trainer_settings, held=held), dt)
        queued, t.outbox = t.outbox, []
        for ev in queued:
            self.apply(ev)

    def link_down(self, dt: float = 0.0) -> None:
        if self.trainer.link:
            self.trainer.link = False
            self.apply(TrainerDetached(), dt)

    def coordinator_restart(self, dt: float = 0.0) -> None:
        """The coordinator process restarts without a state file: a fresh state.

        Workers reconnect with their incarnations; the trainer's link breaks and
        greets the new coordinator when it reconnects.
        """
        self.now += dt
        hosts = dict(self.state.hosts)
        self.state = initial_state(self.policy0, self.now)
        self.last_hold = self.last_resume = None
        self.last_actions = ()
        self.trainer.link = False
        for (s, h), rec in sorted(hosts.items()):
            self.apply(WorkerJoined(s, h, rec.incarnation))

    def coordinator_restart_durable(self, seed: int, dt: float = 0.0) -> None:
        """The coordinator process restarts on its state file (agent/durable/statefile.py): the
        saved state comes back through JSON; every worker re-registers, in any order,
        with time passing between them; the trainer's link breaks and comes back."""
        self.now += dt
        raw = json.loads(json.dumps(statefile.snapshot(self.state, epoch=1, offset=0.0)))
        restored = statefile.restore(raw, initial_state(self.policy0, self.now), self.now, offset=0.0).state
        hosts = sorted(self.state.hosts.items())
        hypothesis_event(f"durable coordinator restart from {self.state.phase}")
        self.state = restored
        self.last_hold = self.last_resume = None
        if restored.phase == Phase.FAILED:
            code = restored.exit_code or 42
            # A restarted failed coordinator tells the trainer and exits again.
            self.last_actions = (AbortTrainer(restored.generation, "restored", code), ExitCoordinator(code, "restored"))
        else:
            self.last_actions = ()
        self.trainer.link = False
        rng = random.Random(seed)
        rng.shuffle(hosts)
        for (s, h), rec in hosts:
            self.apply(WorkerJoined(s, h, rec.incarnation), rng.choice([0.0, 0.0, 0.3, 2.0]))

    def restart(self, dt: float = 0.0) -> None:
        """The trainer process dies and a fresh one starts (nothing in memory)."""
        if self.trainer.mode == "gone":
            return
        self.link_down(dt)
        self.trainer = SimTrainer()

    def process(self) -> bool:
        """Handle the oldest command in the inbox, as ``ElasticSession._handle`` does."""
        t = self.trainer
        if not t.inbox or t.mode == "gone":
            return False
        cmd = t.inbox.pop(0)
        if isinstance(cmd, AbortTrainer):
            t.mode = "gone"
            t.inbox.clear()
            self.link_down()
            return True
        if cmd.generation < t.generation or cmd.generation <= t.newer_than:
            return True  # stale: ignored
        t.generation = cmd.generation
        t.newer_than = -1
        if isinstance(cmd, HoldTrainer):
            t.mode = "held"
            self.say(TrainerHeld(cmd.generation, t.step, max(t.step - 1, -1)))
        else:
            source = str(cmd.source) if t.step >= 0 else "checkpoint"
            t.step = max(t.step, 0)
            t.mode = "running"
            t.active = cmd.active
            self.say(TrainerResumed(cmd.generation, t.step, cmd.active, source))
        return True

    def drain(self, limit: int = 50) -> None:
        for _ in range(limit):
            if not self.process():
                return

    def run_faithful(self, op: tuple) -> None:
        p = self.state.policy
        t = self.trainer
        kind = op[0]
        if kind in ("join", "lose", "health"):
            s, h = op[1] % p.num_slices, op[2] % p.hosts_per_slice
        if kind == "join":
            inc = self.fresh(s, h) if op[3] else self.current(s, h)
            self.apply(WorkerJoined(s, h, inc), op[4])
        elif kind == "lose":
            self.apply(WorkerLost(s, h, self.current(s, h), op[3]), op[4])
        elif kind == "health":
            self.apply(WorkerHealth(s, h, self.current(s, h), op[3]), op[4])
        elif kind == "tick":
            self.apply(Tick(), op[1])
        elif kind == "process":
            self.now += op[1]
            self.process()
        elif kind == "step":
            if t.mode == "running":
                t.step += 1
                self.say(TrainerStepped(t.step, t.generation), op[1])
        elif kind == "slice_error":
            if t.mode == "running":
                slices = frozenset(x % p.num_slices for x in op[1]) & t.active
                t.mode, t.newer_than = "error", t.generation
                self.say(TrainerSliceError(slices, "DATA_LOSS", t.step, t.generation), op[2])
        elif kind == "link_down":
            self.link_down(op[1])
        elif kind == "link_up":
            self.link_up(op[1], op[2])
        elif kind == "restart":
            self.restart(op[1])
        elif kind == "coordinator_restart_durable":
            if not (self.state.phase == Phase.COMPLETED):
                self.coordinator_restart_durable(op[1], op[2])
        elif kind == "coordinator_restart":
            if op[1] == 0 and not self.state.phase.terminal:  # after 42 or 0, xpk restarts everything
                self.coordinator_restart(op[2])
        elif kind == "finish":
            if op[1] == 0 and t.mode == "running" and t.link:
                t.mode = "gone"
                self.apply(TrainerFinished(t.step))
        else:  # pragma: no cover
            raise AssertionError(op)

    def heal(self) -> None:
        """Fresh hosts everywhere, the link comes back, then fresh hosts again.

        The second round replaces slices that reports queued on the link
        (delivered after the first round) marked lost.
        """
        for _ in range(2):
            # A slice error that named no slice keeps unchanged slices held this long (a second sidecar
            # registering is no change: only a replacement after a loss is).
            self.apply(Tick(), max(1.0, self.state.policy.unnamed_error_wait_seconds))
            for s in range(self.state.policy.num_slices):
                for h in range(self.state.policy.hosts_per_slice):
                    self.apply(WorkerJoined(s, h, self.fresh(s, h)))
            self.apply(Tick(), self.state.policy.settle_seconds + 0.01)  # the replacements settle
            self.link_up()
            self.drain()
        if not self.state.phase.terminal:
            assert self.state.phase == Phase.RUNNING, (
                f"{self.state.phase} although every slice is up and the trainer carried out every command it got"
            )
        self.tick_past_deadline()
        self.drain()


def assert_trainer_runs(w: FaithfulWorld) -> None:
    s, t = w.state, w.trainer
    assert s.phase in (Phase.RUNNING, Phase.FAILED, Phase.COMPLETED), f"stuck in {s.phase}"
    if s.phase == Phase.RUNNING:
        assert s.active == s.policy.all_slices == s.up_slices(), "healed, but not running on every slice"
        assert (t.mode, t.generation, t.active) == ("running", s.generation, s.active), (
            f"coordinator runs generation {s.generation} on {sorted(s.active)} but the trainer is {t.mode} "
            f"at generation {t.generation} on {sorted(t.active)}"
        )


FAITHFUL_OPS = st.one_of(
    st.tuples(st.just("join"), SLICE, HOST, st.sampled_from([True, True, False]), DT),
    st.tuples(st.just("join"), SLICE, HOST, st.just(True), DT),
    st.tuples(st.just("lose"), SLICE, HOST, st.sampled_from(["stream_closed", "heartbeat_timeout"]), DT),
    st.tuples(st.just("lose"), SLICE, HOST, st.just("stream_closed"), DT),
    st.tuples(st.just("health"), SLICE, HOST, st.booleans(), DT),
    st.tuples(st.just("tick"), TICK_DT),
    st.tuples(st.just("process"), DT),
    st.tuples(st.just("process"), DT),
    st.tuples(st.just("process"), DT),
    st.tuples(st.just("step"), DT),
    st.tuples(st.just("slice_error"), st.frozensets(SLICE, max_size=2), DT),
    st.tuples(st.just("link_down"), DT),
    st.tuples(st.just("link_down"), DT),
    st.tuples(st.just("link_up"), SETTINGS, DT),
    st.tuples(st.just("link_up"), st.none(), DT),
    st.tuples(st.just("restart"), DT),
    st.tuples(st.just("coordinator_restart"), st.integers(0, 2), DT),
    st.tuples(st.just("coordinator_restart_durable"), st.integers(0, 10_000), DT),
    st.tuples(st.just("coordinator_restart_durable"), st.integers(0, 10_000), DT),
    st.tuples(st.just("finish"), st.integers(0, 39)),
)


@settings(PROPERTY, max_examples=3 * settings.default.max_examples)
@given(policies(), BOOTS, st.lists(FAITHFUL_OPS, min_size=8, max_size=50))
def test_a_faithful_trainer_is_never_left_holding(policy, boot, ops):
    w = FaithfulWorld.new(policy, boot)
    heal_and_check(w, assert_trainer_runs)
    for op in ops:
        w.run_faithful(op)
        heal_and_check(w, assert_trainer_runs)
