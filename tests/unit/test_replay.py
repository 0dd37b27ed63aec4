"""Rollout replay: tau_max eviction, fresh-anchored batches, priority^alpha draws."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prl.scheduler.batches import compose_batch
from prl.scheduler.replay import ReplayBuffer
from prl.schemas import Rollout, RolloutGroup, TrainRollout

_counter = iter(range(10**9))


def group(version, rewards=(1.0, 0.0, 0.0, 1.0), completion=3):
    did = f"d{next(_counter)}"
    return RolloutGroup(did, f"p{did}", version, "x", [1, 2], 1.0,
                        [Rollout([5] * completion, [-0.5] * completion, r, "stop") for r in rewards])


def rollout(adv, version=0, rid=None):
    return TrainRollout(rid or f"r{next(_counter)}", "p", version, False, adv, 1.0, 1.0, [1], [2], [-0.1])


events = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(events, st.integers(0, 4), st.floats(0, 2), st.integers(5, 60))
def test_no_stale_and_no_duplicate_rollout_in_any_batch(seq, tau_max, ratio, capacity):
    """Randomized versions, arrivals and draws: every batch is within tau_max of the
    learner version it was built for, and holds each rollout at most once."""
    buffer = ReplayBuffer(capacity=capacity, seed=1)
    version, pending = 0, []
    for n, (advance, arrivals) in enumerate(seq):
        version += advance
        # producers lag: arrivals carry versions up to 2 * tau_max + 2 behind
        pending += [group(max(0, version - (n * 7 + i) % (2 * tau_max + 3))) for i in range(arrivals)]
        comp = compose_batch(pending, seq=n, learner_version=version, rollouts_generated=0, tau_max=tau_max,
                             max_tokens=10**6, buffer=buffer, replay_ratio=ratio, warmup_updates=0)
        pending = comp.leftover
        if comp.batch is None:
            continue
        ids = [r.rollout_id for r in comp.batch.rollouts]
        assert len(ids) == len(set(ids))
        assert all(version - r.policy_version <= tau_max for r in comp.batch.rollouts)
        assert all(not r.is_replay for r in comp.batch.rollouts[: len(ids) - comp.replay_drawn])


def test_batch_is_fresh_then_round_r_times_fresh_replay():
    buffer = ReplayBuffer(capacity=1000, seed=0)
    buffer.insert([rollout(a, version=5) for a in np.linspace(-2, 2, 100)], [0] * 100)
    groups = [group(5) for _ in range(3)]  # 12 fresh rollouts
    comp = compose_batch(groups, seq=0, learner_version=6, rollouts_generated=0, tau_max=2, max_tokens=10**6,
                         buffer=buffer, replay_ratio=0.5, warmup_updates=0)
    flags = [r.is_replay for r in comp.batch.rollouts]
    assert flags == [False] * 12 + [True] * 6  # round(0.5 * 12)


def test_fewer_replayed_never_stale_when_not_enough_eligible():
    buffer = ReplayBuffer(capacity=1000, seed=0)
    buffer.insert([rollout(1.0, version=0) for _ in range(50)], [0] * 50)  # will be stale
    buffer.insert([rollout(1.0, version=9) for _ in range(2)], [0] * 2)  # eligible
    comp = compose_batch([group(9) for _ in range(4)], seq=0, learner_version=10, rollouts_generated=0, tau_max=3,
                         max_tokens=10**6, buffer=buffer, replay_ratio=1.0, warmup_updates=0)
    replayed = [r for r in comp.batch.rollouts if r.is_replay]
    assert len(replayed) == 2 and all(r.policy_version == 9 for r in replayed)
    assert buffer.evicted_stale.sum() == 50


def test_no_replay_during_warmup_and_stale_fresh_groups_dropped():
    buffer = ReplayBuffer(capacity=100)
    buffer.insert([rollout(1.0, version=3) for _ in range(10)], [0] * 10)
    comp = compose_batch([group(3), group(0, rewards=(0.0, 0.0, 0.0, 1.0))], seq=0, learner_version=4,
                         rollouts_generated=0, tau_max=2, max_tokens=10**6, buffer=buffer, replay_ratio=1.0,
                         warmup_updates=5)
    assert [r.is_replay for r in comp.batch.rollouts] == [False] * 4
    assert comp.stale_by_band["25-50%"] == 1


def test_zero_signal_groups_are_dropped_and_counted_when_filtering():
    groups = [group(0), group(0, rewards=(1.0,) * 4), group(0, rewards=(0.0,) * 4), group(0)]
    kept = compose_batch(groups, seq=0, learner_version=0, rollouts_generated=0, tau_max=1, max_tokens=10**6,
                         drop_zero_signal=True)
    assert [r.problem_id for r in kept.batch.rollouts] == [groups[0].problem_id] * 4 + [groups[3].problem_id] * 4
    assert kept.zero_signal_dropped == 2 and kept.leftover == []
    unfiltered = compose_batch(groups, seq=0, learner_version=0, rollouts_generated=0, tau_max=1, max_tokens=10**6)
    assert len(unfiltered.batch.rollouts) == 16 and unfiltered.zero_signal_dropped == 0
    nothing = compose_batch(groups[1:3], seq=0, learner_version=0, rollouts_generated=0, tau_max=1, max_tokens=10**6,
                            drop_zero_signal=True)
    assert nothing.batch is None and nothing.zero_signal_dropped == 2


def test_advantages_are_frozen_scaled_by_the_groups_std():
    groups = [group(0, rewards=(1.0, 0.0, 0.0, 0.0))]
    scaled = compose_batch(groups, seq=0, learner_version=0, rollouts_generated=0, tau_max=1, max_tokens=10**6)
    assert [r.advantage for r in scaled.batch.rollouts] == pytest.approx([3 ** 0.5] + [-(3 ** -0.5)] * 3, abs=1e-5)


def test_token_budget_carries_groups_over():
    groups = [group(0, completion=10) for _ in range(4)]  # 4 x 4 x (2 + 10) = 48 tokens each group
    comp = compose_batch(groups, seq=0, learner_version=0, rollouts_generated=0, tau_max=1, max_tokens=100)
    assert len(comp.batch.rollouts) == 8 and comp.leftover == groups[2:]


def test_draws_follow_priority_to_the_alpha():
    """Chi-square over many single draws: frequencies match (|A| + eps)^alpha."""
    alpha = 0.5
    advantages = [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0, 2.5, 3.0]
    buffer = ReplayBuffer(capacity=len(advantages), alpha=alpha, seed=3)
    buffer.insert([rollout(a, rid=str(i)) for i, a in enumerate(advantages)], [0] * len(advantages))
    draws = 20_000
    counts = np.zeros(len(advantages))
    for _ in range(draws):
        (r,) = buffer.draw(1)
        counts[int(r.rollout_id)] += 1
    w = np.array([(abs(a) + 1e-6) ** alpha for a in advantages])
    expected = draws * w / w.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.88, chi2  # chi-square, 9 degrees of freedom, p = 0.001
    # ...and a wrong exponent is rejected by the same test
    w1 = np.array([abs(a) + 1e-6 for a in advantages])
    expected1 = draws * w1 / w1.sum()
    assert float(((counts - expected1) ** 2 / expected1).sum()) > 27.88


def test_draws_are_without_replacement_and_stay_in_buffer():
    buffer = ReplayBuffer(capacity=10, seed=0)
    buffer.insert([rollout(1.0, rid=str(i)) for i in range(10)], [0] * 10)
    first = buffer.draw(10)
    assert len({r.rollout_id for r in first}) == 10 and len(buffer) == 10
    assert all(r.is_replay for r in first)


def test_capacity_is_a_fifo_backstop():
    buffer = ReplayBuffer(capacity=5)
    buffer.insert([rollout(1.0, rid=f"a{i}") for i in range(5)], [1] * 5)
    buffer.insert([rollout(1.0, rid=f"b{i}") for i in range(3)], [2] * 3)
    assert len(buffer) == 5 and buffer.evicted_capacity[1] == 3
    assert {r.rollout_id for r in buffer.draw(5)} == {"a3", "a4", "b0", "b1", "b2"}
    assert math.isclose(buffer.metrics(0)["size"], 5)


def test_importance_weights_undo_the_draws_bias_toward_rare_outcomes():
    """A group of 8 with one success: draws proportional to |A|^0.5 favour the success, so the
    drawn advantages average well above 0; weighted by their sample weights at beta = 1 they
    average 0, as a uniform draw's would. Weights lie in (0, 1]; a zero-advantage rollout in
    the buffer does not shrink them."""
    from prl.formulas import group_advantages

    buffer = ReplayBuffer(capacity=100, seed=3)
    buffer.insert([rollout(a) for a in group_advantages([1.0] + [0.0] * 7)] + [rollout(0.0)], [0] * 9)
    drawn = [r for _ in range(20_000) for r in buffer.draw(1, beta=1.0)]
    raw = np.mean([r.advantage for r in drawn])
    weighted = np.mean([r.sample_weight * r.advantage for r in drawn]) / np.mean([r.sample_weight for r in drawn])
    assert raw > 0.3 and abs(weighted) < 0.05
    assert all(0 < r.sample_weight <= 1 for r in drawn) and max(r.sample_weight for r in drawn) == 1.0
    assert {r.sample_weight for r in buffer.draw(8, beta=0.0)} == {1.0}  # beta 0: no correction


def test_beta_anneals_from_beta0_to_1_at_the_horizon():
    from prl.formulas import annealed_beta

    assert [annealed_beta(0.4, v, 100) for v in (0, 50, 100, 500)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
