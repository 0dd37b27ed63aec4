"""Problem-level prioritized sampling (arXiv 2601.02648) with heap sampling and retest.

State lives in flat numpy arrays indexed by a dense problem index (about 30 bytes per
problem), not in one Python object per problem.

- Success estimate: p = (s + a) / (n + a + b), where s and n are (optionally decayed)
  successes and attempts and (a, b) is the prior: flat Beta(alpha, beta), or borrowed from
  the problem's group (difficulty, source, ...) as ``pseudo_count`` attempts at the
  group's pooled success rate.
- Priority: p (1 - p), the variance of a Bernoulli reward, the mean squared advantage.
- Max-heap with lazy invalidation: every (re)insertion bumps the problem's entry stamp,
  entries whose stamp is old are skipped when popped. A problem in flight is out of the
  heap until its result returns. ``gumbel`` mode keys entries by log priority + Gumbel
  noise drawn at insertion: popping the max then samples in proportion to priority,
  without replacement.
- Unseen problems of a group share one priority, so they are not in the heap one by one:
  each group keeps a shuffled queue of its unseen problems and competes in the heap
  through one representative entry (its key in gumbel mode is the max of m Gumbel-
  perturbed keys, log prio + log m + Gumbel).
- Retest: a problem whose last ``retest_after`` groups were all solved (all failed) goes
  to the solved (unsolved) pool, out of the heap. Every ``retest_interval`` learner
  versions, ``retest_share`` of each pool, longest-untested first, is queued for
  dispatch; a changed result returns the problem to the heap.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

HEAP, IN_FLIGHT, SOLVED, UNSOLVED, QUEUED = 0, 1, 2, 3, 4


class PrioritySampler:
    def __init__(self, groups: np.ndarray, cfg, seed: int = 0):
        """``groups[i]``: the prior group (e.g. difficulty) of problem i, small ints."""
        n = len(groups)
        self.cfg = cfg
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.group = np.asarray(groups, dtype=np.int32)
        self.num_groups = int(self.group.max()) + 1 if n else 0
        self.successes = np.zeros(n, dtype=np.float32)
        self.attempts = np.zeros(n, dtype=np.float32)
        self.updated_at = np.zeros(n, dtype=np.int32)  # version of the last decay update
        self.last_tested = np.full(n, -1, dtype=np.int32)
        self.streak = np.zeros(n, dtype=np.int8)  # +k: last k groups all solved, -k: all failed
        self.state = np.full(n, HEAP, dtype=np.uint8)
        self.stamp = np.zeros(n, dtype=np.uint32)
        self.group_successes = np.zeros(self.num_groups, dtype=np.float64)
        self.group_attempts = np.zeros(self.num_groups, dtype=np.float64)
        self.unseen = [deque(self.rng.permutation(np.flatnonzero(self.group == g)).tolist()) for g in range(self.num_groups)]
        self.heap: list[tuple[float, int, int]] = []  # (-key, stamp, problem)
        self.pools = {SOLVED: deque(), UNSOLVED: deque()}
        self.retest_queue: deque[int] = deque()
        self.version = 0
        self.last_retest_version = 0
        self.dispatched = 0
        self.retests_dispatched = 0

    # -- estimates ------------------------------------------------------------------
    def group_rate(self, g: int) -> float:
        return (self.group_successes[g] + 1.0) / (self.group_attempts[g] + 2.0)

    def prior(self, i: int) -> tuple[float, float]:
        if self.cfg.prior == "group":
            rate = self.group_rate(int(self.group[i]))
            return self.cfg.pseudo_count * rate, self.cfg.pseudo_count * (1.0 - rate)
        return self.cfg.alpha, self.cfg.beta

    def success_rate(self, i: int) -> float:
        a, b = self.prior(i)
        return (float(self.successes[i]) + a) / (float(self.attempts[i]) + a + b)

    def priority(self, i: int) -> float:
        p = self.success_rate(i)
        return p * (1.0 - p)

    def unseen_priority(self, g: int) -> float:
        if self.cfg.prior == "group":
            p = self.group_rate(g)
        else:
            p = self.cfg.alpha / (self.cfg.alpha + self.cfg.beta)
        return p * (1.0 - p)

    def key(self, priority: float, multiplicity: int = 1) -> float:
        if self.cfg.mode == "greedy":
            return priority
        return math.log(max(priority, 1e-12)) + math.log(multiplicity) + float(self.rng.gumbel())

    # -- the sampler interface ------------------------------------------------------
    def next(self, k: int, busy: set[int] | None = None) -> list[int]:
        """Up to k problems: due retests first, then the heap's best (seen or unseen)."""
        out: list[int] = []
        while len(out) < k and self.retest_queue:
            i = self.retest_queue.popleft()
            if self.state[i] == QUEUED:
                self.state[i] = IN_FLIGHT
                self.retests_dispatched += 1
                out.append(i)
        while len(out) < k:
            i = self._pop_best()
            if i is None:
                break
            self.state[i] = IN_FLIGHT
            out.append(i)
        self.dispatched += len(out)
        return out

    def _pop_best(self) -> int | None:
        while True:
            unseen_key, g = self._best_unseen()
            while self.heap and (self.heap[0][1] != self.stamp[self.heap[0][2]] or self.state[self.heap[0][2]] != HEAP):
                heapq.heappop(self.heap)  # stale entry: lazy invalidation
            if not self.heap and g is None:
                return None
            if g is not None and (not self.heap or unseen_key >= -self.heap[0][0]):
                return self.unseen[g].popleft()
            return heapq.heappop(self.heap)[2]

    def _best_unseen(self) -> tuple[float, int | None]:
        best, best_g = -math.inf, None
        for g in range(self.num_groups):
            m = len(self.unseen[g])
            if m:
                key = self.key(self.unseen_priority(g), m)
                if key > best:
                    best, best_g = key, g
        return best, best_g

    def observe(self, i: int, rewards, version: int) -> None:
        """Record a returned group's rewards for problem i; move it to the heap or a pool."""
        solved = float(sum(1 for r in rewards if r > 0))
        n = float(len(rewards))
        self._decay(i, version)
        self.successes[i] += solved
        self.attempts[i] += n
        g = int(self.group[i])
        self.group_successes[g] += solved
        self.group_attempts[g] += n
        self.last_tested[i] = version
        all_solved, all_failed = solved == n, solved == 0
        s = int(self.streak[i])
        self.streak[i] = max(1, s + 1) if all_solved and s >= 0 else min(-1, s - 1) if all_failed and s <= 0 else (
            1 if all_solved else -1 if all_failed else 0)
        self.streak[i] = max(-100, min(100, int(self.streak[i])))
        k = self.cfg.retest_after
        if self.cfg.retest and self.streak[i] >= k:
            self._to_pool(i, SOLVED)
        elif self.cfg.retest and self.streak[i] <= -k:
            self._to_pool(i, UNSOLVED)
        else:
            self._to_heap(i)

    def release(self, i: int) -> None:
        """A dispatch abandoned without a result: the problem becomes choosable again."""
        if self.state[i] == IN_FLIGHT:
            if self.attempts[i] == 0 and self.last_tested[i] < 0:
                self.unseen[int(self.group[i])].append(i)
                self.state[i] = HEAP
            else:
                self._to_heap(i)

    def _decay(self, i: int, version: int) -> None:
        hl = self.cfg.half_life_versions
        if hl > 0 and version > self.updated_at[i]:
            f = 0.5 ** ((version - int(self.updated_at[i])) / hl)
            self.successes[i] *= f
            self.attempts[i] *= f
        self.updated_at[i] = max(int(self.updated_at[i]), version)

    def _to_heap(self, i: int) -> None:
        self.state[i] = HEAP
        self.stamp[i] += 1
        heapq.heappush(self.heap, (-self.key(self.priority(i)), int(self.stamp[i]), i))

    def _to_pool(self, i: int, pool: int) -> None:
        self.state[i] = pool
        self.pools[pool].append(i)  # appended after its test: pools stay longest-untested first

    def on_version(self, version: int) -> None:
        """The learner's version moved: queue retests when a retest interval has passed."""
        self.version = max(self.version, version)
        if not self.cfg.retest or self.version - self.last_retest_version < self.cfg.retest_interval:
            return
        self.last_retest_version = self.version
        for pool_id, pool in self.pools.items():
            live = [i for i in pool if self.state[i] == pool_id]
            pool.clear()
            pool.extend(live)
            take = math.ceil(len(pool) * self.cfg.retest_share)
            for _ in range(take):
                i = pool.popleft()
                self.state[i] = QUEUED
                self.retest_queue.append(i)

    # -- state and metrics ----------------------------------------------------------
    def pool_sizes(self) -> dict[str, int]:
        return {
            "heap": int((self.state == HEAP).sum()),
            "in_flight": int((self.state == IN_FLIGHT).sum()),
            "solved_pool": int((self.state == SOLVED).sum()),
            "unsolved_pool": int((self.state == UNSOLVED).sum()),
            "retest_queued": int((self.state == QUEUED).sum()),
            "unseen": sum(len(u) for u in self.unseen),
        }

    def metrics(self) -> dict:
        return {**self.pool_sizes(), "retest_share": self.retests_dispatched / max(1, self.dispatched)}

    def priorities(self) -> np.ndarray:
        """Current priority of every problem (for histograms)."""
        a, b = zip(*(self.prior(i) for i in range(self.n))) if self.cfg.prior == "group" else ([self.cfg.alpha], [self.cfg.beta])
        a, b = np.asarray(a), np.asarray(b)
        p = (self.successes + a) / (self.attempts + a + b)
        return p * (1 - p)

    ARRAYS = ("group", "successes", "attempts", "updated_at", "last_tested", "streak", "state", "stamp")

    def state_dict(self) -> dict:
        return {
            "arrays": {name: getattr(self, name) for name in self.ARRAYS},
            "group_successes": self.group_successes.tolist(),
            "group_attempts": self.group_attempts.tolist(),
            "unseen": [list(u) for u in self.unseen],
            "heap": list(self.heap),
            "pools": {str(k): list(v) for k, v in self.pools.items()},
            "retest_queue": list(self.retest_queue),
            "rng": self.rng.bit_generator.state,
            "counters": [self.version, self.last_retest_version, self.dispatched, self.retests_dispatched],
        }

    def load_state_dict(self, st: dict) -> None:
        for name in self.ARRAYS:
            getattr(self, name)[:] = st["arrays"][name]
        self.group_successes[:] = st["group_successes"]
        self.group_attempts[:] = st["group_attempts"]
        self.unseen = [deque(u) for u in st["unseen"]]
        self.heap = [tuple(e) for e in st["heap"]]
        heapq.heapify(self.heap)
        self.pools = {int(k): deque(v) for k, v in st["pools"].items()}
        self.retest_queue = deque(st["retest_queue"])
        self.rng.bit_generator.state = st["rng"]
        self.version, self.last_retest_version, self.dispatched, self.retests_dispatched = st["counters"]
