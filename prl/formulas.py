"""The papers' formulas, each defined once, as short pure functions named after their terms.

Problem priority (seed A, arXiv 2601.02648) and rollout replay (seed B, arXiv 2606.04560);
the GRPO objective, which needs torch, is in learner/grpo.py. Every service, command and
benchmark imports these; none restates them. Arguments may be numbers or numpy arrays.
"""

from __future__ import annotations

import numpy as np


def success_estimate(successes, attempts, prior_successes, prior_failures):
    """p = (s + a) / (n + a + b): a problem's success rate with a Beta(a, b) prior, from
    s successes in n attempts (both possibly decayed)."""
    return (successes + prior_successes) / (attempts + prior_successes + prior_failures)


def group_outcome(rewards, threshold: float) -> tuple[int, int, bool]:
    """(solved, attempts, signal) of a group: how many rewards reach ``threshold`` (a completion
    counts as solved), how many there are, and whether they differ (``has_signal``)."""
    return sum(r >= threshold for r in rewards), len(rewards), has_signal(rewards)


def forgetting(versions, half_life: float):
    """0.5^(versions / half_life): the weight left to results ``versions`` learner versions old."""
    return np.power(0.5, np.asarray(versions, dtype=np.float64) / half_life)


def bernoulli_variance(p):
    """p (1 - p): the variance of a {0, 1} reward with success rate p, which is also the
    mean squared group advantage E[(r - p)^2]; zero for always- and never-solved problems,
    largest at p = 1/2. Seed A's problem priority."""
    return p * (1 - p)


def gumbel_keys(log_weights, rng: np.random.Generator):
    """k_i = log w_i + G_i, G_i ~ Gumbel(0, 1). Taking the k largest keys samples k items
    without replacement with probability proportional to w (the Gumbel-top-k trick)."""
    log_weights = np.asarray(log_weights, dtype=np.float64)
    return log_weights + rng.gumbel(size=log_weights.shape)


def exponential_clock(now: float, rates, rng: np.random.Generator):
    """t = now + E / w, E ~ Exp(1): when a clock of rate w set at ``now`` rings. Among clocks
    running at any moment, the next to ring is clock i with probability w_i / sum(w), however
    long each has run (memorylessness): sampling in proportion to w, one pick at a time.
    A float ``rates`` gives a float (one clock, without the cost of an array)."""
    if isinstance(rates, float):
        return now + rng.exponential() / rates
    rates = np.asarray(rates, dtype=np.float64)
    return now + rng.exponential(size=rates.shape) / rates


def rollout_age(learner_version, rollout_version):
    """age = learner version - the policy version that generated the rollout; a rollout
    with age > tau_max is never trained on."""
    return learner_version - rollout_version


def group_advantages(rewards, eps: float = 1e-6) -> list[float]:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within one group (population std), GRPO's.
    Frozen when the group is accepted and never recomputed for replay."""
    r = np.asarray(rewards, dtype=np.float64)
    return ((r - r.mean()) / (r.std() + eps)).tolist()


def has_signal(rewards) -> bool:
    """Whether a group's rewards differ: a group whose rewards are all equal has zero
    advantage everywhere and no gradient (DAPO's zero-variance filter drops it)."""
    return max(rewards) != min(rewards)


def replay_log_priority(advantages, alpha: float, eps: float):
    """log p_i^alpha = alpha log(|A_i| + eps): seed B's replay draw probability is
    proportional to (|A_i| + eps)^alpha."""
    return alpha * np.log(np.abs(np.asarray(advantages, dtype=np.float64)) + eps)


def prioritized_replay_weight(log_priority, floor: float, beta: float):
    """w_i = min(1, (N P_i)^-beta / (N P_floor)^-beta), P_i proportional to exp(log_priority_i):
    prioritized replay's importance weight (arXiv 1511.05952), at beta = 1 the draw's bias
    undone; normalised by the weight of the least likely rollout that has a gradient
    (``floor``, its log-priority), so weights only scale down and the normaliser is the same
    for every rollout of a draw."""
    return np.minimum(1.0, np.exp(-beta * (np.asarray(log_priority, dtype=np.float64) - floor)))


def annealed_beta(beta0: float, version: int, horizon: int) -> float:
    """beta from beta0 at version 0 to 1 at ``horizon`` versions, linearly."""
    return beta0 + (1.0 - beta0) * min(1.0, version / max(1, horizon))
