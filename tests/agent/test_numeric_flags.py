"""Every numeric flag, ES_ variable and policy field refuses NaN, infinity and numbers out of range.

The flags are found by walking the command's parsers (agent.cli.build_parser), so a flag added
later is swept too: a flag is numeric when its argparse type turns "1", "2" or "0.5" into a number.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import constants as C
from agent.cli import build_parser
from agent.core.model import Policy

REPO = Path(__file__).resolve().parents[2]
NON_NUMBERS = ("nan", "inf", "-inf", "NaN", "Infinity", "1e400")
"""What ``float()`` takes that is not a usable number ("1e400" overflows to inf)."""
TOO_LARGE = str(2**64)
"""Past every field of the wire format (int64 at most)."""
ENV_COMMANDS = ("coordinator", "worker")
"""The commands whose flags also come from ES_<FLAG> variables (agent.config)."""


@pytest.fixture(autouse=True)
def _no_es_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("ES_"):
            monkeypatch.delenv(k)


@dataclasses.dataclass(frozen=True)
class Flag:
    path: tuple[str, ...]
    """The subcommands leading to the parser that holds the flag (``("admin", "drain")``)."""
    level: int
    """How many of ``path`` lead to the flag's own parser (an admin option before the command name: 1)."""
    name: str
    """``--flag``, or a positional's name as argparse's errors give it."""
    positional: bool

    def __str__(self) -> str:
        return " ".join(self.path[: self.level]) + " " + self.name


def _sample(action: argparse.Action) -> str | None:
    """A value the action's type turns into a number (then the flag is numeric), else None."""
    if action.type is None or not callable(action.type) or action.nargs == 0:
        return None
    for text in ("1", "2", "0.5"):
        try:
            v = action.type(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return text
    return None


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of the leaf commands (a parser with no subcommands)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path
    for a in subs:
        for name, sub in a.choices.items():
            yield from _parsers(sub, (*path, name))


def _levels(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[argparse.ArgumentParser]:
    """The parsers along ``path``: the top one's subcommand parser, then each below it."""
    out, p = [], parser
    for name in path:
        (subs,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        p = subs.choices[name]
        out.append(p)
    return out


def _own(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))]


def _name(a: argparse.Action) -> str:
    return a.option_strings[-1] if a.option_strings else (a.metavar or a.dest)  # type: ignore[return-value]


def _argv(parser: argparse.ArgumentParser, path: tuple[str, ...], bad: Flag | None, value: str) -> list[str]:
    """A command line for ``path`` with every required value given, and ``value`` for ``bad``."""
    argv: list[str] = []
    for i, p in enumerate(_levels(parser, path)):
        argv.append(path[i])
        positionals: list[str] = []
        for a in _own(p):
            is_bad = bad is not None and bad.level == i + 1 and bad.name == _name(a)
            if a.option_strings:
                if is_bad:
                    argv.append(f"{_name(a)}={value}")
                elif a.required:
                    argv.append(f"{_name(a)}={_sample(a) or 'x'}")
            elif a.nargs in (None, 1):
                positionals.append(value if is_bad else (_sample(a) or "x"))
        if positionals:
            argv += ["--", *positionals]
    return argv


def numeric_flags() -> list[Flag]:
    parser = build_parser()
    out: list[Flag] = []
    for path in _parsers(parser):
        for level, p in enumerate(_levels(parser, path), start=1):
            for a in p._actions:
                if _sample(a) is None:
                    continue
                f = Flag(path, level, _name(a), not a.option_strings)
                # An admin option before the command name is the same for every command: once.
                if level < len(path) and any(g.level == level and g.name == f.name for g in out):
                    continue
                out.append(f)
    return out


FLAGS = numeric_flags()


def test_the_sweep_finds_the_numeric_flags_of_every_command() -> None:
    """The introspection itself: a sweep that found nothing would pass for nothing."""
    found = {str(f) for f in FLAGS}
    for expected in (
        "coordinator --durability-bound",
        "coordinator --num-slices",
        "coordinator --settle-seconds",
        "worker --node-watch-seconds",
        "worker --slice",
        "admin --timeout",
        "admin drain slice",
        "admin events --backlog",
        "inject --max-restarts",
        "demo --run-timeout",
        "demo --steps",
        "demo --min-slices",
        "plan --mtbi-hours",
        "plan --recovery-success",
        "plan --seed",
    ):
        assert expected in found, sorted(found)
    assert {f.path[0] for f in FLAGS} == {"coordinator", "worker", "admin", "inject", "demo", "drill", "plan"}


def test_every_command_line_built_by_the_sweep_parses_with_good_values() -> None:
    """Without a bad value each command line parses: a refusal below is the flag's, not a missing argument's."""
    parser = build_parser()
    for path in sorted({f.path for f in FLAGS}):
        parser.parse_args(_argv(parser, path, None, ""))


@pytest.mark.parametrize("flag", FLAGS, ids=str)
def test_every_numeric_flag_refuses_non_numbers_naming_the_flag(flag: Flag, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for value in (*NON_NUMBERS, TOO_LARGE):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(_argv(parser, flag.path, flag, value))
        err = capsys.readouterr().err
        assert e.value.code == 2, (value, err)
        assert f"argument {flag.name}" in err and repr(value) in err, (value, err)


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.path[0] in ENV_COMMANDS and not f.positional], ids=str)
def test_every_numeric_environment_variable_refuses_non_numbers_naming_it(
    flag: Flag, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    var = "ES_" + flag.name.lstrip("-").replace("-", "_").upper()
    for value in ("nan", "inf", "-inf", TOO_LARGE):
        monkeypatch.setenv(var, value)
        parser = build_parser()  # the ES_ variables are read as the parser is built
        with pytest.raises(SystemExit) as e:
            parser.parse_args(_argv(parser, flag.path, None, ""))
        err = capsys.readouterr().err
        assert e.value.code == 2, (var, value, err)
        assert f"argument {flag.name}" in err and var in err and repr(value) in err, (value, err)


def test_a_run_timeout_of_zero_and_steps_past_int64_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args, name in (
        (["--run-timeout", "0"], "--run-timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--steps", str(C.INT64_MAX + 1)], "--steps"),
        (["--steps", "1e30"], "--steps"),
    ):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["demo", *args])
        assert e.value.code == 2
        assert f"argument {name}" in capsys.readouterr().err


def test_the_largest_wire_values_are_still_taken() -> None:
    ns = build_parser().parse_args(["demo", "--steps", str(C.INT64_MAX), "--slices", str(C.INT32_MAX)])
    assert ns.steps == C.INT64_MAX and ns.slices == C.INT32_MAX


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--durability-bound", "nan"], {}, ["--durability-bound", "'nan'"]),
        ([], {"ES_DURABILITY_BOUND": "nan"}, ["--durability-bound", "'nan'", "ES_DURABILITY_BOUND"]),
        (["--elastic-timeout-seconds=-inf"], {}, ["--elastic-timeout-seconds", "'-inf'"]),
    ],
    ids=["flag", "env", "minus-inf"],
)
def test_the_coordinator_exits_2_at_once_on_a_non_number(
    args: list[str], env: dict[str, str], words: list[str]
) -> None:
    """The process as started: exit 2 with the flag named, before it listens on anything."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ES_")}
    r = subprocess.run(
        [sys.executable, "-m", "agent", "coordinator", "--num-slices", "2", "--listen", "127.0.0.1:0", *args],
        cwd=REPO,
        env={**base, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    for w in words:
        assert w in r.stderr, r.stderr
    assert "listening" not in r.stdout


POLICY_FLOATS = [f.name for f in dataclasses.fields(Policy) if f.type == "float"]
POLICY_INTS = [f.name for f in dataclasses.fields(Policy) if f.type == "int"]


@pytest.mark.parametrize("name", POLICY_FLOATS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_every_policy_time_refuses_non_numbers(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        Policy(**{"num_slices": 2, name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", POLICY_INTS)
def test_every_policy_count_refuses_values_past_int32(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Policy(**{"num_slices": 2, name: C.INT32_MAX + 1})


def test_the_policy_sweep_covers_the_fields_it_should() -> None:
    assert {"elastic_timeout_seconds", "rejoin_grace_seconds", "start_timeout_seconds"} <= set(POLICY_FLOATS)
    assert {"num_slices", "elastic_max_retries", "trainer_processes"} <= set(POLICY_INTS)


@pytest.mark.parametrize("name", ["start_timeout_seconds", "flush_timeout_seconds", "elastic_timeout_seconds"])
def test_a_policy_timeout_of_zero_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Policy(**{"num_slices": 2, name: 0.0})  # type: ignore[arg-type]


def test_a_trainer_sending_a_non_number_keeps_the_sidecar_settings() -> None:
    """The trainer's own elastic flags arrive on the wire as doubles: NaN is not adopted."""
    with pytest.raises(ValueError, match="elastic_timeout_seconds"):
        Policy(num_slices=2).with_trainer_settings(-1, float("nan"), 3)
