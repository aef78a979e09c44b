"""The next mesh's programs, compiled ahead into JAX's persistent compilation cache (issue 52).

A prepare names the slices the job will run on next. In a background thread this module builds a
MaxText config for exactly those devices (``pyconfig`` overrides, without touching the module-global
active slice set the running attempt reads) and compiles, through MaxText's own functions, the two programs
an attempt compiles at length: the train step (MaxText's AOT path, ``train_compile.get_shaped_inputs``,
``jit_and_compile``) and the state's initialiser (``setup_initial_state``'s). JAX writes them to MaxText's
persistent cache (``jax_cache_dir``), whose key covers the lowered module, the compile options and the
device assignment; the next ``elastic_retry`` attempt's own jits of the same programs on the same devices
then load them instead of compiling (docs/maxtext.md, "Preparing the next mesh"). With synthetic input it
also loads a batch for that mesh, whose small programs stay in JAX's in-memory caches. Best effort: a failure
is logged and the attempt compiles as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

OVERRIDES = (
    "internal_compile",
    "internal_compile_num_devices",
    "num_slices",
    "elastic_enabled",
    "log_config",
    "skip_jax_distributed_system",
)
"""The MaxText keys the prepare's config sets itself (any the job gave are replaced)."""


def next_mesh_argv(argv: Sequence[str], devices: int, slices: int) -> list[str]:
    """MaxText's argv for a config of ``devices`` devices in ``slices`` slices, the job's settings otherwise.

    ``internal_compile_num_devices`` is the device count MaxText's config derives the global batch from
    in place of ``elastic_utils.live_devices`` (``configs/types.py``, ``get_num_target_devices``);
    ``elastic_enabled=false`` makes ``create_device_mesh`` use the devices it is given instead of the live
    ones, with ``num_slices`` of them along DCN; ``skip_jax_distributed_system`` keeps ``pyconfig`` from
    initialising anything a second time. None of these is read by the train step itself."""
    if devices < 1 or slices < 1:
        raise ValueError(f"a mesh of {devices} devices in {slices} slices")
    kept = [a for a in argv if a.split("=", 1)[0] not in OVERRIDES]
    return [
        *kept,
        "internal_compile=true",
        f"internal_compile_num_devices={devices}",
        f"num_slices={slices}",
        "elastic_enabled=false",
        "log_config=false",
        "skip_jax_distributed_system=true",
    ]


def refusal(config: Any) -> str | None:
    """Why a prepared program could not serve the next attempt (None: it can)."""
    if not getattr(config, "jax_cache_dir", ""):
        return "jax_cache_dir is empty: no persistent compilation cache for the next attempt to load from"
    if getattr(config, "dump_hlo", False):
        return "dump_hlo=true: MaxText turns the persistent compilation cache off"
    if getattr(config, "compiled_trainstep_file", ""):
        return "compiled_trainstep_file is set: MaxText loads its train step from that file"
    if getattr(config, "enable_diloco", False):
        return "enable_diloco=true: its train step is built another way"
    return None


def compile_next_mesh(
    argv: Sequence[str], slices: Sequence[int], ready: Callable[[str], None] = lambda program: None
) -> dict[str, Any]:
    """Compile, for the mesh over ``slices`` (``slice_index`` of ``jax.devices()``), the programs a MaxText
    attempt compiles (:func:`next_mesh_programs`), in the order the attempt needs them; ``ready`` is told each
    one's name once it is done with it. Returns its devices, seconds and each program's seconds; a failed one is
    named in ``failed`` (if all fail, the last error raises: nothing was prepared)."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils

    t0 = time.monotonic()
    wanted = set(slices)
    devices = [d for d in jax.devices() if getattr(d, "slice_index", 0) in wanted]
    if not devices:
        raise ValueError(f"no device has a slice_index in {sorted(wanted)}")
    config = pyconfig.initialize(next_mesh_argv(argv, len(devices), len(wanted)))
    mesh = maxtext_utils.get_mesh_from_config(config, devices)
    programs, failed = compile_in_turn(next_mesh_programs(config, mesh, devices), ready)
    out: dict[str, Any] = {"devices": len(devices), "seconds": round(time.monotonic() - t0, 3), "programs": programs}
    if failed:
        out["failed"] = failed
    return out


def next_mesh_programs(config: Any, mesh: Any, devices: Sequence[Any]) -> list[tuple[str, Callable[[], object]]]:
    """What :func:`compile_next_mesh` prepares for ``mesh`` over ``devices``, named, in the order the attempt
    needs it: with synthetic input a batch of it (:func:`warm_synthetic_input`), then the state's initialiser
    and the train step."""
    programs: list[tuple[str, Callable[[], object]]] = [
        ("initial_state", lambda: compile_initial_state(config, mesh)),
        ("train_step", lambda: compile_train_step(config, mesh)),
    ]
    if getattr(config, "dataset_type", "") == "synthetic":
        lowest = min(getattr(d, "slice_index", 0) for d in devices)
        first = next(d for d in devices if getattr(d, "slice_index", 0) == lowest)
        programs.insert(0, ("input_pipeline", lambda: warm_synthetic_input(config, mesh, first)))
    return programs


def compile_in_turn(
    compiles: Sequence[tuple[str, Callable[[], object]]], ready: Callable[[str], None] = lambda name: None
) -> tuple[dict[str, float], dict[str, str]]:
    """Run each named compile in turn, telling ``ready`` each name once it is done with (compiled or failed):
    each one's seconds, and why each that failed did. A failure is only named and the others still run; if
    every one failed, the last error raises (nothing was prepared)."""
    done: dict[str, float] = {}
    failed: dict[str, str] = {}
    error: Exception | None = None
    for name, compile_one in compiles:
        t0 = time.monotonic()
        try:
            compile_one()
        except Exception as e:
            error = e
            failed[name] = f"{type(e).__name__}: {e}"[:300]
        else:
            done[name] = round(time.monotonic() - t0, 3)
        finally:
            ready(name)
    if error is not None and not done:
        raise error
    return done, failed


def warm_synthetic_input(config: Any, mesh: Any, default_device: Any) -> None:
    """Load one batch of MaxText's synthetic input for ``mesh``, as the attempt's first step does: its small
    programs (the token draw for the mesh's global batch, the batch's generator and its placement) compile here
    into JAX's in-memory caches, which the attempt's calls of the same functions then hit; too quick to compile
    (under ``jax_persistent_cache_min_compile_time_secs``) for the persistent cache to keep them.

    ``default_device``: pathwaysutils' ``Manager.default_device`` for the next slices (the first device of the
    first of them), under which ``elastic_retry`` runs the attempt: the default device is part of those caches'
    key. Other pipelines read files and start workers of their own, so only the synthetic one is loaded here."""
    import jax
    from maxtext.common.data_loader import DataLoader
    from maxtext.input_pipeline.input_pipeline_interface import create_data_iterator

    with jax.default_device(default_device):
        iterator, _ = create_data_iterator(config, mesh)
        jax.block_until_ready(DataLoader(config, mesh, iterator, None).load_next_batch())


def compile_train_step(config: Any, mesh: Any) -> None:
    """Compile MaxText's train step for ``mesh``, as ``train_compile.main`` does for a topology."""
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    shaped_args, shaped_kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static_argnums, donate_argnums = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_shardings, model, config, params_shardings
    )
    train_compile.jit_and_compile(
        func,
        shaped_args,
        shaped_kwargs,
        mesh,
        in_shard,
        out_shard,
        static_argnums,
        donate_argnums,
        config,
        train_compile.axis_rules(config.logical_axis_rules),
    )


def compile_initial_state(config: Any, mesh: Any) -> None:
    """Compile (not run: no state is allocated) the state's initialiser MaxText jits for ``mesh`` on every
    attempt, restored or not.

    MaxText 0.2.5's ``maxtext_utils.setup_initial_state`` always builds the initial state and overlays what it
    restored on it: ``jax.jit(lambda: nnx.state(init_state_fn()), in_shardings=None,
    out_shardings=state_mesh_shardings)()`` under the config's logical axis rules, with ``init_state_fn`` the
    ``TrainStateNNX`` factory of ``train_utils.setup_train_loop``. This builds the same program from the same
    MaxText functions: the same module (``jit__lambda``) on the same devices, hence the same persistent cache
    key (it leaves out source locations: JAX strips debug info before hashing, ``cache_key._canonicalize_ir``)."""
    import jax
    from flax import nnx
    from maxtext.common import train_state_nnx
    from maxtext.utils import maxtext_utils, model_creation_utils, train_utils

    create_model, model = model_creation_utils.create_nnx_abstract_model(config, mesh)
    _, tx = train_utils.create_training_optimizer(config, model, mesh=mesh)

    def create_train_state_fn() -> Any:  # train_utils.setup_train_loop's
        nnx_model = create_model()
        lora = getattr(getattr(config, "lora", None), "enable_lora", False)
        wrt = getattr(nnx, "LoRAParam", nnx.Param) if lora else nnx.Param
        return train_state_nnx.TrainStateNNX(nnx_model, nnx.Optimizer(nnx_model, tx, wrt=wrt))

    create_train_state_fn.__name__ = "initialize_state"  # as setup_initial_state names it
    _, _, state_mesh_shardings = maxtext_utils.get_abstract_state(config, mesh, create_train_state_fn, True)
    with maxtext_utils.axis_rules(config.logical_axis_rules):
        initialise = jax.jit(
            lambda: nnx.state(create_train_state_fn()), in_shardings=None, out_shardings=state_mesh_shardings
        )
        initialise.lower().compile()


Compile = Callable[[Sequence[str], Sequence[int], Callable[[str], None]], dict[str, Any]]
"""``(argv, slices, ready) -> figures``: compile the programs of the mesh over ``slices``, telling ``ready`` each
program's name once it is done with it (:func:`compile_next_mesh`)."""


class NextMeshCompiler:
    """One background prepare at a time, one per slice set; ``__call__`` is the session's ``MeshPreparer``."""

    def __init__(
        self,
        argv: Callable[[], Sequence[str]],
        on_event: Callable[[str, dict[str, object]], None],
        compile: Compile = compile_next_mesh,
    ) -> None:
        self._argv = argv
        self._on_event = on_event
        self._compile = compile
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._one_at_a_time = threading.Lock()
        self._futures: dict[tuple[int, ...], Future[object]] = {}
        self._ready: dict[tuple[int, ...], set[str]] = {}
        """The programs each prepare is done with so far."""

    def __call__(self, slices: tuple[int, ...]) -> Future[object] | None:
        key = tuple(sorted(slices))
        with self._lock:
            if key in self._futures:
                return None  # in flight or done: the cache has it (or a failure was logged)
            argv = list(self._argv())
            future: Future[object] = Future()
            self._futures[key] = future
            self._ready[key] = set()
        # A daemon thread, not an executor's: those are joined at interpreter exit, which would then wait
        # for a compile nobody needs any more.
        name = "maxtext-prepare-" + "-".join(map(str, key))
        threading.Thread(target=self._run, args=(argv, key, future), name=name, daemon=True).start()
        return future

    def _run(self, argv: list[str], slices: tuple[int, ...], future: Future[object]) -> None:
        def ready(program: str) -> None:
            with self._changed:
                self._ready[slices].add(program)
                self._changed.notify_all()

        with self._one_at_a_time:
            try:
                done = self._compile(argv, slices, ready)
            except Exception as e:  # best effort: the attempt compiles as before
                self._on_event("prepare_failed", {"slices": list(slices), "error": f"{type(e).__name__}: {e}"[:300]})
                done = None
        if done is not None:
            self._on_event("prepared", {"slices": list(slices), **done})
        with self._changed:
            future.set_result(done)
            self._changed.notify_all()

    def wait_for(self, slices: Sequence[int], timeout: float, program: str | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the prepare of ``slices`` in flight to be done with ``program`` (None:
        with all of them): the attempt about to compile it would compile the same program again alongside it.
        True when one was waited for."""
        key = tuple(sorted(slices))

        def done() -> bool:
            future = self._futures.get(key)
            return future is None or future.done() or (program is not None and program in self._ready[key])

        t0 = time.monotonic()
        with self._changed:
            if done():
                return False
            self._changed.wait_for(done, timeout=max(0.0, timeout))  # a timeout: the attempt compiles itself
        waited = {"slices": list(key), "seconds": round(time.monotonic() - t0, 3)}
        self._on_event("prepare_waited", waited | ({"program": program} if program is not None else {}))
        return True
