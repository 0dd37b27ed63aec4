"""Small synthetic rollout groups for tests of the archive, inspection and offline batches."""

import random

from prl.schemas import Rollout, RolloutGroup


def make_groups(n: int, seed: int = 0) -> list[RolloutGroup]:
    """``n`` groups of 4 three-token rollouts, rewards 0 or 1 at random, over problems of all
    three digit counts, policy version rising by one every 10 groups."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        rewards = [float(rng.random() < 0.5) for _ in range(4)]
        rollouts = [Rollout([rng.randrange(3, 16) for _ in range(3)], [-0.5, -0.7, -0.2], r, "stop", "12") for r in rewards]
        out.append(RolloutGroup(f"d{i:04d}", f"add{1 + i % 3}:{i % 10}+{i % 7}", i // 10, f"producer-{i % 2}",
                                [5, 6, 7], 1.0, rollouts, created_at=1000.0 + i))
    return out
