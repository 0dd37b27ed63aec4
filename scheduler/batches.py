"""Composing fresh-anchored TrainBatches (arXiv 2606.04560).

A batch is every fresh rollout first (accepted groups within tau_max, less the groups whose
rewards are all equal when the zero-variance filter is on, up to the token budget), then
``round(replay_ratio * |fresh|)`` rollouts drawn separately from the replay buffer, after
evicting whatever is older than tau_max, each with its importance weight at ``replay_beta``. No replay during the first
``warmup_updates`` learner versions. Fresh rollouts enter the buffer only after the draw,
so no rollout appears twice in one batch.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from prl.formulas import group_advantages, has_signal, rollout_age
from prl.scheduler.replay import BANDS, ReplayBuffer, success_band
from prl.schemas import RolloutGroup, TrainBatch, TrainRollout


def train_rollouts(group: RolloutGroup) -> list[TrainRollout]:
    """The group's rollouts with their frozen group-relative advantages."""
    advantages = group_advantages(group.rewards)
    return [
        TrainRollout(
            f"{group.dispatch_id}/{i}", group.problem_id, group.policy_version, False, a, r.reward,
            group.temperature, group.prompt_ids, r.completion_ids, r.logprobs, model_mask=r.model_mask,
        )
        for i, (r, a) in enumerate(zip(group.rollouts, advantages))
    ]


def group_tokens(group: RolloutGroup) -> int:
    return sum(len(group.prompt_ids) + len(r.completion_ids) for r in group.rollouts)


@dataclass
class Composition:
    batch: TrainBatch | None
    leftover: list[RolloutGroup]  # fresh groups that did not fit the token budget: next batch
    stale_by_band: dict[str, int] = field(default_factory=dict)
    replay_drawn: int = 0
    zero_signal_dropped: int = 0
    stale_completion_tokens: tuple[int, int] = (0, 0)  # (tokens, rollouts) of the fresh rollouts dropped as too old


def compose_batch(
    groups: list[RolloutGroup],
    *,
    seq: int,
    learner_version: int,
    rollouts_generated: int,
    tau_max: int,
    max_tokens: int,
    buffer: ReplayBuffer | None = None,
    replay_ratio: float = 0.0,
    replay_beta: float = 1.0,
    warmup_updates: int = 0,
    drop_zero_signal: bool = False,
) -> Composition:
    """A fresh-anchored batch: the fresh groups no older than ``tau_max`` at
    ``learner_version`` (the version that will train the batch) and, if any, a replayed
    share drawn from ``buffer`` after its stale rollouts are evicted."""
    fresh_groups, stale, zero_signal = sort_fresh(groups, learner_version, tau_max, drop_zero_signal)
    stale_rollouts = [r for g in groups if rollout_age(learner_version, g.policy_version) > tau_max and g.has_completions
                      for r in g.rollouts]
    stale_tokens = (sum(len(r.completion_ids) for r in stale_rollouts), len(stale_rollouts))
    kept, leftover, tokens = fit_token_budget(fresh_groups, max_tokens)
    fresh = [r for g in kept for r in train_rollouts(g)]
    replay: list[TrainRollout] = []
    if buffer is not None:
        buffer.evict_stale(learner_version, tau_max)
        if learner_version >= warmup_updates and fresh:
            replay = draw_replay(buffer, round(replay_ratio * len(fresh)), max_tokens - tokens, replay_beta)
        buffer.insert(fresh, [group_band(g) for g in kept for _ in g.rollouts])  # after the draw: never twice in one batch
    if not fresh:
        return Composition(None, leftover, stale, zero_signal_dropped=zero_signal, stale_completion_tokens=stale_tokens)
    batch = TrainBatch(uuid.uuid4().hex, seq, learner_version, rollouts_generated, fresh + replay, time.time())
    return Composition(batch, leftover, stale, len(replay), zero_signal, stale_tokens)


def group_band(group: RolloutGroup) -> int:
    return success_band(sum(group.rewards) / len(group.rewards))


def sort_fresh(groups: list[RolloutGroup], learner_version: int, tau_max: int, drop_zero_signal: bool):
    """(groups to train, stale groups per success band, zero-signal groups dropped)."""
    stale = {name: 0 for name in BANDS}
    fresh, zero_signal = [], 0
    for g in groups:
        if rollout_age(learner_version, g.policy_version) > tau_max:
            stale[BANDS[group_band(g)]] += 1
        elif drop_zero_signal and not has_signal(g.rewards):
            zero_signal += 1
        else:
            fresh.append(g)
    return fresh, stale, zero_signal


def fit_token_budget(groups: list[RolloutGroup], max_tokens: int) -> tuple[list, list, int]:
    """(groups that fit, in order; the rest, for the next batch; their tokens). The first
    group always fits, so a batch is never empty for a large group."""
    tokens = 0
    for i, g in enumerate(groups):
        t = group_tokens(g)
        if i and tokens + t > max_tokens:
            return groups[:i], groups[i:], tokens
        tokens += t
    return groups, [], tokens


def draw_replay(buffer: ReplayBuffer, k: int, token_room: int, beta: float) -> list[TrainRollout]:
    """Up to k replayed rollouts that fit in ``token_room`` tokens, weighted at ``beta``."""
    out = []
    for r in buffer.draw(k, beta):
        if r.num_tokens > token_room:
            break
        out.append(r)
        token_room -= r.num_tokens
    return out


def replay_advantage_means(replayed: list[TrainRollout]) -> dict[str, float]:
    """The replayed rollouts' mean advantage as drawn and as trained (weighted by their sample
    weights): the second is near 0 where the importance weights undo the draw's bias."""
    if not replayed:
        return {}
    weights = [r.sample_weight for r in replayed]
    return {"replay/drawn_advantage_mean": sum(r.advantage for r in replayed) / len(replayed),
            "replay/weighted_advantage_mean": sum(w * r.advantage for w, r in zip(weights, replayed)) / sum(weights)}
