"""Problem samplers: which problem to generate for next.

``scheduler.strategy`` names one: ``uniform``, ``dapo_filter``, ``priority``
(scheduler/priority.py), or ``module:Factory`` for your own. ``Factory(groups, cfg)`` gets each
problem's prior group (an int array, all 0 without ``task.group_field``) and the run's
Config, and returns an object with this interface (the scheduler calls nothing else):

- ``next(k, busy) -> list[int]``: up to k problem indices to dispatch, none in ``busy`` (the
  problems in flight) and none retired;
- ``observe_many(idx, solved, attempts, version, signal)``: returned groups' outcomes (problem
  ``idx[j]`` solved ``solved[j]`` of ``attempts[j]`` completions at learner ``version``, a
  completion solved when its reward reaches ``task.success_threshold``; ``signal[j]``: whether
  the group's rewards differ);
- ``on_version(version)``: the learner's version moved;
- ``retire(i)``: never choose problem i again (no producer can serve it); ``release(i)``: a
  dispatch of i was abandoned;
- ``state_dict() -> dict`` of numpy arrays and JSON-able values, ``load_state_dict(state)``,
  and ``check_state(state)`` raising ValueError for a state that does not fit (the scheduler
  then resumes from the snapshot before);
- ``metrics() -> dict`` of numbers, ``success_rates()`` (NaN where untried) and
  ``priorities()`` per problem, for the logs and plots;
- class attributes ``zero_variance_filter`` (a group whose rewards are all equal is observed,
  not trained) and ``dynamic_sampling`` (generate until a batch is full of groups with a
  signal), both False when absent.
"""

from __future__ import annotations

import numpy as np

from prl.formulas import bernoulli_variance, success_estimate


class UniformSampler:
    """``uniform``: every problem equally often, in shuffled passes over the pool (a data
    loader's epochs); a problem in flight when its turn comes waits for the next pass."""

    zero_variance_filter = False
    dynamic_sampling = False

    def __init__(self, num_problems: int, seed: int = 0):
        self.n = num_problems
        self.rng = np.random.default_rng(seed)
        self.attempts = np.zeros(num_problems, dtype=np.int32)
        self.successes = np.zeros(num_problems, dtype=np.float32)
        self.retired: set[int] = set()
        self.order = np.zeros(0, dtype=np.int64)  # the current pass
        self.pos = 0

    def next(self, k: int, busy: set[int]) -> list[int]:
        out: list[int] = []
        unavailable = len(busy | self.retired)  # fixed while drawing
        while len(out) < k and unavailable + len(out) < self.n:
            if self.pos >= len(self.order):
                self.order, self.pos = self.rng.permutation(self.n), 0
            i = int(self.order[self.pos])
            self.pos += 1
            if i not in busy and i not in out and i not in self.retired:
                out.append(i)
        return out

    def observe_many(self, idx, solved, attempts, version: int, signal=None) -> None:
        np.add.at(self.attempts, np.asarray(idx), np.asarray(attempts, dtype=np.int32))
        np.add.at(self.successes, np.asarray(idx), np.asarray(solved, dtype=np.float32))

    def on_version(self, version: int) -> None:
        pass

    def retire(self, idx: int) -> None:
        self.retired.add(idx)

    def release(self, idx: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"sampler": "uniform", "rng": self.rng.bit_generator.state, "attempts": self.attempts.copy(),
                "successes": self.successes.copy(), "pass_order": self.order.copy(), "pass_position": self.pos}

    def check_state(self, state: dict) -> None:
        from prl.scheduler.snapshot import expect_inside, expect_sized, expect_state

        expect_state(state, "uniform", f"{self.n:,} problems", state.get("sampler") == "uniform" and len(state["attempts"]) == self.n)
        expect_sized({"successes": (state["successes"], self.n)})
        expect_inside({"pass_order": (state["pass_order"], 0, self.n),
                       "pass_position": ([state["pass_position"]], 0, len(state["pass_order"]) + 1)})

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.rng.bit_generator.state = state["rng"]
        self.attempts[:] = state["attempts"]
        self.successes[:] = state["successes"]
        self.order = np.asarray(state["pass_order"], dtype=np.int64)
        self.pos = int(state["pass_position"])

    def metrics(self) -> dict:
        return {"problems_seen": int((self.attempts > 0).sum()), "retired": len(self.retired)}

    def priorities(self):
        return bernoulli_variance(success_estimate(self.successes, self.attempts, 1.0, 1.0))

    def success_rates(self):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.attempts > 0, self.successes / np.maximum(self.attempts, 1), np.nan)


class DapoFilterSampler(UniformSampler):
    """``dapo_filter``: uniform choice with DAPO's dynamic sampling: a group whose rewards are
    all equal is not trained, and generation goes on until a batch is full of groups with a
    signal (arXiv 2503.14476)."""

    zero_variance_filter = True
    dynamic_sampling = True


def make_sampler(cfg, groups):
    """The sampler ``cfg.scheduler.strategy`` names; ``groups[i]`` is problem i's prior group."""
    strategy, seed = cfg.scheduler.strategy, cfg.run.seed
    if strategy == "uniform":
        return UniformSampler(len(groups), seed)
    if strategy == "dapo_filter":
        return DapoFilterSampler(len(groups), seed)
    if strategy == "priority":
        from prl.scheduler.priority import PrioritySampler

        p = cfg.scheduler.priority
        return PrioritySampler(groups, p.pseudo_count, p.retest_interval, seed, cfg.sampling.group_size)
    from prl.plugins import load

    return load(strategy, "scheduler.strategy", called_with=("groups", "config"))(np.asarray(groups), cfg)
