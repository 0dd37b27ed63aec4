"""Composing a TrainBatch from accepted rollout groups (fresh rollouts only, for now)."""

from __future__ import annotations

import time
import uuid

from scheduler.advantages import group_advantages
from schemas import RolloutGroup, TrainBatch, TrainRollout


def age(learner_version: int, rollout_version: int) -> int:
    return learner_version - rollout_version


def train_rollouts(group: RolloutGroup) -> list[TrainRollout]:
    """The group's rollouts with their frozen group-relative advantages."""
    advantages = group_advantages(group.rewards)
    return [
        TrainRollout(
            f"{group.dispatch_id}/{i}", group.problem_id, group.policy_version, False, a, r.reward,
            group.temperature, group.prompt_ids, r.completion_ids, r.logprobs,
        )
        for i, (r, a) in enumerate(zip(group.rollouts, advantages))
    ]


def compose_batch(groups: list[RolloutGroup], seq: int, learner_version: int, tau_max: int, rollouts_generated: int):
    """(batch or None, groups dropped as stale): every rollout of every group within tau_max."""
    fresh = [g for g in groups if age(learner_version, g.policy_version) <= tau_max]
    rollouts = [r for g in fresh for r in train_rollouts(g)]
    if not rollouts:
        return None, len(groups) - len(fresh)
    batch = TrainBatch(uuid.uuid4().hex, seq, learner_version, rollouts_generated, rollouts, time.time())
    return batch, len(groups) - len(fresh)
