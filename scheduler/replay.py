"""Rollout-level advantage-prioritized replay (arXiv 2606.04560).

A ring buffer of individual rollouts, each with its advantage and behaviour log-probs
frozen at insertion. Per-slot metadata lives in numpy arrays so every operation is
vectorised (no per-draw Python loop over the buffer):

- priority p_i = |A_i| + eps; a draw takes k rollouts without replacement with
  probability proportional to p_i^alpha (Gumbel top-k: keys alpha log p_i + Gumbel);
  drawn rollouts stay in the buffer; each drawn rollout carries prioritized replay's
  importance weight (N P_i)^-beta as its sample weight: without it, a replayed group's
  advantages no longer average zero (the draw favours a group's rare successes or failures,
  whose |A| is largest). Weights are normalised by the largest of a live rollout with a
  nonzero advantage (one of advantage 0 has no gradient, and would scale every weight down a
  thousandfold);
- ``evict_stale(version, tau_max)`` drops every rollout whose age (learner version minus
  rollout version) exceeds tau_max; the scheduler calls it before every draw;
- capacity is a FIFO backstop: inserting into a full buffer overwrites the oldest slot.

Every eviction is counted per band of the rollout's group success rate, so starvation of
slow, hard problems shows in the metrics.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from prl.formulas import gumbel_keys, prioritized_replay_weight, replay_log_priority, rollout_age
from prl.schemas import TrainRollout

BANDS = ("0-25%", "25-50%", "50-75%", "75-100%")
BETA0 = 0.4  # prioritized replay's importance exponent at version 0 (arXiv 1511.05952), 1 at learner.max_steps


def success_band(group_mean_reward: float) -> int:
    """Index into BANDS of a group's success rate."""
    return min(3, max(0, int(group_mean_reward * 4)))


class ReplayBuffer:
    def __init__(self, capacity: int = 30_000, alpha: float = 0.5, eps: float = 1e-6, seed: int = 0):
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.rng = np.random.default_rng(seed)
        self.items: list[TrainRollout | None] = [None] * capacity
        self.version = np.zeros(capacity, dtype=np.int64)
        self.log_priority = np.zeros(capacity, dtype=np.float64)  # alpha * log(|A| + eps)
        self.band = np.zeros(capacity, dtype=np.int8)
        self.alive = np.zeros(capacity, dtype=bool)
        self.head = 0
        self.evicted_stale = np.zeros(len(BANDS), dtype=np.int64)
        self.evicted_capacity = np.zeros(len(BANDS), dtype=np.int64)
        self.times_drawn = np.zeros(capacity, dtype=np.int32)
        self.evicted_never_drawn = 0
        self.tokens = np.zeros(capacity, dtype=np.int32)  # completion length of each slot
        self.evicted_tokens = 0  # completion tokens of the rollouts evicted by age (is it the long ones?)

    def __len__(self) -> int:
        return int(self.alive.sum())

    def insert(self, rollouts: list[TrainRollout], bands: list[int]) -> None:
        """Add rollouts (their advantages already frozen); full: overwrite the oldest."""
        n = len(rollouts)
        if n == 0:
            return
        slots = (self.head + np.arange(n)) % self.capacity
        overwritten = slots[self.alive[slots]]
        np.add.at(self.evicted_capacity, self.band[overwritten], 1)
        self.evicted_never_drawn += int((self.times_drawn[overwritten] == 0).sum())
        for slot, r in zip(slots.tolist(), rollouts):
            self.items[slot] = r
        self.version[slots] = [r.policy_version for r in rollouts]
        self.log_priority[slots] = replay_log_priority([r.advantage for r in rollouts], self.alpha, self.eps)
        self.band[slots] = bands
        self.tokens[slots] = [len(r.completion_ids) for r in rollouts]
        self.alive[slots] = True
        self.times_drawn[slots] = 0
        self.head = int((self.head + n) % self.capacity)

    def evict_stale(self, learner_version: int, tau_max: int) -> int:
        """Drop rollouts more than tau_max versions behind the learner; return how many."""
        stale = self.alive & (rollout_age(learner_version, self.version) > tau_max)
        count = int(stale.sum())
        if count:
            np.add.at(self.evicted_stale, self.band[stale], 1)
            self.evicted_never_drawn += int((self.times_drawn[stale] == 0).sum())
            self.evicted_tokens += int(self.tokens[stale].sum())
            self.alive[stale] = False
            self.items_clear(np.flatnonzero(stale))
        return count

    def items_clear(self, slots: np.ndarray) -> None:
        for s in slots.tolist():
            self.items[s] = None

    def draw(self, k: int, beta: float = 1.0) -> list[TrainRollout]:
        """Up to k distinct live rollouts, P proportional to priority^alpha, marked is_replay,
        each with its importance weight at ``beta`` as its sample weight."""
        live = np.flatnonzero(self.alive)
        k = min(k, len(live))
        if k <= 0:
            return []
        keys = gumbel_keys(self.log_priority[live], self.rng)
        top = live[np.argpartition(-keys, k - 1)[:k]] if k < len(live) else live
        self.times_drawn[top] += 1
        priorities = self.log_priority[live]
        with_gradient = priorities[priorities > self.alpha * np.log(2 * self.eps)]  # |A| > eps
        floor = with_gradient.min() if len(with_gradient) else 0.0
        weights = prioritized_replay_weight(self.log_priority[top], floor, beta).tolist()
        return [dataclasses.replace(self.items[s], is_replay=True, sample_weight=w) for s, w in zip(top.tolist(), weights)]

    def ages(self, learner_version: int) -> np.ndarray:
        return rollout_age(learner_version, self.version[self.alive])

    def state_dict(self) -> tuple[dict, list[TrainRollout]]:
        """(arrays and counters, live rollouts oldest first) for a snapshot."""
        order = (self.head + np.arange(self.capacity)) % self.capacity
        live = order[self.alive[order]]
        arrays = {"band": self.band[live].copy(), "times_drawn": self.times_drawn[live].copy(),
                  "evicted_stale": self.evicted_stale.copy(), "evicted_capacity": self.evicted_capacity.copy()}
        return {"arrays": arrays, "evicted_never_drawn": self.evicted_never_drawn, "evicted_tokens": self.evicted_tokens,
                "rng": self.rng.bit_generator.state}, [self.items[s] for s in live.tolist()]

    def load_state_dict(self, state: dict, rollouts: list[TrainRollout]) -> None:
        arrays = state["arrays"]
        self.alive[:] = False
        self.head = 0
        self.insert(rollouts, list(np.asarray(arrays["band"])))
        self.times_drawn[: len(rollouts)] = np.asarray(arrays["times_drawn"])
        self.evicted_stale[:] = arrays["evicted_stale"]
        self.evicted_capacity[:] = arrays["evicted_capacity"]
        self.evicted_never_drawn = state["evicted_never_drawn"]
        self.evicted_tokens = state.get("evicted_tokens", 0)
        self.rng.bit_generator.state = state["rng"]

    def metrics(self, learner_version: int) -> dict:
        ages = self.ages(learner_version)
        stale = int(self.evicted_stale.sum())
        out = {"size": len(ages), "age_mean": float(ages.mean()) if len(ages) else 0.0,
               "evicted_never_drawn": self.evicted_never_drawn,
               "evicted_completion_tokens_mean": self.evicted_tokens / stale if stale else 0.0}
        for i, name in enumerate(BANDS):
            out[f"evicted_stale/{name}"] = int(self.evicted_stale[i])
            out[f"evicted_capacity/{name}"] = int(self.evicted_capacity[i])
        return out
