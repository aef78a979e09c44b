"""The core's per-slice host mapping and key set behave exactly as a dict and a frozenset would.

Hosts and HostKeys share one slice's storage between versions; these tests run random changes
against a plain dict and frozenset and compare every read, and check that an old version never
sees a later change (the states that hold them are immutable).
"""

from __future__ import annotations

import copy
import pickle

from hypothesis import given, settings
from hypothesis import strategies as hs

from agent.core.model import HostKeys, HostRecord, Hosts, Policy, State, _frozen, initial_state

KEYS = hs.tuples(hs.integers(0, 3), hs.integers(0, 3))
RECORDS = hs.builds(HostRecord, hs.sampled_from(["a", "b", "c"]), healthy=hs.booleans())
OPS = hs.lists(
    hs.one_of(
        hs.tuples(hs.just("set"), hs.dictionaries(KEYS, RECORDS, max_size=4)),
        hs.tuples(hs.just("drop"), hs.lists(KEYS, max_size=4)),
    ),
    max_size=20,
)


def same_as_dict(m: Hosts, ref: dict) -> None:
    assert len(m) == len(ref)
    assert dict(m.items()) == ref and set(m) == set(ref) and set(m.keys()) == set(ref)
    assert m == ref and m == _frozen(ref) and m == Hosts(ref)
    for s in range(4):
        for h in range(4):
            assert ((s, h) in m) == ((s, h) in ref)
            assert m.get((s, h)) is ref.get((s, h))
            if (s, h) in ref:
                assert m[(s, h)] is ref[(s, h)]
        assert dict(m.slice_records(s)) == {h: r for (sl, h), r in ref.items() if sl == s}
        assert set(m.slice_keys(s)) == {h for sl, h in ref if sl == s}
    assert "x" not in m and (1, 2, 3) not in m


@settings(max_examples=settings.default.max_examples // 2, deadline=None)
@given(start=hs.dictionaries(KEYS, RECORDS, max_size=8), ops=OPS)
def test_hosts_reads_like_a_dict_and_old_versions_never_change(start: dict, ops: list) -> None:
    m, ref = Hosts(start), dict(start)
    versions = [(m, dict(ref))]
    for op, arg in ops:
        if op == "set":
            m = m.with_records(arg)
            ref.update(arg)
        else:
            m = m.without(arg)
            for k in arg:
                ref.pop(k, None)
        same_as_dict(m, ref)
        versions.append((m, dict(ref)))
    for old, was in versions:  # every earlier version still reads as it did
        same_as_dict(old, was)
    assert pickle.loads(pickle.dumps(m)) == ref and copy.deepcopy(m) == ref


def test_hosts_equality_is_by_content_and_an_unchanged_result_is_the_same_object() -> None:
    r = HostRecord("a")
    m = Hosts({(0, 0): r, (1, 0): r})
    assert m.without([(5, 5)]) is m and m.with_records({}) is m
    assert m != Hosts({(0, 0): r}) and m != Hosts({(0, 0): r, (1, 0): HostRecord("b")})
    assert m != {(0, 0): r} and m != 3
    assert m.without([(1, 0)]).by_slice().keys() == {0}  # an emptied slice leaves the index


@settings(max_examples=settings.default.max_examples // 2, deadline=None)
@given(start=hs.frozensets(KEYS, max_size=10), drops=hs.lists(hs.lists(KEYS, max_size=3), max_size=10))
def test_hostkeys_reads_like_a_frozenset_and_old_versions_never_change(start: frozenset, drops: list) -> None:
    ks, ref = HostKeys(start), set(start)
    versions = [(ks, frozenset(ref))]
    for d in drops:
        ks = ks.without(d)
        ref -= set(d)
        versions.append((ks, frozenset(ref)))
    for got, want in versions:
        assert got == want and want == got and set(got) == want and len(got) == len(want)
        assert got.slices() == {s for s, _ in want} and bool(got) == bool(want)
        assert all((k in got) == (k in want) for k in [(s, h) for s in range(4) for h in range(4)])
        hosts = Hosts({k: HostRecord("x") for k in [(0, 0), (1, 1), (2, 2)]})
        assert got.missing_from(hosts) == sorted(k for k in want if k not in hosts)
        assert hash(got) == hash(HostKeys(want))
    assert pickle.loads(pickle.dumps(ks)) == ref


def test_a_state_keeps_any_mapping_and_set_it_is_given_in_the_per_slice_forms() -> None:
    p = Policy(num_slices=2)
    st = State(policy=p, phase=initial_state(p, 0.0).phase, hosts={(0, 0): HostRecord("a")}, expected_rejoin={(0, 0)})
    assert isinstance(st.hosts, Hosts) and isinstance(st.expected_rejoin, HostKeys)
    assert st.hosts == {(0, 0): HostRecord("a")} and st.expected_rejoin == frozenset({(0, 0)})
