"""The worker's window message: seconds on the wire, blind never read as seen, second signals when served."""

from __future__ import annotations

from agent.sources.tpu_metrics import Blind, MetricWindow, WindowSummary
from agent.stragglers.collector import HostWindow
from agent.stragglers.reporter import window_message


def test_the_collective_goes_out_in_seconds_with_its_count() -> None:
    w = WindowSummary("service", 10.0, 12.0, {"collective_e2e_latency": MetricWindow(40, 2500.0, 2000.0, 4000.0)}, {})
    m = window_message(w, 0.0, 0.0)
    assert (m.start_unix, m.end_unix, m.blind, m.collective_count) == (10.0, 12.0, "", 40)
    assert (m.collective_p50_seconds, m.collective_mean_seconds) == (0.002, 0.0025)
    assert not m.HasField("throttle_score") and not m.HasField("links_unhealthy")
    assert HostWindow.from_message(m).collective == 0.002


def test_a_window_without_collectives_is_not_seen() -> None:
    w = WindowSummary("service", 10.0, 12.0, {"collective_e2e_latency": MetricWindow(0, None, None, None)}, {})
    m = window_message(w, 0.0, 0.0)
    assert m.collective_count == 0 and not m.HasField("collective_p50_seconds")
    assert HostWindow.from_message(m).collective is None


def test_a_blind_source_is_a_blind_window_framed_by_the_reads() -> None:
    m = window_message(Blind("service", "localhost:8431 UNAVAILABLE: refused"), 5.0, 7.0)
    assert (m.start_unix, m.end_unix, m.source) == (5.0, 7.0, "service")
    assert m.blind == "localhost:8431 UNAVAILABLE: refused" and m.collective_count == 0


def test_throttle_and_link_health_go_out_when_served() -> None:
    w = WindowSummary("sdk", 0.0, 1.0, {}, {"tpu_throttle_score": 0.3, "ici_link_health": 0.5})
    m = window_message(w, 0.0, 0.0)
    assert m.throttle_score == 0.3 and m.links_unhealthy
    h = HostWindow.from_message(m)
    assert h.throttle_score == 0.3 and h.links_unhealthy and h.collective is None
