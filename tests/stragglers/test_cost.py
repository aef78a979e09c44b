"""The straggler decision by cost as tables: one finding and one outlook in, one verdict out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.stragglers import (
    CostParams,
    Detection,
    DetectorState,
    Finding,
    Outlook,
    decide,
    drain_cost_seconds,
    keep_cost_seconds,
)
from tests.stragglers.job import Run, window

HOUR, DAY = 3_600.0, 86_400.0
NOW = 10 * DAY

# A four-slice job a day from its end, with a 2-minute drain, a 2-minute grow and a replacement
# expected in ten minutes: draining costs 120 + 600/4 + 120 = 390 s.
OUTLOOK = Outlook(
    slices_in_service=4,
    min_slices=2,
    remaining_seconds=DAY,
    drain_seconds=120.0,
    grow_seconds=120.0,
    replacement_seconds=600.0,
)


def straggler(slice_: int = 3, slowdown: float = 0.5, lateness: float = 0.3) -> Finding:
    return Finding("slice", slice_, "straggler", "it is late", lateness, slowdown, 3, 5, NOW - 300)


def one(f: Finding, outlook: Outlook = OUTLOOK, now: float = NOW):  # noqa: ANN201
    (v,) = decide(Detection(DetectorState(), (f,), "r"), outlook, now)
    return v


@pytest.mark.parametrize(
    ("outlook", "want"),
    [
        (OUTLOOK, 120 + 600 / 4 + 120),
        (replace(OUTLOOK, replacement_seconds=None), 120 + DAY / 3),  # a day's work on 3 of 4 slices
        (replace(OUTLOOK, remaining_seconds=None), 120 + 600 / 4 + 120),  # unknown end: the day cap
        # The job ends before the replacement would come: it finishes on fewer slices.
        (replace(OUTLOOK, slices_in_service=2, remaining_seconds=1_000.0, replacement_seconds=3_600.0), 120 + 1_000),
        (replace(OUTLOOK, slices_in_service=1, min_slices=1), float("inf")),
    ],
    ids=["replaced-in-ten-minutes", "never-replaced", "end-unknown", "ends-before-the-replacement", "one-slice"],
)
def test_what_a_drain_costs(outlook: Outlook, want: float) -> None:
    assert drain_cost_seconds(outlook) == pytest.approx(want)


@pytest.mark.parametrize(
    ("remaining", "slowdown", "want"),
    [(DAY, 0.5, 0.5 * DAY), (3 * DAY, 0.5, 0.5 * DAY), (600.0, 0.2, 120.0), (DAY, -0.1, 0.0)],
    ids=["a-day", "capped-at-a-day", "ten-minutes-left", "no-slowdown"],
)
def test_what_keeping_costs(remaining: float, slowdown: float, want: float) -> None:
    assert keep_cost_seconds(slowdown, replace(OUTLOOK, remaining_seconds=remaining)) == pytest.approx(want)


CASES = [
    # id, finding, outlook, now, action, words in the reason
    ("worth-it-a-day-left", straggler(), OUTLOOK, NOW, "drain", "over 1.25 times"),
    ("not-worth-it-ten-minutes-left", straggler(), replace(OUTLOOK, remaining_seconds=600.0), NOW, "alert", "not 1.25"),
    # 10% over a day is 8,640 s; a day on 3 of 4 slices with no replacement costs 28,800 s.
    (
        "fewer-slices-cost-more-than-the-straggler",
        straggler(slowdown=0.1),
        replace(OUTLOOK, replacement_seconds=None),
        NOW,
        "alert",
        "not 1.25",
    ),
    ("within-the-margin", straggler(slowdown=0.005), OUTLOOK, NOW, "alert", "not 1.25"),  # 432 s against 390 s
    (
        "at-the-minimum-slice-count",
        straggler(),
        replace(OUTLOOK, min_slices=4),
        NOW,
        "alert",
        "elastic_min_slice_count",
    ),
    (
        "drained-one-half-an-hour-ago",
        straggler(),
        replace(OUTLOOK, last_straggler_drain_at=NOW - 1_800),
        NOW,
        "alert",
        "at most one drain",
    ),
    (
        "drained-one-over-an-hour-ago",
        straggler(),
        replace(OUTLOOK, last_straggler_drain_at=NOW - 3_700),
        NOW,
        "drain",
        "over 1.25 times",
    ),
    (
        "an-operator-asks-within-the-hour",
        straggler(),
        replace(OUTLOOK, last_straggler_drain_at=NOW - 1_800, operator_asked=True),
        NOW,
        "drain",
        "over 1.25 times",
    ),
    (
        "an-operator-cannot-go-below-the-minimum",
        straggler(),
        replace(OUTLOOK, min_slices=4, operator_asked=True),
        NOW,
        "alert",
        "elastic_min_slice_count",
    ),
    (
        "job-wide-alerts-never-drains",
        Finding("job", None, "job_wide", "all slow", None, 5.0),
        OUTLOOK,
        NOW,
        "alert",
        "never a drain",
    ),
    ("blind-is-kept-and-says-blind", Finding("slice", 3, "blind", "blind: no metrics"), OUTLOOK, NOW, "keep", "blind"),
    (
        "a-suspect-is-kept",
        Finding("slice", 3, "suspect", "stood out in 2 of 5", 0.3, 0.5, 2, 5),
        OUTLOOK,
        NOW,
        "keep",
        "2 of 5",
    ),
]


@pytest.mark.parametrize(("f", "outlook", "now", "action", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_verdict(f: Finding, outlook: Outlook, now: float, action: str, words: str) -> None:
    v = one(f, outlook, now)
    assert (v.action, v.scope, v.slice, v.status) == (action, f.scope, f.slice, f.status)
    assert words in v.reason
    assert v.inputs["slices_in_service"] == outlook.slices_in_service and v.inputs["slowdown"] == f.slowdown


def test_a_straggler_verdict_carries_both_costs() -> None:
    v = one(straggler())
    assert v.inputs["keep_cost_seconds"] == pytest.approx(0.5 * DAY)
    assert v.inputs["drain_cost_seconds"] == pytest.approx(390.0)


def test_two_stragglers_get_one_drain_the_later_first() -> None:
    d = Detection(DetectorState(), (straggler(1, lateness=0.2), straggler(2, lateness=0.4)), "r")
    v1, v2 = decide(d, replace(OUTLOOK, operator_asked=True), NOW)
    assert (v1.slice, v1.action, v2.slice, v2.action) == (1, "alert", 2, "drain")
    assert "one at a time" in v1.reason


def test_a_wider_margin_keeps_the_slice() -> None:
    d = Detection(DetectorState(), (straggler(slowdown=0.01),), "r")  # 864 s against 390 s
    assert decide(d, OUTLOOK, NOW)[0].action == "drain"
    assert decide(d, OUTLOOK, NOW, CostParams(margin=3.0))[0].action == "alert"


def test_from_windows_to_a_drain_of_the_late_slice_only() -> None:
    r = Run()
    for factors in [[1.0] * 4] * 3 + [[1.0, 1.0, 1.5, 1.0]] * 3:
        verdicts = decide(r.feed(window(factors)), OUTLOOK, r.now)
    assert [(v.slice, v.action) for v in verdicts if v.action != "keep"] == [(2, "drain")]
    assert verdicts[-1].scope == "job" and verdicts[-1].action == "keep"


@pytest.mark.parametrize(
    "kw",
    [{"margin": 0.5}, {"horizon_cap_seconds": 0.0}, {"drain_interval_seconds": float("inf")}],
    ids=["margin-below-one", "no-horizon", "infinite-interval"],
)
def test_bad_params_name_the_field(kw: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        CostParams(**kw)


def test_a_bad_outlook_names_the_value() -> None:
    with pytest.raises(ValueError, match="drain_seconds"):
        replace(OUTLOOK, drain_seconds=-1.0)
