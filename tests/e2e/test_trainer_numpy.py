"""The example trainer's NumPy backend: its step's gradient, its checkpoints, the options that refuse it;
the trainer's two modes' options.

Its behaviour under faults (holds, flushes, resumes, exit 42) is the fault matrix's
(tests/e2e/test_fault_matrix.py), which runs every scenario on it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simjob.options import add_demo_args, check_flags
from simjob.trainer import parse_args
from simjob.trainer_numpy import NpzCheckpoints, batch, init_state, train_step


def _ns() -> argparse.Namespace:
    return parse_args(["--sidecar", "127.0.0.1:1", "--workdir", "/nonexistent", "--backend", "numpy", "--hidden", "8"])


def _loss(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((np.maximum(x @ p["w1"] + p["b1"], 0.0) @ p["w2"] - y) ** 2))


def test_the_step_descends_the_loss_gradient() -> None:
    """With no momentum yet the update is -lr * gradient: it matches central differences of the loss."""
    ns = _ns()
    state = init_state(ns)
    state = {k: {n: a.astype(np.float64) for n, a in v.items()} for k, v in state.items()}
    state["params"]["b1"] = np.linspace(-0.5, 0.5, ns.hidden)  # some units off, some on
    x, y = batch(ns, 3, 2)
    x, y = x.astype(np.float64), y.astype(np.float64)
    lr = 0.1
    new, loss = train_step(state, x, y, lr)
    assert loss == pytest.approx(_loss(state["params"], x, y))
    eps = 1e-6
    for name, idx in (("w1", (5, 2)), ("w1", (0, 7)), ("b1", (4,)), ("w2", (1, 0)), ("w2", (6, 0))):
        up = {k: v.copy() for k, v in state["params"].items()}
        down = {k: v.copy() for k, v in state["params"].items()}
        up[name][idx] += eps
        down[name][idx] -= eps
        numeric = (_loss(up, x, y) - _loss(down, x, y)) / (2 * eps)
        analytic = (state["params"][name][idx] - new["params"][name][idx]) / lr
        assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-9), (name, idx)
    assert state["params"]["w1"][5, 2] != new["params"]["w1"][5, 2]  # a new state; the old one is kept
    later, loss2 = train_step(new, x, y, lr)
    assert loss2 < loss


def test_checkpoints_are_whole_step_directories(tmp_path: Path) -> None:
    ns = _ns()
    store = NpzCheckpoints(tmp_path / "checkpoints", keep=3)
    (tmp_path / "checkpoints" / "40.tmp-1").mkdir()  # a save cut short: never a step
    assert store.steps() == [] and store.latest() is None
    state = init_state(ns)
    for step in (10, 20, 30, 40):
        assert store.save(step, state) > 0
    assert store.steps() == [20, 30, 40]
    back = store.load(40)
    assert sorted(back) == ["momentum", "params"]
    for k, v in state["params"].items():
        np.testing.assert_array_equal(back["params"][k], v)
    other, _ = train_step(state, *batch(ns, 0, 4), 0.05)
    assert store.save(40, other) == 0  # a committed step is never replaced
    np.testing.assert_array_equal(store.load(40)["params"]["w1"], state["params"]["w1"])


def test_donate_is_refused_on_the_numpy_backend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--sidecar", "x:1", "--workdir", "/w", "--backend", "numpy", "--donate"])
    assert e.value.code == 2
    assert "--donate needs --backend jax" in capsys.readouterr().err


def test_the_numpy_backend_is_for_the_single_controller_demo() -> None:
    p = argparse.ArgumentParser()
    add_demo_args(p)
    ns = p.parse_args(["--mode", "multi-controller", "--trainer-backend", "numpy"])
    with pytest.raises(ValueError, match="--trainer-backend numpy is for the single-controller demo"):
        check_flags(ns)
    check_flags(p.parse_args(["--trainer-backend", "numpy"]))


def test_the_numpy_backend_imports_no_jax() -> None:
    code = (
        "import sys, simjob.trainer, simjob.trainer_numpy; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'orbax', 'pathwaysutils')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


MC = ["--sidecar", "x:1", "--workdir", "/w", "--mode", "multi-controller"]
MC_PROCESS = ["--process-id", "1", "--num-processes", "4", "--jax-coordinator", "127.0.0.1:9", "--events", "/w/e"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (MC, "--mode multi-controller needs --process-id"),
        (MC + MC_PROCESS[:2], "--mode multi-controller needs --num-processes"),
        (MC + MC_PROCESS + ["--backend", "numpy"], "--mode multi-controller runs on JAX without donation"),
        (["--sidecar", "x:1", "--workdir", "/w", "--no-sidecar"], "--no-sidecar needs --mode multi-controller"),
    ],
)
def test_the_trainers_modes_refuse_what_they_cannot_run(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_each_mode_keeps_its_own_model_size() -> None:
    single = parse_args(["--sidecar", "x:1", "--workdir", "/w"])
    multi = parse_args(MC + MC_PROCESS)
    assert (single.hidden, single.features) == (256, 64)
    assert (multi.hidden, multi.features, multi.process_id) == (128, 32, 1)
    assert parse_args(MC + MC_PROCESS + ["--hidden", "16"]).hidden == 16
