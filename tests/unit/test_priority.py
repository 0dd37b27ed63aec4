"""Problem-level prioritized sampling: property tests over random outcome sequences."""

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.priority import HEAP, SOLVED, PrioritySampler
from schemas.config import PriorityConfig


def sampler(n=40, groups=4, seed=0, **kw):
    return PrioritySampler(np.arange(n) % groups, PriorityConfig(**kw), seed)


outcomes = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 6)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(outcomes, st.sampled_from(["greedy", "gumbel"]), st.sampled_from(["flat", "group"]), st.integers(0, 99))
def test_in_flight_problem_never_dispatched_twice(seq, mode, prior, seed):
    s = sampler(seed=seed, mode=mode, prior=prior, retest_interval=2, retest_share=0.5)
    in_flight: set[int] = set()
    version = 0
    for solved, k in seq:
        picked = s.next(k)
        assert len(picked) == len(set(picked))
        assert not in_flight & set(picked)
        in_flight |= set(picked)
        if in_flight:  # one result returns per round
            i = min(in_flight)
            in_flight.discard(i)
            s.observe(i, [1.0] * solved + [0.0] * (8 - solved), version)
        version += 1
        s.on_version(version)


def test_pooled_problems_are_retested_within_the_stated_bound():
    """A pooled problem is dispatched again within retest_interval * ceil(1/retest_share)
    versions (given dispatch capacity): nothing starves, easy or hard."""
    interval, share = 3, 0.25
    bound = interval * math.ceil(1 / share)
    s = sampler(n=60, retest_interval=interval, retest_share=share)
    truth = np.arange(60) % 3  # 0: always solved, 1: never solved, 2: mixed
    last = {}
    for version in range(1, 200):
        s.on_version(version)
        for i in s.next(8):
            if i in last and truth[i] != 2:
                assert version - last[i] <= bound + interval, (i, version, last[i])
            last[i] = version
            r = [1.0] * 8 if truth[i] == 0 else [0.0] * 8 if truth[i] == 1 else [1.0, 0.0] * 4
            s.observe(i, r, version)
    pooled = [i for i in range(60) if truth[i] != 2]
    assert all(i in last for i in pooled)
    assert all(199 - last[i] <= bound + interval for i in pooled)


def test_greedy_order_follows_priority():
    s = sampler(n=30, groups=1, mode="greedy", prior="flat", retest=False)
    first = s.next(30)
    rng = np.random.default_rng(1)
    for i in first:
        solved = int(rng.integers(0, 9))
        s.observe(i, [1.0] * solved + [0.0] * (8 - solved), 1)
    order = s.next(30)
    prios = [s.priority(i) for i in order]
    assert all(a >= b - 1e-9 for a, b in zip(prios, prios[1:]))


def test_solved_problem_whose_retest_fails_returns_to_heap():
    s = sampler(n=4, groups=1, retest_interval=1, retest_share=1.0, retest_after=1)
    picked = s.next(4)
    for i in picked:
        s.observe(i, [1.0] * 8, 0)
    assert all(s.state[i] == SOLVED for i in picked)
    s.on_version(1)
    retest = s.next(4)
    assert sorted(retest) == sorted(picked)
    s.observe(retest[0], [1.0, 0.0] * 4, 1)  # the retest fails sometimes: back to the heap
    assert s.state[retest[0]] == HEAP
    assert s.metrics()["retest_share"] > 0


@settings(max_examples=25, deadline=None)
@given(outcomes, st.integers(0, 99))
def test_snapshot_restore_gives_identical_future_dispatches(seq, seed):
    def drive(s, steps, v0):
        out = []
        for v, (solved, k) in enumerate(steps, v0):
            picked = s.next(k)
            out += picked
            for i in picked:
                s.observe(i, [1.0] * solved + [0.0] * (8 - solved), v)
            s.on_version(v)
        return out

    a = sampler(seed=seed, retest_interval=2)
    drive(a, seq, 0)
    from scheduler.snapshot import join_arrays, split_arrays

    arrays, rest = split_arrays(a.state_dict())  # numpy arrays + JSON, the snapshot format
    snapshot = join_arrays(json.loads(json.dumps(rest)), {k: v.copy() for k, v in arrays.items()})
    b = sampler(seed=seed + 1, retest_interval=2)
    b.load_state_dict(snapshot)
    assert drive(a, seq, len(seq)) == drive(b, seq, len(seq))


def test_group_prior_moves_unseen_priority():
    s = sampler(n=8, groups=2, prior="group", pseudo_count=2.0)
    before = s.unseen_priority(0)
    for i in s.next(8):
        if s.group[i] == 0:
            s.observe(i, [0.0] * 8, 0)  # group 0 looks hopeless
    assert s.unseen_priority(0) < before
