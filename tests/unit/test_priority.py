"""Problem-level prioritized sampling: property tests over random outcome sequences."""

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.scheduler.priority import HEAP, SOLVED, UNSOLVED, PrioritySampler
from prl.scheduler.samplers import UniformSampler
from prl.schemas.config import ConfigError, PriorityConfig, load_config


def sampler(n=40, groups=4, seed=0, **kw):
    return PrioritySampler(np.arange(n) % groups, PriorityConfig(**kw), seed)


outcomes = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 6)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(outcomes, st.sampled_from(["greedy", "gumbel"]), st.sampled_from(["flat", "group", "pooled"]), st.integers(0, 99))
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


@pytest.mark.parametrize("prior", ["flat", "group"])
def test_a_result_for_a_problem_never_dispatched_takes_it_out_of_the_never_tried_ones(prior):
    """A first result the sampler did not ask for (an offline replay of a log) makes the problem
    tried: it is drawn from the heap, never again as a never-tried one, so one call cannot
    return it twice and the pool is still drawn once each."""
    s = sampler(n=12, groups=3, prior=prior, retest=False)
    for i in (0, 4, 7):
        s.observe(i, [1.0, 0.0] * 4, 0)
    assert s.metrics()["unseen"] == 9
    picks = s.next(12)
    assert sorted(picks) == list(range(12))
    assert s.metrics()["unseen"] == 0 and s.next(1) == []


def test_pooled_problems_are_retested_within_the_stated_bound():
    """A pooled problem is queued again within retest_interval * ceil(1/retest_share)
    versions, and the queue is served at retest_cap of the dispatches: it is dispatched again
    within that plus pool size / (retest_cap x dispatches per version). Nothing starves."""
    interval, share, cap, per_version, pooled = 3, 0.25, 0.2, 8, 40
    bound = interval * math.ceil(1 / share) + math.ceil(pooled / (cap * per_version))
    s = sampler(n=60, retest_interval=interval, retest_share=share, retest_cap=cap)
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


@pytest.mark.parametrize("weight,ratio", [("variance", 0.09 / 0.25), ("signal", 0.570 / 0.992), ("solvable", 1 / 0.996)])
def test_the_weight_sets_how_a_nearly_solved_problem_ranks_against_a_medium_one(weight, ratio):
    """With a flat Beta(1, 1) prior, 8 of 8 solved reads p = 0.9 and 4 of 8 p = 0.5: p(1-p)
    weighs the first 0.36 of the second; the chance of a signal in a group of 8, 0.57; the
    chance of a solve, as much as the second (both about 1)."""
    s = sampler(n=2, groups=1, prior="flat", retest=False, weight=weight)
    s.observe(0, [1.0] * 8, 0)
    s.observe(1, [1.0, 0.0] * 4, 0)
    assert s.priority(0) / s.priority(1) == pytest.approx(ratio, rel=0.01)


def test_the_solvable_weight_sets_aside_a_group_never_solved_and_draws_the_rest_alike():
    """Under the group prior, after every problem's first group: a group never solved leaves its
    problems a small fraction of the weight, while always-solved and half-solved problems of the
    other group weigh alike (p(1-p) or the chance of a signal would set the always-solved aside)."""
    s = sampler(n=40, groups=2, prior="group", retest=False, unseen_share=0.0, weight="solvable")
    for i in s.next(40):
        s.observe(i, [0.0] * 8 if i % 2 == 0 else ([1.0] * 8 if i % 4 == 1 else [1.0, 0.0] * 4), 0)
    dead, solved, medium = (s.priority(i) for i in (0, 1, 3))
    assert dead < 0.1 * medium
    assert solved == pytest.approx(medium, rel=0.01)
    picks = s.next(20)
    assert sum(i % 2 == 0 for i in picks) <= 2


def test_solvable_over_more_groups_weighs_a_rarely_solved_problem_as_an_often_solved_one():
    """pass@G weighs a problem solved 1 time in 10 about half as much as one solved every other
    time (0.57 against 1.00 at G = 8); judged over 5 groups (pass@40) the two weigh alike, and a
    problem that looks never solved stays set aside either way."""
    def weights(n):
        s = sampler(n=3, groups=1, prior="flat", alpha=0.001, beta=0.001, retest=False, weight="solvable", solvable_groups=n)
        for i, solved in enumerate((0, 8, 40)):
            s.observe(i, [1.0] * solved + [0.0] * (80 - solved), 0)
        return [s.priority(i) for i in range(3)]

    never, rare, often = weights(1)
    assert rare / often == pytest.approx(1 - 0.9 ** 8, abs=0.01)
    never, rare, often = weights(5)
    assert rare / often > 0.98
    assert never < 1e-3 * often


def test_a_light_group_start_sets_a_dead_group_aside_after_one_failed_visit():
    """A group's starting rate weighs group_start_weight attempts: at 2 (Beta(1, 1)) one failed
    first group of 8 leaves the group at 1/10, still weighing 0.57 of a solved one under pass@8;
    at 0.2 (Beta(0.1, 0.1)) it falls to 0.1/8.2 and weighs under a tenth, while a group whose first
    visit is half solved stays where its visit puts it."""
    def rates_and_weights(start_weight):
        s = sampler(n=4, groups=2, prior="group", pseudo_count=1000, weight="solvable", retest=False,
                    unseen_share=0.0, group_start_weight=start_weight)
        s.observe(0, [0.0] * 8, 0)  # group 0: one first visit, never solved
        s.observe(1, [1.0] * 4 + [0.0] * 4, 0)  # group 1: half solved
        return s.group_rate(0), s.group_rate(1), s.unseen_priority(0), s.unseen_priority(1)

    dead, half, w_dead, w_half = rates_and_weights(2.0)
    assert dead == pytest.approx(1 / 10) and half == pytest.approx(5 / 10) and w_dead / w_half > 0.5
    dead, half, w_dead, w_half = rates_and_weights(0.2)
    assert dead == pytest.approx(0.1 / 8.2) and half == pytest.approx(0.5) and w_dead / w_half < 0.1


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


def test_the_retest_streak_counts_completions_so_screens_weigh_their_share_of_a_group():
    """With screening, an all-failed screen of 2 is a quarter of a group of 8's evidence: a
    problem goes to the unsolved pool after four such screens (retest_after = 1), not one."""
    s = PrioritySampler(np.zeros(2, dtype=int), PriorityConfig(prior="flat", retest_after=1), seed=0, group_size=8)
    states = []
    for look in range(4):
        s.observe(0, [0.0, 0.0], look)
        states.append(s.state[0])
    assert states == [HEAP, HEAP, HEAP, UNSOLVED]
    s.observe(1, [0.0] * 8, 4)  # one whole group decides, as before
    assert s.state[1] == UNSOLVED


@settings(max_examples=25, deadline=None)
@given(outcomes, st.integers(0, 99), st.sampled_from([{}, {"mode": "periodic", "unseen_clock": "periodic"}]))
def test_snapshot_restore_gives_identical_future_dispatches(seq, seed, clocks):
    def drive(s, steps, v0):
        out = []
        for v, (solved, k) in enumerate(steps, v0):
            picked = s.next(k)
            out += picked
            for i in picked:
                s.observe(i, [1.0] * solved + [0.0] * (8 - solved), v)
            s.on_version(v)
        return out

    a = sampler(seed=seed, retest_interval=2, **clocks)
    drive(a, seq, 0)
    from prl.scheduler.snapshot import check_state, join_arrays, split_arrays

    arrays, rest = split_arrays(a.state_dict())  # numpy arrays + JSON, the snapshot format
    snapshot = join_arrays(json.loads(json.dumps(rest)), {k: v.copy() for k, v in arrays.items()})
    check_state({"sampler": snapshot, "in_flight": {}})  # a state as written holds together
    b = sampler(seed=seed + 1, retest_interval=2, **clocks)
    b.load_state_dict(snapshot)
    assert drive(a, seq, len(seq)) == drive(b, seq, len(seq))


def test_group_prior_moves_unseen_priority():
    s = sampler(n=8, groups=2, prior="group", pseudo_count=2.0)
    before = s.unseen_priority(0)
    for i in s.next(8):
        if s.group[i] == 0:
            s.observe(i, [0.0] * 8, 0)  # group 0 looks hopeless
    assert s.unseen_priority(0) < before


def test_a_groups_starting_rate_is_its_prior_until_first_visits_say_otherwise():
    """group_start (answer-likelihood groups: the model's own expected success) replaces 1/2
    as each group's rate before any first visit, with the weight of two attempts: a group
    expected hopeless is not drawn by the clocks, and its first visits still move it."""
    s = PrioritySampler(np.arange(200) % 2, PriorityConfig(prior="group", unseen_share=0.0), seed=0,
                        group_start=[0.0, 0.3])
    assert s.group_rate(0) == 0.0 and s.group_rate(1) == pytest.approx(0.3)
    assert all(s.group[i] == 1 for i in s.next(50))  # the expected-hopeless group waits
    assert sampler(n=8, groups=2, prior="group").group_rate(0) == 0.5  # no start given: 1/2, as Beta(1, 1)
    s.observe_many([0, 2], [6, 6], [8, 8], 0)  # two first visits say group 0 is solvable
    assert s.group_rate(0) == pytest.approx(12 / 18) and s.unseen_priority(0) > 0.2
    from prl.cli.explain import why
    from prl.schemas.config import SchedulerConfig

    text = "\n".join(why(s, 4, SchedulerConfig(priority=s.cfg)))
    assert "from a start of 0.000, the expected success of its answer-likelihood bin" in text


def test_pooled_prior_is_the_pools_first_visit_rate_whatever_the_labels():
    """prior = pooled needs no label: every unseen problem, whatever its group label, starts
    at the pool's rate over first visits, as a pseudo-count; a flat prior stays at p = 1/2."""
    s, flat = sampler(n=40, groups=4, prior="pooled", pseudo_count=2.0), sampler(n=40, groups=4, prior="flat")
    assert s.unseen_priority(0) == pytest.approx(0.25)
    first = s.next(10)
    for j, i in enumerate(first):
        s.observe(i, [1.0] * (2 if j % 2 else 0) + [0.0] * (8 - (2 if j % 2 else 0)), 0)  # 10 of 80 solved
    rate = (10 + 1) / (80 + 2)  # the pool's first-visit rate under its Beta(1, 1)
    unseen = [i for i in range(40) if s.last_tested[i] < 0]
    assert {int(s.group[i]) for i in range(40)} == {0}
    assert s.priorities(np.asarray(unseen)) == pytest.approx(rate * (1 - rate))
    assert flat.priority(0) == pytest.approx(0.25)
    mixed = first[1]  # 2 of 8 solved, then 2 pseudo-attempts at the pool's rate
    p = (2 + 2 * rate) / (8 + 2)
    assert s.priority(mixed) == pytest.approx(p * (1 - p))


@pytest.mark.parametrize("prior", ["flat", "pooled"])
def test_a_prior_without_a_label_explores_without_it(prior):
    """The never-tried floor goes round-robin over the sampler's groups; without a label
    (flat, pooled) there is one, so first visits do not balance across the labels: a floor-only
    sampler over labels of 4 and 36 problems draws the small label's problems at their share
    (1/10), not at half the picks."""
    labels = np.asarray([0] * 4 + [1] * 36)
    s = PrioritySampler(labels, PriorityConfig(prior=prior, unseen_share=1.0), seed=0)
    firsts = [s.next(1)[0] for _ in range(8)]
    assert {int(s.group[i]) for i in range(40)} == {0}
    assert sum(labels[i] == 0 for i in firsts) <= 3  # round-robin over the labels would give 4


def steady_state_picks(s, rates, calls: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(observed picks, expected picks) per problem over ``calls`` calls of 1-4 picks, each
    result returned at once with the problem's own success rate (so priorities stay put)."""
    observed, expected = np.zeros(len(rates)), np.zeros(len(rates))
    for _ in range(calls):
        k = int(rng.integers(1, 5))
        available = np.flatnonzero(s._state_np == 0)
        w = s.priorities(available)
        expected[available] += k * w / w.sum()
        picks = s.next(k)
        observed[picks] += 1
        s.observe_many(picks, [round(8 * rates[i]) for i in picks], [8] * len(picks), 0)
    return observed, expected


@pytest.mark.parametrize("mode", ["gumbel", "periodic"])
def test_picks_follow_priority_in_steady_state_whatever_the_call_size(mode):
    """After a long history, many small calls pick each problem in proportion to its priority
    among the problems choosable then: total-variation distance <= 0.05."""
    rng = np.random.default_rng(0)
    n = 60
    rates = np.linspace(0.02, 0.98, n)
    s = sampler(n=n, groups=1, prior="flat", retest=False, unseen_share=0.0, mode=mode)
    picks = s.next(n)
    s.observe_many(picks, [round(800 * rates[i]) for i in picks], [800] * n, 0)  # well-known problems
    steady_state_picks(s, rates, 3000, rng)  # history
    observed, expected = steady_state_picks(s, rates, 6000, rng)
    tv = 0.5 * np.abs(observed / observed.sum() - expected / expected.sum()).sum()
    assert tv <= 0.05, tv


def test_periodic_clocks_draw_equal_priorities_in_passes_where_exponential_ones_do_not():
    """Twenty problems of equal priority, one pick at a time, each result back at once: with
    periodic clocks every problem comes back after about 1/2 to 3/2 of a pass (10 to 30 picks,
    give or take the other clocks' jitter), as in a data loader's shuffled epochs; exponential
    clocks leave some waiting five passes and more."""
    gaps = {}
    for mode in ("periodic", "gumbel"):
        s = sampler(n=20, groups=1, prior="flat", retest=False, mode=mode)
        last, gaps[mode] = {}, []
        for t in range(2_000):
            (i,) = s.next(1)
            if i in last:
                gaps[mode].append(t - last[i])
            last[i] = t
            s.observe(i, [1.0, 0.0] * 4, 0)  # p stays at 1/2: every priority alike
        gaps[mode] = gaps[mode][100:]  # once every problem has been tried
    low, high = np.percentile(gaps["periodic"], [1, 99])
    assert 6 <= low and high <= 34 and max(gaps["periodic"]) <= 40
    assert statistics.mean(gaps["periodic"]) == pytest.approx(20, rel=0.02)
    assert max(gaps["gumbel"]) > 100


def first_looks(unseen_clock, picks, groups=None, success=None, **kw):
    """Problems tried after each pick, one pick at a time, each result back at once; a problem
    is solved half the time unless ``success`` says otherwise."""
    groups = np.zeros(100, dtype=int) if groups is None else groups
    s = PrioritySampler(groups, PriorityConfig(retest=False, unseen_share=0.0, mode="periodic", unseen_clock=unseen_clock,
                                               **kw), seed=3)
    tried, counts = set(), []
    for _ in range(picks):
        (i,) = s.next(1)
        tried.add(i)
        counts.append(set(tried))
        rate = 0.5 if success is None else success[i]
        s.observe(i, [1.0] * round(8 * rate) + [0.0] * (8 - round(8 * rate)), 0)
    return counts


def test_a_periodic_never_tried_clock_makes_the_first_look_at_the_pool_a_pass():
    """A hundred problems of equal weight: with the never-tried problems' exponential clock (rate
    m w) a pass's worth of picks leaves about a third untried, as independent draws would; with
    unseen_clock = periodic each is due once within the first period, so nearly all are tried in
    the first hundred picks and every one soon after, before the problems tried first come back
    much (they ring half a period to one and a half after their result)."""
    flat = dict(prior="flat", alpha=0.1, beta=0.1, weight="signal")
    exponential, periodic = first_looks("exponential", 200, **flat), first_looks("periodic", 200, **flat)
    assert len(exponential[99]) <= 80 and len(exponential[199]) < 100
    assert len(periodic[99]) >= 90 and len(periodic[119]) == 100


def test_a_periodic_never_tried_clock_stretches_a_groups_first_pass_when_its_weight_falls():
    """Two groups of 200: one solved half the time, one never (a light group start, so a failed
    first visit sets its group nearly aside). The half-solved group is tried once over within about
    its first period; the never-solved group's first looks spread over its own, much longer period:
    most of its problems are still untried when the other group's pass is done."""
    groups = np.repeat([0, 1], 200)
    success = np.where(groups == 0, 0.5, 0.0)
    counts = first_looks("periodic", 400, groups=groups, success=success, prior="group", pseudo_count=1000,
                         weight="solvable", group_start_weight=0.2)
    done = next(t for t, tried in enumerate(counts) if sum(groups[i] == 0 for i in tried) == 200)
    assert done <= 260  # about a pass of the half-solved group, with the other group's few looks
    assert sum(groups[i] == 1 for i in counts[done]) <= 40


def test_a_periodic_never_tried_clock_needs_periodic_mode():
    with pytest.raises(ValueError, match="unseen_clock = 'periodic' acts only with mode = 'periodic'"):
        PriorityConfig(unseen_clock="periodic", mode="gumbel")


def test_retests_take_at_most_their_cap_of_dispatches():
    """With half the pool solved or hopeless and a retest round every version, retests stay
    within retest_cap of all dispatches while other problems are choosable."""
    n, cap = 2000, 0.2
    s = sampler(n=n, groups=4, retest_interval=1, retest_share=1.0, retest_cap=cap)
    truth = np.arange(n) % 2  # 0: mixed, 1: always solved
    for version in range(1, 300):
        s.on_version(version)
        picks = s.next(16)
        s.observe_many(picks, [8 if truth[i] else 4 for i in picks], [8] * len(picks), version)
    assert s.metrics()["retest_share"] <= cap + 1e-9
    assert s.metrics()["retest_queued"] > 0  # the cap held retests back


@pytest.mark.parametrize("group_start", [None, [0.0, 0.0, 0.5, 1.0]])
def test_every_problem_is_dispatched_within_the_floor_bound_whatever_its_group(group_start):
    """Groups of very different success (never, rarely, half, always solved) and sizes: with
    unseen_share of the dispatches reserved for never-tried problems, all of them are tried
    within pool / (unseen_share x dispatches per round) rounds, even when the group prior
    makes a group look hopeless."""
    sizes, per_round, share = [400, 300, 50, 250], 10, 0.1
    groups = np.repeat(np.arange(4), sizes)
    success = np.array([0.0, 0.02, 0.5, 1.0])[groups]
    s = PrioritySampler(groups, PriorityConfig(prior="group", unseen_share=share), seed=0, group_start=group_start)
    rng = np.random.default_rng(0)
    bound = math.ceil(len(groups) / (share * per_round))
    for version in range(bound):
        s.on_version(version)
        picks = s.next(per_round)
        s.observe_many(picks, [rng.binomial(8, success[i]) for i in picks], [8] * len(picks), version)
        if s.metrics()["never_dispatched_share"] == 0:
            break
    assert s.metrics()["never_dispatched_share"] == 0, (version, s.metrics())


def test_retesting_a_hopeless_groups_problems_does_not_move_its_prior():
    s = sampler(n=8, groups=2, prior="group", retest_interval=1, retest_share=1.0, unseen_share=0.0)
    first = s.next(8)
    s.observe_many(first, [0 if s.group[i] == 0 else 4 for i in first], [8] * 8, 0)
    before = s.unseen_priority(0), s.group_rate(0)
    for version in range(1, 20):  # the hopeless group's problems are retested again and again
        s.on_version(version)
        picks = s.next(8)
        s.observe_many(picks, [0 if s.group[i] == 0 else 4 for i in picks], [8] * len(picks), version)
    assert (s.unseen_priority(0), s.group_rate(0)) == before


def test_decay_on_read_brings_a_problem_without_results_back_to_its_prior():
    s = sampler(n=2, groups=1, prior="flat", retest=False, half_life_versions=5.0, unseen_share=0.0)
    picks = s.next(2)
    s.observe_many(picks, [8, 8], [8, 8], 0)  # both look solved: low priority
    low = s.priority(picks[0])
    s.on_version(10)  # two half-lives, no new result
    mid = s.priority(picks[0])
    s.on_version(50)
    assert low < mid < s.priority(picks[0]) <= 0.25 and s.priority(picks[0]) == pytest.approx(0.25, abs=0.01)


def test_problems_seen_counts_problems_with_a_returned_result():
    s = sampler()
    picked = s.next(5)
    assert s.metrics()["problems_seen"] == 0  # dispatched, nothing returned yet
    for i in picked[:3]:
        s.observe(i, [1.0, 0.0], 0)
    assert s.metrics()["problems_seen"] == 3


@pytest.mark.parametrize("written, read, says", [
    (lambda: sampler(n=40, groups=4, prior="pooled"), lambda: sampler(n=40, groups=4, prior="group"),
     "holds a priority sampler of 40 problems in 1 prior group, this configuration makes a priority sampler of 40 "
     "problems in 4 prior groups"),
    (lambda: sampler(n=40), lambda: sampler(n=30), "of 40 problems in 4 prior groups, this configuration makes a "
     "priority sampler of 30 problems"),
    (lambda: UniformSampler(40), lambda: sampler(n=40), "holds a uniform sampler (strategy uniform or dapo_filter) of 40"),
    (lambda: sampler(n=40), lambda: UniformSampler(40), "this configuration makes a uniform sampler"),
])
def test_a_snapshot_of_another_sampler_is_refused_naming_both(written, read, says):
    """A run continued (or explained) with another strategy, prior or task than it was started
    with: one ConfigError saying what the snapshot holds and what the configuration makes."""
    state = written().state_dict()
    with pytest.raises(ConfigError) as err:
        read().load_state_dict(state)
    assert says in str(err.value) and "the configuration it was started with" in str(err.value)
    legacy = {k: v for k, v in state.items() if k not in ("sampler", "groups")}  # a snapshot from before they were kept
    with pytest.raises(ConfigError):
        read().load_state_dict(legacy)


def short(values):
    return values[:-1]


@pytest.mark.parametrize("make, field, damage, says", [
    (lambda: sampler(mode="periodic", unseen_clock="periodic"), "group_stamp", short, "group_stamp has 3 entries"),
    (lambda: sampler(), "unseen_deadline", lambda v: v + [1.0], "unseen_deadline has 5 entries"),
    (lambda: sampler(), "heap_problems", lambda v: np.r_[40, v[1:]], "heap_problems holds 40, outside -4..39"),
    (lambda: sampler(), "unseen_pos", lambda v: [11] + v[1:], "unseen_pos.0 holds 11, outside 0..10"),
    (lambda: sampler(), "unseen_order", lambda v: {k: o for k, o in v.items() if k != "2"}, "unseen_order is for groups"),
    (lambda: UniformSampler(40, passes=True), "pass_order", lambda v: v + 40, "pass_order holds"),
    (lambda: sampler(), "trained", short, "trained has 39 entries"),
    (lambda: UniformSampler(40), "in_flight", lambda v: {"d": [40, 0.0, 0, 8, 0]}, "in_flight holds 40"),
])
def test_a_snapshot_whose_fields_do_not_fit_its_pool_is_passed_over_for_the_one_before(
        tmp_path, capsys, make, field, damage, says):
    """Checksums catch a torn file, not a writer that wrote the wrong thing: a snapshot whose
    per-group list has one entry too few or too many, or that names a problem outside the pool,
    costs one log line naming the field, and the scheduler resumes from the snapshot before."""
    from prl import logs
    from prl.scheduler.snapshot import read_snapshot, write_snapshot

    logs.configure("console", "info")
    s = make()
    s.next(6, set()) if isinstance(s, UniformSampler) else s.next(6)
    run_dir = str(tmp_path / "run")
    good = {"next_seq": 1, "in_flight": {}, "sampler": s.state_dict(), "trained": np.zeros(40, np.uint8)}
    write_snapshot(run_dir, 1, good, [], [])
    bad = {**good, "next_seq": 2, "sampler": dict(good["sampler"])}
    if field in ("trained", "in_flight"):
        bad[field] = damage(good[field])
    else:
        bad["sampler"][field] = damage(good["sampler"][field])
    write_snapshot(run_dir, 2, bad, [], [])
    state = read_snapshot(run_dir)[0]
    assert state["next_seq"] == 1
    make().load_state_dict(state["sampler"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "unusable" in ln]
    assert len(lines) == 1 and "snap-00000002" in lines[0] and says in lines[0], lines


@pytest.mark.parametrize("prior, says, not_says", [
    ("group", "drawn with its group's never-tried problems", "fixed random order"),
    ("flat", "drawn with the pool's never-tried problems", "round-robin over groups"),
    ("pooled", "drawn with the pool's never-tried problems", "round-robin over groups"),
])
def test_explain_words_a_never_tried_problem_as_its_prior_draws_it(prior, says, not_says):
    """`prl explain`: under the flat and pooled priors the task's groups play no part, and
    the explanation does not say they do."""
    from prl.cli.explain import why
    from prl.schemas.config import SchedulerConfig

    cfg = SchedulerConfig(priority=PriorityConfig(prior=prior))
    s = PrioritySampler(np.arange(40) % 4, cfg.priority, seed=0)
    text = "\n".join(why(s, 0, cfg))
    assert "never tried" in text and says in text and not_says not in text
    assert ("over first tries" in text) == (prior != "flat")  # a flat prior learns no shared rate


def test_explain_says_when_a_never_tried_problem_is_due_under_a_first_pass_clock():
    from prl.cli.explain import why
    from prl.schemas.config import SchedulerConfig

    for clock, says in (("periodic", True), ("exponential", False)):
        cfg = SchedulerConfig(priority=PriorityConfig(mode="periodic", unseen_clock=clock))
        s = PrioritySampler(np.arange(40) % 4, cfg.priority, seed=0)
        text = "\n".join(why(s, 0, cfg))
        assert ("each due once by the group's first pass's end" in text) == says, text


def test_uniform_passes_draw_each_problem_once_per_pass_and_survive_a_snapshot():
    """uniform_passes: a data loader's epochs. Each pass holds every problem once (one in flight
    when its turn comes is passed over), and a sampler restored mid-pass continues the same pass."""
    s = UniformSampler(10, seed=3, passes=True)
    first = s.next(6, set())
    assert len(set(first)) == 6
    rest = s.next(4, set())
    assert sorted(first + rest) == list(range(10))  # the first pass, in two calls
    in_flight = set(rest[:1])  # still in flight as the next pass starts: passed over in it
    second = s.next(9, in_flight)
    assert sorted(second) == sorted(set(range(10)) - in_flight)
    s.next(3, set())  # into the third pass
    copy = UniformSampler(10, seed=0, passes=True)
    copy.load_state_dict(s.state_dict())
    assert copy.next(12, set()) == s.next(12, set())


def test_uniform_draws_without_passes_repeat_a_problem_before_the_pool_is_covered():
    s = UniformSampler(20, seed=1)
    picks = [i for _ in range(20) for i in s.next(1, set())]
    assert len(set(picks)) < 20  # with replacement: some problem twice, some not at all
    p = UniformSampler(20, seed=1, passes=True)
    assert sorted(i for _ in range(20) for i in p.next(1, set())) == list(range(20))


def test_drop_unsolved_leaves_out_a_problem_after_a_failed_group_and_survives_a_snapshot():
    """uniform_drop_unsolved: a label-free dead-problem filter. A problem never solved after a
    whole group is never drawn again (passes go on over the rest); one solved once stays, whatever
    its later groups; a restored sampler keeps its drops; and a pool dropped whole starts over
    instead of stalling."""
    s = UniformSampler(10, seed=2, passes=True, drop_unsolved=True)
    first = s.next(10, set())
    dead = {0, 3, 7}
    for i in first:
        s.observe(i, [0.0] * 8 if i in dead else [1.0] * 4 + [0.0] * 4, version=0)
    assert s.metrics()["problems_dropped"] == 3
    s.observe(1, [0.0] * 8, version=1)  # solved before: a failed group does not drop it
    assert s.metrics()["problems_dropped"] == 3
    later = [i for _ in range(5) for i in s.next(7, set())]
    assert sorted(set(later)) == sorted(set(range(10)) - dead) and len(later) == 35  # five whole passes of the rest
    copy = UniformSampler(10, seed=0, passes=True, drop_unsolved=True)
    copy.load_state_dict(s.state_dict())
    assert not dead & set(copy.next(20, set()))
    everything = UniformSampler(4, seed=0, drop_unsolved=True)
    for i in everything.next(4, set()):
        everything.observe(i, [0.0] * 8, version=0)
    assert sorted(everything.next(4, set())) == [0, 1, 2, 3]  # forgiven: nothing else to draw
    assert UniformSampler(10, seed=2, passes=True).dropped == set()  # off by default: nothing dropped
    screened = UniformSampler(2, seed=0, drop_unsolved=True, group_size=8)
    screened.observe(0, [0.0, 0.0], version=0)  # a failed screen of 2 is not yet a whole group
    assert screened.dropped == set()
    screened.observe(0, [0.0] * 6, version=0)
    assert screened.dropped == {0}


def test_explain_says_a_uniform_problem_was_dropped():
    from prl.cli.explain import why_uniform

    s = UniformSampler(3, seed=0, drop_unsolved=True)
    s.observe(0, [0.0] * 8, version=0)
    s.observe(1, [1.0] + [0.0] * 7, version=0)
    assert why_uniform(s, 0, "uniform") == ["  chosen uniformly (strategy uniform); tried 8 rollouts; never solved after "
                                            "a whole group, so dropped: not drawn again (scheduler.uniform_drop_unsolved)"]
    assert why_uniform(s, 1, "uniform") == ["  chosen uniformly (strategy uniform); tried 8 rollouts"]


def test_drop_unsolved_is_refused_with_the_priority_sampler():
    with pytest.raises(ConfigError, match="scheduler: uniform_drop_unsolved acts only with strategy uniform or dapo_filter"):
        load_config(overrides=["scheduler.uniform_drop_unsolved=true", "scheduler.strategy='success_variance'"])
    assert load_config(overrides=["scheduler.uniform_drop_unsolved=true", "scheduler.strategy='uniform'"]).scheduler.uniform_drop_unsolved
