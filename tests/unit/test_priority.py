"""Problem samplers: property tests over random outcome sequences (scheduler/priority.py,
scheduler/samplers.py)."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.scheduler import priority
from prl.scheduler.priority import HEAP, SOLVED, UNSOLVED, PrioritySampler
from prl.scheduler.samplers import UniformSampler, make_sampler
from prl.schemas.config import ConfigError, load_config


def sampler(n=40, groups=4, seed=0, pseudo_count=2.0, retest_interval=10):
    return PrioritySampler(np.arange(n) % groups, pseudo_count, retest_interval, seed)


def group_of(solved: int) -> list[float]:
    return [1.0] * solved + [0.0] * (8 - solved)


outcomes = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 6)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(outcomes, st.sampled_from([1, 4]), st.integers(0, 99))
def test_in_flight_problem_never_dispatched_twice(seq, groups, seed):
    s = sampler(groups=groups, seed=seed, retest_interval=2)
    in_flight: set[int] = set()
    for version, (solved, k) in enumerate(seq):
        picked = s.next(k)
        assert len(picked) == len(set(picked))
        assert not in_flight & set(picked)
        in_flight |= set(picked)
        if in_flight:  # one result returns per round
            i = min(in_flight)
            in_flight.discard(i)
            s.observe(i, group_of(solved), version)
        s.on_version(version + 1)


def test_a_result_for_a_problem_never_dispatched_takes_it_out_of_the_never_tried_ones():
    """A first result the sampler did not ask for (an offline replay of a log) makes the problem
    tried: it is drawn from the heap, never again as a never-tried one, so one call cannot
    return it twice and the pool is still drawn once each."""
    s = sampler(n=12, groups=3, retest_interval=0)
    for i in (0, 4, 7):
        s.observe(i, [1.0, 0.0] * 4, 0)
    assert s.metrics()["unseen"] == 9
    assert sorted(s.next(12)) == list(range(12))
    assert s.metrics()["unseen"] == 0 and s.next(1) == []


def test_pooled_problems_are_retested_within_the_stated_bound():
    """A pooled problem is queued again within retest_interval * ceil(1/RETEST_SHARE) versions,
    and the queue is served at RETEST_CAP of the dispatches: it is dispatched again within that
    plus pool size / (RETEST_CAP x dispatches per version). Nothing starves."""
    interval, per_version, pooled = 3, 8, 40
    bound = interval * math.ceil(1 / priority.RETEST_SHARE) + math.ceil(pooled / (priority.RETEST_CAP * per_version))
    s = sampler(n=60, retest_interval=interval)
    truth = np.arange(60) % 3  # 0: always solved, 1: never solved, 2: mixed
    last = {}
    for version in range(1, 300):
        s.on_version(version)
        for i in s.next(per_version):
            if i in last and truth[i] != 2:
                assert version - last[i] <= bound + interval, (i, version, last[i])
            last[i] = version
            s.observe(i, [[1.0] * 8, [0.0] * 8, [1.0, 0.0] * 4][truth[i]], version)
    pooled_ids = [i for i in range(60) if truth[i] != 2]
    assert all(i in last for i in pooled_ids)
    assert all(299 - last[i] <= bound + interval for i in pooled_ids)


def test_solved_problem_whose_retest_fails_returns_to_heap(monkeypatch):
    monkeypatch.setattr(priority, "RETEST_SHARE", 1.0)
    s = sampler(n=4, groups=1, retest_interval=1)
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


def test_a_streak_of_a_whole_group_s_completions_moves_a_problem_to_a_pool():
    """The retest streak counts completions: two all-failed halves of a group decide as one
    all-failed group does; without retests (retest_interval = 0) nothing leaves the heap."""
    s = PrioritySampler(np.zeros(2, dtype=int), retest_interval=10, group_size=8)
    s.observe(0, [0.0] * 4, 0)
    assert s.state[0] == HEAP
    s.observe(0, [0.0] * 4, 1)
    assert s.state[0] == UNSOLVED
    never = PrioritySampler(np.zeros(2, dtype=int), retest_interval=0)
    never.observe(1, [1.0] * 8, 0)
    assert never.state[1] == HEAP


@settings(max_examples=25, deadline=None)
@given(outcomes, st.integers(0, 99))
def test_snapshot_restore_gives_identical_future_dispatches(seq, seed):
    def drive(s, steps, v0):
        out = []
        for v, (solved, k) in enumerate(steps, v0):
            picked = s.next(k)
            out += picked
            for i in picked:
                s.observe(i, group_of(solved), v)
            s.on_version(v)
        return out

    from prl.scheduler.snapshot import join_arrays, split_arrays

    a = sampler(seed=seed, retest_interval=2)
    drive(a, seq, 0)
    arrays, rest = split_arrays(a.state_dict())  # numpy arrays + JSON, the snapshot format
    snapshot = join_arrays(json.loads(json.dumps(rest)), {k: v.copy() for k, v in arrays.items()})
    b = sampler(seed=seed + 1, retest_interval=2)
    b.load_state_dict(snapshot)  # checks it holds together first
    assert drive(a, seq, len(seq)) == drive(b, seq, len(seq))


def test_without_a_label_an_unseen_problem_starts_at_the_pool_s_first_visit_rate():
    """The default prior needs no label: every problem is in one group, and an unseen problem
    starts at the pool's rate over first visits (Beta(1, 1) before any), as pseudo_count attempts."""
    cfg = load_config()
    assert cfg.task.group_field is None
    from prl.tasks import group_indices, train_problems

    names, labels = group_indices(train_problems(cfg.task))
    assert names == [""] and not labels.any()
    s = PrioritySampler(np.zeros(40, dtype=int), pseudo_count=2.0)
    assert s.unseen_priority(0) == pytest.approx(0.25)
    first = s.next(10)
    for j, i in enumerate(first):
        s.observe(i, group_of(2 if j % 2 else 0), 0)  # 10 of 80 solved
    rate = (10 + 1) / (80 + 2)
    unseen = [i for i in range(40) if s.last_tested[i] < 0]
    assert s.priorities(np.asarray(unseen)) == pytest.approx(rate * (1 - rate))
    p = (2 + 2 * rate) / (8 + 2)  # 2 of 8 solved, then 2 pseudo-attempts at the pool's rate
    assert s.priority(first[1]) == pytest.approx(p * (1 - p))


def test_a_label_gives_each_group_its_own_rate_when_asked_for():
    """task.group_field = "difficulty" (the built-in task's label, an opt-in): the groups are the
    digit counts, and one group's failures lower its unseen priority only."""
    from prl.tasks import group_indices, train_problems

    cfg = load_config(overrides=["task.group_field='difficulty'"])
    names, _ = group_indices(train_problems(cfg.task))
    assert names == ["1", "2", "3", "4"]
    s = sampler(n=8, groups=2)
    before = s.unseen_priority(0), s.unseen_priority(1)
    for i in s.next(8):
        if s.group[i] == 0:
            s.observe(i, [0.0] * 8, 0)  # group 0 looks hopeless
    assert s.unseen_priority(0) < before[0] and s.unseen_priority(1) == before[1]


def test_retesting_a_hopeless_groups_problems_does_not_move_its_prior(monkeypatch):
    monkeypatch.setattr(priority, "RETEST_SHARE", 1.0)
    monkeypatch.setattr(priority, "UNSEEN_SHARE", 0.0)
    s = sampler(n=8, groups=2, retest_interval=1)
    first = s.next(8)
    s.observe_many(first, [0 if s.group[i] == 0 else 4 for i in first], [8] * 8, 0)
    before = s.unseen_priority(0), s.group_rate(0)
    for version in range(1, 20):  # the hopeless group's problems are retested again and again
        s.on_version(version)
        picks = s.next(8)
        s.observe_many(picks, [0 if s.group[i] == 0 else 4 for i in picks], [8] * len(picks), version)
    assert (s.unseen_priority(0), s.group_rate(0)) == before


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


def test_picks_follow_priority_in_steady_state_whatever_the_call_size(monkeypatch):
    """After a long history, many small calls pick each problem in proportion to its priority
    among the problems choosable then: total-variation distance <= 0.05 (the wait bound off:
    it serves the rarest problems ahead of their turn)."""
    monkeypatch.setattr(priority, "UNSEEN_SHARE", 0.0)
    monkeypatch.setattr(priority, "MAX_WAIT", math.inf)
    rng = np.random.default_rng(0)
    n = 60
    rates = np.linspace(0.02, 0.98, n)
    s = sampler(n=n, groups=1, retest_interval=0)
    picks = s.next(n)
    s.observe_many(picks, [round(800 * rates[i]) for i in picks], [800] * n, 0)  # well-known problems
    steady_state_picks(s, rates, 3000, rng)  # history
    observed, expected = steady_state_picks(s, rates, 6000, rng)
    tv = 0.5 * np.abs(observed / observed.sum() - expected / expected.sum()).sum()
    assert tv <= 0.05, tv


def test_retests_take_at_most_their_cap_of_dispatches(monkeypatch):
    """With half the pool solved and a retest round every version, retests stay within
    RETEST_CAP of all dispatches while other problems are choosable."""
    monkeypatch.setattr(priority, "RETEST_SHARE", 1.0)
    n = 2000
    s = sampler(n=n, groups=4, retest_interval=1)
    truth = np.arange(n) % 2  # 0: mixed, 1: always solved
    for version in range(1, 300):
        s.on_version(version)
        picks = s.next(16)
        s.observe_many(picks, [8 if truth[i] else 4 for i in picks], [8] * len(picks), version)
    assert s.metrics()["retest_share"] <= priority.RETEST_CAP + 1e-9
    assert s.metrics()["retest_queued"] > 0  # the cap held retests back


def test_every_problem_is_dispatched_within_the_floor_bound_whatever_its_group():
    """Groups of very different success (never, rarely, half, always solved) and sizes: with
    UNSEEN_SHARE of the dispatches reserved for never-tried problems, all of them are tried
    within pool / (UNSEEN_SHARE x dispatches per round) rounds, even when a group looks hopeless."""
    sizes, per_round = [400, 300, 50, 250], 10
    groups = np.repeat(np.arange(4), sizes)
    success = np.array([0.0, 0.02, 0.5, 1.0])[groups]
    s = PrioritySampler(groups)
    rng = np.random.default_rng(0)
    bound = math.ceil(len(groups) / (priority.UNSEEN_SHARE * per_round))
    for version in range(bound):
        s.on_version(version)
        picks = s.next(per_round)
        s.observe_many(picks, [rng.binomial(8, success[i]) for i in picks], [8] * len(picks), version)
        if s.metrics()["unseen"] == 0:
            break
    assert s.metrics()["unseen"] == 0, (version, s.metrics())


def test_problems_seen_counts_problems_with_a_returned_result():
    s = sampler()
    picked = s.next(5)
    assert s.metrics()["problems_seen"] == 0  # dispatched, nothing returned yet
    for i in picked[:3]:
        s.observe(i, [1.0, 0.0], 0)
    assert s.metrics()["problems_seen"] == 3


@pytest.mark.parametrize("written, read, says", [
    (lambda: sampler(n=40, groups=1), lambda: sampler(n=40, groups=4), "priority sampler of 40 problems in 4 prior groups"),
    (lambda: sampler(n=40), lambda: sampler(n=30), "priority sampler of 30 problems"),
    (lambda: UniformSampler(40), lambda: sampler(n=40), "holds a uniform sampler's state"),
    (lambda: sampler(n=40), lambda: UniformSampler(40), "configuration's uniform sampler of 40 problems"),
])
def test_a_snapshot_of_another_sampler_is_refused_naming_both(written, read, says):
    """A run continued (or explained) with another strategy, label or task than it was started
    with: one ConfigError saying what the snapshot holds and what the configuration makes."""
    with pytest.raises(ConfigError) as err:
        read().load_state_dict(written().state_dict())
    assert says in str(err.value) and "the configuration it was started with" in str(err.value)


def short(values):
    return values[:-1]


@pytest.mark.parametrize("make, field, damage, says", [
    (lambda: sampler(), "group_stamp", short, "group_stamp has 3 entries"),
    (lambda: sampler(), "heap_problems", lambda v: np.r_[40, v[1:]], "heap_problems holds 40, outside -4..39"),
    (lambda: sampler(), "unseen_pos", lambda v: [11] + v[1:], "unseen_pos.0 holds 11, outside 0..10"),
    (lambda: sampler(), "unseen_order", lambda v: {k: o for k, o in v.items() if k != "2"}, "unseen_order is for groups"),
    (lambda: UniformSampler(40), "pass_order", lambda v: v + 40, "pass_order holds"),
    (lambda: sampler(), "trained", short, "trained has 39 entries"),
    (lambda: UniformSampler(40), "in_flight", lambda v: {"d": [40, 0.0, 0, 8]}, "in_flight holds 40"),
])
def test_a_snapshot_whose_fields_do_not_fit_its_pool_is_passed_over_for_the_one_before(
        tmp_path, capsys, make, field, damage, says):
    """Checksums catch a torn file, not a writer that wrote the wrong thing: a snapshot whose
    per-group list has one entry too few, or that names a problem outside the pool, costs one
    log line naming the field, and the scheduler resumes from the snapshot before."""
    from prl import logs
    from prl.scheduler.snapshot import expect_inside, expect_sized, read_snapshot, write_snapshot

    logs.configure("console", "info")
    s = make()
    s.next(6, set())
    run_dir = str(tmp_path / "run")
    good = {"next_seq": 1, "in_flight": {}, "sampler": s.state_dict(), "trained": np.zeros(40, np.uint8)}
    write_snapshot(run_dir, 1, good, [], [])
    bad = {**good, "next_seq": 2, "sampler": dict(good["sampler"])}
    if field in ("trained", "in_flight"):
        bad[field] = damage(good[field])
    else:
        bad["sampler"][field] = damage(good["sampler"][field])
    write_snapshot(run_dir, 2, bad, [], [])

    def check(state):  # what the scheduler checks (Scheduler.check_state)
        make().check_state(state["sampler"])
        expect_sized({"trained": (state["trained"], 40)})
        expect_inside({"in_flight": ([e[0] for e in state["in_flight"].values()], 0, 40)})

    state = read_snapshot(run_dir, check)[0]
    assert state["next_seq"] == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "unusable" in ln]
    assert len(lines) == 1 and "snap-00000002" in lines[0] and says in lines[0], lines


def test_explain_words_an_unlabelled_never_tried_problem_as_the_pool_s():
    from prl.cli.explain import why

    cfg = load_config()
    text = "\n".join(why(make_sampler(cfg, np.zeros(40, dtype=int)), 0, cfg))
    assert "drawn with the pool's never-tried problems" in text and "fixed random order" in text


def test_uniform_draws_each_problem_once_per_pass_and_survives_a_snapshot():
    """uniform: a data loader's epochs. Each pass holds every problem once (one in flight when
    its turn comes is passed over), and a sampler restored mid-pass continues the same pass."""
    s = UniformSampler(10, seed=3)
    first = s.next(6, set())
    rest = s.next(4, set())
    assert sorted(first + rest) == list(range(10))  # the first pass, in two calls
    in_flight = set(rest[:1])  # still in flight as the next pass starts: passed over in it
    second = s.next(9, in_flight)
    assert sorted(second) == sorted(set(range(10)) - in_flight)
    s.next(3, set())  # into the third pass
    copy = UniformSampler(10, seed=0)
    copy.load_state_dict(s.state_dict())
    assert copy.next(12, set()) == s.next(12, set())


class EveryOther:
    """A sampler of one's own (scheduler.strategy = module:Factory): even problems only."""

    zero_variance_filter = True

    def __init__(self, groups, cfg):
        self.inner = UniformSampler(len(groups), cfg.run.seed)

    def next(self, k, busy):
        return [i for i in self.inner.next(2 * k, busy) if i % 2 == 0][:k]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_strategy_of_one_s_own_is_loaded_by_module_and_factory():
    cfg = load_config(overrides=["scheduler.strategy='tests.unit.test_priority:EveryOther'"])
    s = make_sampler(cfg, np.zeros(10, dtype=int))
    assert isinstance(s, EveryOther) and all(i % 2 == 0 for i in s.next(5, set()))


def takes_groups_only(groups):
    """Not a sampler factory: it cannot be given the config."""


@pytest.mark.parametrize("strategy, says", [
    ("nonsense", "neither one of uniform, dapo_filter, priority nor module:Factory"),
    ("tests.unit.test_priority:takes_groups_only",
     "takes_groups_only cannot be called as takes_groups_only(groups, config): too many positional arguments"),
    ("tests.unit.test_priority:Missing", "tests.unit.test_priority has no Missing"),
    ("no_such_module_xyz:F", "cannot import no_such_module_xyz"),
])
def test_a_strategy_that_names_nothing_is_one_line(strategy, says):
    from prl.plugins import PluginError

    with pytest.raises((ConfigError, PluginError)) as err:
        make_sampler(load_config(overrides=[f"scheduler.strategy='{strategy}'"]), np.zeros(4, dtype=int))
    assert says in str(err.value)


def test_graded_rewards_go_to_a_pool_only_when_the_zero_variance_filter_drops_them():
    """With graded rewards a group that was trained (its rewards differ) stays in the heap even
    when every completion is on one side of the success threshold; a group of equal rewards goes
    to the pool its threshold says."""
    s = sampler(n=4, groups=1)
    picks = s.next(4)
    for i, rewards in zip(picks, ([0.2, 0.5] * 4, [1.0, 1.5] * 4, [0.2] * 8, [1.0] * 8)):
        s.observe(i, rewards, 0)
    assert [s.state[i] for i in picks] == [HEAP, HEAP, UNSOLVED, SOLVED]
    assert [s.successes[i] for i in picks] == [0, 8, 0, 8]  # solved: reward >= 1.0, the default threshold


def test_a_problem_the_policy_regressed_on_is_judged_by_its_recent_results():
    """Counts halve every HALF_LIFE versions: 40 of 40 solved long ago, then 1 of 8 now, gives
    an estimate below 1/2 (it was solved, it is not now); without forgetting it stays above 0.8."""
    estimates = []
    for half_life in (priority.HALF_LIFE, 0):
        s = PrioritySampler(np.zeros(4, dtype=np.int32), retest_interval=0, half_life=half_life)
        i = s.next(1)[0]
        s.observe_many([i], [40], [40], 0)
        s.release(i)
        s.observe_many([i], [1], [8], 5 * int(priority.HALF_LIFE))
        a, b = s.prior(np.asarray([i]))
        estimates.append(float((s.successes[i] + a[0]) / (s.attempts[i] + a[0] + b[0])))
    assert estimates[0] < 0.5 < 0.8 < estimates[1]


def dispatch_gaps(groups, success, rounds, per_round=16, seed=0) -> tuple[int, int]:
    """(problems never dispatched, longest wait in dispatches) over ``rounds`` rounds of
    ``per_round`` dispatches, one learner version each, results returned at once."""
    s = PrioritySampler(groups, seed=seed)
    rng = np.random.default_rng(seed)
    last = np.zeros(len(groups), dtype=np.int64)
    longest, dispatched = 0, 0
    for version in range(rounds):
        s.on_version(version)
        picks = s.next(per_round)
        for i in picks:
            dispatched += 1
            longest = max(longest, dispatched - last[i])
            last[i] = dispatched
        s.observe_many(picks, [rng.binomial(8, success[i]) for i in picks], [8] * len(picks), version)
    never = int((last == 0).sum())
    return never, max(longest, int((dispatched - last[last == 0]).max(initial=0)))


@pytest.mark.parametrize("labelled", [False, True])
def test_no_problem_waits_more_than_three_times_the_pool_in_dispatches(monkeypatch, labelled):
    """A pool of 1,880 problems, a quarter of them each nearly always, often, rarely and nearly
    never solved, with and without the label that groups them: over 6 x 1,880 dispatches every
    problem is dispatched within 3 x 1,880 of the start and of its last dispatch. Without the
    wait bound some are not (the test can fail)."""
    n = 1880
    groups = np.repeat(np.arange(4), n // 4) if labelled else np.zeros(n, dtype=np.int32)
    success = np.repeat([0.97, 0.6, 0.1, 0.01], n // 4)
    rounds = 6 * n // 16
    never, longest = dispatch_gaps(groups, success, rounds)
    assert never == 0 and longest <= 3 * n, (never, longest)
    monkeypatch.setattr(priority, "MAX_WAIT", math.inf)
    assert dispatch_gaps(groups, success, rounds)[1] > 3 * n
