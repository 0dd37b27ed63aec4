"""Group-relative advantages, computed once when a group is accepted and then frozen."""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """A_i = (r_i - mean(r)) / (std(r) + eps), population std over the group."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def has_signal(rewards: list[float]) -> bool:
    """False when every reward is equal: the group has zero advantage everywhere."""
    return max(rewards) != min(rewards)
