"""Problem samplers: which problem to generate for next.

Every sampler has the same small interface: ``next(k, busy)`` picks up to k problem
indices not in ``busy`` (the problems in flight), ``observe`` records a returned
group's rewards, and ``state_dict`` / ``load_state_dict`` / ``metrics``.
"""

from __future__ import annotations

import numpy as np

from prl.formulas import bernoulli_variance, success_estimate
from prl.scheduler.snapshot import expect_state


class UniformSampler:
    """Every problem not in flight is equally likely: drawn independently (with replacement), or
    with ``passes`` in shuffled passes over the pool, each problem once per pass, as a data
    loader's epochs (one in flight when its turn comes is passed over until the next pass).
    With ``drop_unsolved`` a problem never solved in its first ``group_size`` completions (a
    whole group; screens count as their completions) is not drawn again: a dead-problem filter
    without a label (one solved completion, ever, keeps a problem in; when every problem not
    retired is dropped, the drops are forgiven and the pool starts over)."""

    def __init__(self, num_problems: int, seed: int = 0, passes: bool = False, drop_unsolved: bool = False,
                 group_size: int = 8):
        self.n = num_problems
        self.passes = passes
        self.drop_unsolved = drop_unsolved
        self.group_size = group_size
        self.dropped: set[int] = set()  # problems never solved after a whole group (drop_unsolved)
        self.rng = np.random.default_rng(seed)
        self.attempts = np.zeros(num_problems, dtype=np.int32)
        self.successes = np.zeros(num_problems, dtype=np.float32)
        self.retired: set[int] = set()
        self.order = np.zeros(0, dtype=np.int64)  # the current pass (passes only)
        self.pos = 0

    def next(self, k: int, busy: set[int]) -> list[int]:
        if self.dropped and len(self.dropped | self.retired) >= self.n:
            self.dropped.clear()  # nothing left to draw: every dropped problem gets another look
        out: list[int] = []
        unavailable = len(busy - self.dropped) + len(self.retired | self.dropped)  # fixed while drawing
        while len(out) < k and unavailable + len(out) < self.n:
            i = self._next_in_pass() if self.passes else int(self.rng.integers(self.n))
            if i not in busy and i not in out and i not in self.retired and i not in self.dropped:
                out.append(i)
        return out

    def _next_in_pass(self) -> int:
        if self.pos >= len(self.order):
            self.order, self.pos = self.rng.permutation(self.n), 0
        self.pos += 1
        return int(self.order[self.pos - 1])

    def observe(self, idx: int, rewards: list[float], version: int) -> None:
        self.observe_many([idx], [sum(r > 0 for r in rewards)], [len(rewards)], version)

    def observe_many(self, idx, solved, attempts, version: int) -> None:
        np.add.at(self.attempts, np.asarray(idx), np.asarray(attempts, dtype=np.int32))
        np.add.at(self.successes, np.asarray(idx), np.asarray(solved, dtype=np.float32))
        if self.drop_unsolved:
            self.dropped.update(int(i) for i in idx if self.successes[i] == 0 and self.attempts[i] >= self.group_size)

    def on_version(self, version: int) -> None:
        pass

    def retire(self, idx: int) -> None:
        """Never choose this problem again (it cannot be served)."""
        self.retired.add(idx)

    def release(self, idx: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"sampler": "uniform", "rng": self.rng.bit_generator.state, "attempts": self.attempts.copy(),
                "successes": self.successes.copy(), "pass_order": self.order.copy(), "pass_position": self.pos,
                "dropped": sorted(self.dropped)}

    def load_state_dict(self, state: dict) -> None:
        expect_state(state, "uniform", self.n)
        self.rng.bit_generator.state = state["rng"]
        self.attempts[:] = state["attempts"]
        self.successes[:] = state["successes"]
        self.order = np.asarray(state.get("pass_order", []), dtype=np.int64)  # older snapshots: a new pass
        self.pos = int(state.get("pass_position", 0))
        self.dropped = {int(i) for i in state.get("dropped", [])}  # older snapshots: none dropped

    def metrics(self) -> dict:
        seen = self.attempts > 0
        return {"problems_seen": int(seen.sum()), "retest_share": 0.0, "problems_dropped": len(self.dropped),
                "never_dispatched_share": float((~seen).sum() - len(self.retired)) / max(1, self.n)}

    def priorities(self):
        return bernoulli_variance(success_estimate(self.successes, self.attempts, 1.0, 1.0))

    def success_rates(self):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.attempts > 0, self.successes / np.maximum(self.attempts, 1), np.nan)


def make_sampler(cfg, groups, seed: int, group_start=None, group_size: int = 8):
    """The sampler of a scheduler config; ``groups[i]`` is problem i's prior group,
    ``group_start[g]`` group g's starting rate (default 1/2), ``group_size`` the completions
    of a whole group (sampling.group_size)."""
    if cfg.strategy in ("uniform", "dapo_filter"):
        return UniformSampler(len(groups), seed, cfg.uniform_passes, cfg.uniform_drop_unsolved, group_size)
    if cfg.strategy == "success_variance":
        from prl.scheduler.priority import PrioritySampler

        return PrioritySampler(np.asarray(groups), cfg.priority, seed, group_start, group_size)
    raise ValueError(f"unknown scheduler.strategy {cfg.strategy!r}")
