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


def test_group_advantages_and_signal():
    assert f.group_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert f.group_advantages([1.0, 1.0]) == [0.0, 0.0]
    assert not f.has_signal([0.0, 0.0]) and f.has_signal([0.0, 1.0])


def test_rollout_age_and_replay_priority():
    assert f.rollout_age(12, 9) == 3
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
