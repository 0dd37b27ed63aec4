"""The papers' formulas (prl/formulas.py) against obvious references."""

import math

import numpy as np
import pytest

from prl import formulas as f


def test_success_estimate_and_bernoulli_variance():
    assert f.success_estimate(0, 0, 1, 1) == 0.5  # unseen: the prior mean
    assert f.success_estimate(3, 4, 1, 1) == pytest.approx(4 / 6)
    assert f.bernoulli_variance(0.5) == 0.25 and f.bernoulli_variance(0.0) == 0.0 == f.bernoulli_variance(1.0)
    rewards = np.array([1, 0, 0, 1, 1, 0, 0, 0], dtype=float)
    p = rewards.mean()
    assert f.bernoulli_variance(p) == pytest.approx(((rewards - p) ** 2).mean())  # the mean squared advantage


def test_pass_at_k_is_the_share_of_groups_with_a_solve():
    rng = np.random.default_rng(0)
    for p in (0.05, 0.5, 0.9):
        groups = rng.random((40_000, 8)) < p
        assert f.pass_at_k(p, 8) == pytest.approx(groups.any(1).mean(), abs=0.01)
    assert f.pass_at_k(0.0, 8) == 0.0 and f.pass_at_k(1.0, 8) == 1.0
    assert f.pass_at_k(0.3, 8) > 0.94  # flat from p = 0.3 up, an always-solved problem included


def test_signal_probability_is_the_share_of_groups_that_are_not_all_equal():
    rng = np.random.default_rng(0)
    for p in (0.05, 0.5, 0.8):
        groups = rng.random((40_000, 8)) < p
        mixed = (groups.any(1) & ~groups.all(1)).mean()
        assert f.signal_probability(p, 8) == pytest.approx(mixed, abs=0.01)
    assert f.signal_probability(0.0, 8) == 0.0 == f.signal_probability(1.0, 8)
    assert f.signal_probability(0.8, 8) == pytest.approx(f.signal_probability(0.2, 8))
    # flat where p(1-p) is not: p = 0.8 weighs 0.84 of p = 1/2 here, 0.64 under the variance
    assert f.signal_probability(0.8, 8) / f.signal_probability(0.5, 8) > 0.8


def test_group_advantages_and_signal():
    assert f.group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert f.group_advantages([1.0, 1.0]) == [0.0, 0.0]
    assert not f.has_signal([0.0, 0.0]) and f.has_signal([0.0, 1.0])


def test_unscaled_group_advantages_weigh_a_group_by_its_spread():
    """Dr. GRPO's r - mean(r): a half-solved group's advantages are larger than a 1-of-8
    group's success and failures alike, where GRPO's std scaling gives the rarer outcome more."""
    half, rare = [1.0] * 4 + [0.0] * 4, [1.0] + [0.0] * 7
    assert f.group_advantages(half, scale_by_std=False) == pytest.approx([0.5] * 4 + [-0.5] * 4)
    assert f.group_advantages(rare, scale_by_std=False) == pytest.approx([0.875] + [-0.125] * 7)
    assert sum(a * a for a in f.group_advantages(half, scale_by_std=False)) > \
        sum(a * a for a in f.group_advantages(rare, scale_by_std=False))
    assert sum(a * a for a in f.group_advantages(half)) == pytest.approx(sum(a * a for a in f.group_advantages(rare)), rel=1e-4)
    assert f.group_advantages([1.0, 1.0], scale_by_std=False) == [0.0, 0.0]


def test_rollout_age_decay_and_replay_priority():
    assert f.rollout_age(12, 9) == 3
    assert f.decay_factor(10, 10) == pytest.approx(0.5)
    assert f.replay_log_priority([2.0], 0.5, 0.0)[0] == pytest.approx(0.5 * math.log(2.0))


def test_gumbel_top_k_samples_in_proportion_to_weight():
    rng = np.random.default_rng(0)
    weights = np.array([1.0, 2.0, 7.0])
    firsts = np.bincount([np.argmax(f.gumbel_keys(np.log(weights), rng)) for _ in range(20_000)], minlength=3)
    assert firsts / firsts.sum() == pytest.approx(weights / weights.sum(), abs=0.015)


def test_the_next_exponential_clock_to_ring_is_proportional_to_its_rate_whatever_it_has_waited():
    """Clocks set at different times: the next ring still follows the rates (memorylessness)."""
    rng = np.random.default_rng(1)
    rates = np.array([1.0, 2.0, 7.0])
    wins = np.zeros(3)
    for _ in range(20_000):
        old = f.exponential_clock(0.0, rates[:2], rng)  # two clocks set long ago...
        now = 0.3
        alive = old > now  # ...that have not rung by now
        rings = np.concatenate([np.where(alive, old, np.inf), f.exponential_clock(now, rates[2:], rng)])
        if alive.all():
            wins[np.argmin(rings)] += 1
    assert wins / wins.sum() == pytest.approx(rates / rates.sum(), abs=0.015)


def test_one_exponential_clock_as_a_float_rings_when_the_array_form_would():
    """The scalar path (a never-tried group's clock, once per pick) draws the same Exp(1) from
    the stream as the array path, so the sampler's picks do not depend on which one runs."""
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    scalar = [f.exponential_clock(1.5, 0.25, a) for _ in range(100)]
    arrays = [f.exponential_clock(1.5, np.array([0.25]), b)[0] for _ in range(100)]
    assert all(isinstance(t, float) for t in scalar)
    assert scalar == [float(t) for t in arrays]


def test_a_first_pass_clock_rings_each_of_m_once_by_the_deadline_at_uniform_times():
    """Drawn again after each ring with one fewer, m first-pass clocks ring m times, all before the
    deadline, at times spread uniformly over [now, D)."""
    rng = np.random.default_rng(4)
    now, deadline, m, rings = 2.0, 6.0, 5_000, []
    for left in range(m, 0, -1):
        now = f.first_pass_clock(now, deadline, left, rng)
        rings.append(now)
    assert rings == sorted(rings) and 2.0 <= rings[0] and rings[-1] <= deadline
    quartiles = np.quantile(rings, [0.25, 0.5, 0.75])
    assert quartiles == pytest.approx([3.0, 4.0, 5.0], abs=0.1)
    assert f.first_pass_clock(7.0, deadline, 3, rng) == 7.0  # past the deadline: due now


def test_a_periodic_clock_rings_in_the_middle_of_its_next_period():
    """now + (1/2 + U) / w: between half a period and one and a half after it is set, one period
    on average; a float rate gives a float, drawn as the array form draws it."""
    rng = np.random.default_rng(2)
    rates = np.full(20_000, 4.0)
    rings = f.periodic_clock(10.0, rates, rng)
    assert rings.min() >= 10.0 + 0.5 / 4 and rings.max() <= 10.0 + 1.5 / 4
    assert rings.mean() == pytest.approx(10.0 + 1 / 4, abs=0.002)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [f.periodic_clock(1.0, 2.0, a) for _ in range(5)] == [float(f.periodic_clock(1.0, np.array([2.0]), b)[0])
                                                                 for _ in range(5)]
