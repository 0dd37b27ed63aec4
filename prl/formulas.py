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


def bernoulli_variance(p):
    """p (1 - p): the variance of a {0, 1} reward with success rate p, which is also the
    mean squared group advantage E[(r - p)^2]; zero for always- and never-solved problems,
    largest at p = 1/2. Seed A's problem priority."""
    return p * (1 - p)


def signal_probability(p, group_size: int):
    """1 - p^G - (1 - p)^G: the chance that a group of G completions at success rate p is
    neither all solved nor all failed, so its advantages are not all zero and it trains
    (the share of groups DAPO's filter keeps). Near 1 over most of (0, 1) for G = 8 and zero
    only at the ends: unlike p(1-p), it does not favour p = 1/2 over p = 0.8."""
    return 1 - p**group_size - (1 - p) ** group_size


def pass_at_k(p, k: int):
    """1 - (1 - p)^k: the chance that at least one of k completions at success rate p solves
    the problem (pass@k). For k = 8 about 1 from p = 0.3 up to 1 and falling to 0 only as p does:
    a weight that sets aside the problems never solved and treats every other one alike."""
    return 1 - (1 - p) ** k


def decay_factor(elapsed_versions, half_life_versions: float):
    """0.5 ^ (elapsed / half_life): the weight left on an outcome ``elapsed`` versions old."""
    return 0.5 ** (np.asarray(elapsed_versions) / half_life_versions)


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


def periodic_clock(now: float, rates, rng: np.random.Generator):
    """t = now + (1/2 + U) / w, U ~ Uniform(0, 1): a clock of period 1/w that rings between half
    a period and one and a half after it is set, one period on average. A problem re-armed after
    each ring is picked in proportion to w, as with ``exponential_clock``, but at evenly spaced
    times (not exponential gaps): with equal rates every problem about once per pass, as in a
    data loader's shuffled epochs. A float ``rates`` gives a float."""
    if isinstance(rates, float):
        return now + (0.5 + rng.random()) / rates
    rates = np.asarray(rates, dtype=np.float64)
    return now + (0.5 + rng.random(size=rates.shape)) / rates


def first_pass_clock(now: float, deadline: float, m: int, rng: np.random.Generator) -> float:
    """t = now + (D - now)(1 - U^(1/m)), U ~ Uniform(0, 1): the first ring of m clocks that each
    ring once at a uniform time in [now, D) (the smallest of m uniforms): when the next of m
    never-tried problems is due if each is to be tried once before the pass ends at D. Drawn
    again after each ring with one fewer, it gives every one of them a ring by D, in random
    order, as a data loader's first epoch does."""
    return now + max(deadline - now, 0.0) * (1.0 - rng.random() ** (1.0 / m))


def rollout_age(learner_version, rollout_version):
    """age = learner version - the policy version that generated the rollout; a rollout
    with age > tau_max is never trained on."""
    return learner_version - rollout_version


def group_advantages(rewards, eps: float = 1e-6, scale_by_std: bool = True) -> list[float]:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within one group (population std), GRPO's; without
    ``scale_by_std`` A_i = r_i - mean(r), Dr. GRPO's (arXiv 2503.20783), under which a {0, 1}
    group's update grows with its reward spread instead of every group with a signal weighing
    alike. Frozen when the group is accepted and never recomputed for replay."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean()
    return (centred / (r.std() + eps) if scale_by_std else centred).tolist()


def has_signal(rewards) -> bool:
    """Whether a group's rewards differ: a group whose rewards are all equal has zero
    advantage everywhere and no gradient (DAPO's zero-variance filter drops it)."""
    return max(rewards) != min(rewards)


def replay_log_priority(advantages, alpha: float, eps: float):
    """log p_i^alpha = alpha log(|A_i| + eps): seed B's replay draw probability is
    proportional to (|A_i| + eps)^alpha."""
    return alpha * np.log(np.abs(np.asarray(advantages, dtype=np.float64)) + eps)
