"""Problem-level prioritized sampling (arXiv 2601.02648) with heap sampling and retest.

State lives in flat typed arrays indexed by a dense problem index (array.array, shared
with numpy views for vectorised metrics), not in one Python object per problem.

- Success estimate: p = (s + a) / (n + a + b), where s and n are (optionally decayed)
  successes and attempts and (a, b) is the prior: flat Beta(alpha, beta), or borrowed from
  the problem's group (difficulty, source, ...) as ``pseudo_count`` attempts at the
  group's pooled success rate.
- Priority: p (1 - p), the variance of a Bernoulli reward, the mean squared advantage.
- Max-heap with lazy invalidation: every (re)insertion bumps the problem's stamp; popped
  entries whose stamp is old are skipped. A problem in flight is out of the heap until
  its result returns. ``gumbel`` mode keys an entry by log priority + Gumbel noise drawn
  at insertion: popping the max samples in proportion to priority without replacement.
- Unseen problems of a group share one priority, so they are not in the heap one by one:
  each group keeps a shuffled order of its unseen problems and competes in the heap
  through one representative entry (gumbel key: log prio + log m + Gumbel, the max of its
  m members' keys), re-keyed when the group's pooled rate moves.
- Retest: a problem whose last ``retest_after`` groups were all solved (all failed) goes
  to the solved (unsolved) pool, out of the heap. Every ``retest_interval`` learner
  versions, ``retest_share`` of each pool, longest-untested first, is queued for
  dispatch; a changed result returns the problem to the heap. A pooled problem is
  therefore dispatched again within retest_interval * ceil(1 / retest_share) versions.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

import numpy as np

HEAP, IN_FLIGHT, SOLVED, UNSOLVED, QUEUED = 0, 1, 2, 3, 4
_GUMBEL_BLOCK = 1 << 16
_REKEY_TOLERANCE = 0.01  # re-key a group's unseen entry when its priority moves by 1%


def _typed(code: str, n: int, value=0) -> tuple[array, np.ndarray]:
    a = array(code, [value]) * n
    return a, np.frombuffer(a, dtype=np.dtype(code if code != "f" else "float32")) if n else np.zeros(0)


class PrioritySampler:
    ARRAYS = ("group", "successes", "attempts", "updated_at", "last_tested", "streak", "state", "stamp")
    CODES = {"group": "i", "successes": "f", "attempts": "f", "updated_at": "i", "last_tested": "i",
             "streak": "b", "state": "B", "stamp": "I"}

    def __init__(self, groups, cfg, seed: int = 0):
        """``groups[i]``: the prior group (e.g. difficulty) of problem i, small ints >= 0."""
        groups = np.asarray(groups, dtype=np.int32)
        self.cfg = cfg
        self.n = n = len(groups)
        self.rng = np.random.default_rng(seed)
        for name, code in self.CODES.items():
            a, view = _typed(code, n, -1 if name == "last_tested" else 0)
            setattr(self, name, a)
            setattr(self, f"_{name}_np", view)
        self._group_np[:] = groups
        self.num_groups = int(groups.max()) + 1 if n else 0
        self.group_successes = np.zeros(self.num_groups)
        self.group_attempts = np.zeros(self.num_groups)
        self.group_stamp = [0] * self.num_groups
        self.group_keyed_priority = [0.0] * self.num_groups
        self.unseen_order = [array("i", self.rng.permutation(np.flatnonzero(groups == g)).astype(np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = [0] * self.num_groups
        self.heap: list[tuple[float, int, int]] = []  # (-key, stamp, problem >= 0 | -(group+1))
        self.pools = {SOLVED: deque(), UNSOLVED: deque()}
        self.retest_queue: deque[int] = deque()
        self.version = 0
        self.last_retest_version = 0
        self.dispatched = 0
        self.retests_dispatched = 0
        self._gumbel: list[float] = []
        for g in range(self.num_groups):
            self._push_group(g)

    # -- estimates ------------------------------------------------------------------
    def group_rate(self, g: int) -> float:
        return (self.group_successes[g] + 1.0) / (self.group_attempts[g] + 2.0)

    def priority(self, i: int) -> float:
        return float(self.priorities(np.asarray([i]))[0])

    def unseen_priority(self, g: int) -> float:
        p = self.group_rate(g) if self.cfg.prior == "group" else self.cfg.alpha / (self.cfg.alpha + self.cfg.beta)
        return p * (1.0 - p)

    def _key(self, priority: float, multiplicity: int = 1) -> float:
        if self.cfg.mode == "greedy":
            return priority
        if not self._gumbel:
            self._gumbel = self.rng.gumbel(size=_GUMBEL_BLOCK).tolist()
        return math.log(priority if priority > 1e-12 else 1e-12) + math.log(multiplicity) + self._gumbel.pop()

    # -- the sampler interface ------------------------------------------------------
    def next(self, k: int, busy: set[int] | None = None) -> list[int]:
        """Up to k problems: due retests first, then the best of the heap. ``busy`` is not
        needed (the sampler tracks what is in flight) and kept for interface parity."""
        out: list[int] = []
        state = self.state
        queue = self.retest_queue
        while len(out) < k and queue:
            i = queue.popleft()
            if state[i] == QUEUED:
                state[i] = IN_FLIGHT
                self.retests_dispatched += 1
                out.append(i)
        heap, stamp, pop = self.heap, self.stamp, heapq.heappop
        while len(out) < k and heap:
            _, st, i = pop(heap)
            if i >= 0:
                if state[i] == HEAP and stamp[i] == st:
                    state[i] = IN_FLIGHT
                    out.append(i)
                continue
            g = -i - 1
            if st != self.group_stamp[g]:
                continue
            order, pos = self.unseen_order[g], self.unseen_pos[g]
            prio = self.group_keyed_priority[g]
            while pos < len(order) and len(out) < k:
                i = order[pos]
                pos += 1
                state[i] = IN_FLIGHT
                out.append(i)
                # The group's next key: while it still beats the heap's best, take its next unseen.
                if heap and pos < len(order) and self._key(prio, len(order) - pos) < -heap[0][0]:
                    break
            self.unseen_pos[g] = pos
            self._push_group(g)
        self.dispatched += len(out)
        return out

    def observe(self, i: int, rewards, version: int) -> None:
        """Record one returned group's rewards for problem i."""
        self.observe_many([i], [sum(1 for r in rewards if r > 0)], [len(rewards)], version)

    def observe_many(self, idx, solved, attempts, version: int) -> None:
        """Record returned groups (problem ``idx[j]``: ``solved[j]`` of ``attempts[j]``
        rewards positive), vectorised; then move each problem to the heap or a pool."""
        idx = np.asarray(idx, dtype=np.int64)
        solved = np.asarray(solved, dtype=np.float32)
        attempts = np.asarray(attempts, dtype=np.float32)
        if self.cfg.half_life_versions > 0:
            elapsed = np.maximum(version - self._updated_at_np[idx], 0)
            factor = 0.5 ** (elapsed / self.cfg.half_life_versions)
            self._successes_np[idx] *= factor
            self._attempts_np[idx] *= factor
            self._updated_at_np[idx] = np.maximum(self._updated_at_np[idx], version)
        np.add.at(self._successes_np, idx, solved)
        np.add.at(self._attempts_np, idx, attempts)
        groups = self._group_np[idx]
        self.group_successes += np.bincount(groups, solved, self.num_groups)
        self.group_attempts += np.bincount(groups, attempts, self.num_groups)
        self._last_tested_np[idx] = version
        streak = self._streak_np[idx].astype(np.int16)
        all_solved, all_failed = solved == attempts, solved == 0
        streak = np.where(all_solved, np.where(streak > 0, streak + 1, 1),
                          np.where(all_failed, np.where(streak < 0, streak - 1, -1), 0))
        self._streak_np[idx] = np.clip(streak, -100, 100)
        k = self.cfg.retest_after if self.cfg.retest else 1 << 30
        for pool, members in ((SOLVED, idx[streak >= k]), (UNSOLVED, idx[streak <= -k])):
            self._state_np[members] = pool
            self.pools[pool].extend(members.tolist())  # after its test: longest-untested first
        back = idx[(streak > -k) & (streak < k)]
        self._push_many(back)
        if self.cfg.prior == "group":
            for g in np.unique(groups).tolist():
                prio = self.unseen_priority(g)
                if abs(prio - self.group_keyed_priority[g]) > _REKEY_TOLERANCE * max(prio, 1e-9):
                    self._push_group(g)

    def release(self, i: int) -> None:
        """A dispatch abandoned without a result: the problem becomes choosable again."""
        if self.state[i] == IN_FLIGHT:
            self._to_heap(i)

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
            for _ in range(math.ceil(len(pool) * self.cfg.retest_share)):
                i = pool.popleft()
                self.state[i] = QUEUED
                self.retest_queue.append(i)
        self._compact()

    # -- internals ------------------------------------------------------------------
    def _decay(self, i: int, version: int) -> None:
        if version > self.updated_at[i]:
            f = 0.5 ** ((version - self.updated_at[i]) / self.cfg.half_life_versions)
            self.successes[i] *= f
            self.attempts[i] *= f
            self.updated_at[i] = version

    def _to_heap(self, i: int) -> None:
        self._push_many(np.asarray([i]))

    def _push_many(self, idx: np.ndarray) -> None:
        """(Re)insert problems into the heap with fresh stamps and keys."""
        if not len(idx):
            return
        self._state_np[idx] = HEAP
        stamps = self._stamp_np[idx] + np.uint32(1)
        self._stamp_np[idx] = stamps
        prio = self.priorities(idx)
        if self.cfg.mode == "greedy":
            keys = prio
        else:
            keys = np.log(np.maximum(prio, 1e-12)) + self.rng.gumbel(size=len(idx))
        push, heap = heapq.heappush, self.heap
        for entry in zip((-keys).tolist(), stamps.tolist(), idx.tolist()):
            push(heap, entry)

    def _push_group(self, g: int) -> None:
        self.group_stamp[g] += 1
        m = len(self.unseen_order[g]) - self.unseen_pos[g]
        prio = self.group_keyed_priority[g] = self.unseen_priority(g)
        if m <= 0:
            return
        heapq.heappush(self.heap, (-self._key(prio, m), self.group_stamp[g], -g - 1))

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber live ones (bounds memory)."""
        if len(self.heap) < 1024 or len(self.heap) < 2 * (self.n + self.num_groups) // 2:
            return
        state, stamp, gst = self.state, self.stamp, self.group_stamp
        self.heap = [e for e in self.heap if (e[2] >= 0 and state[e[2]] == HEAP and stamp[e[2]] == e[1])
                     or (e[2] < 0 and gst[-e[2] - 1] == e[1])]
        heapq.heapify(self.heap)

    # -- state and metrics ----------------------------------------------------------
    def pool_sizes(self) -> dict[str, int]:
        st = self._state_np
        unseen = sum(len(o) - p for o, p in zip(self.unseen_order, self.unseen_pos))
        return {
            "heap": int((st == HEAP).sum()) - unseen,
            "unseen": unseen,
            "in_flight": int((st == IN_FLIGHT).sum()),
            "solved_pool": int((st == SOLVED).sum()),
            "unsolved_pool": int((st == UNSOLVED).sum()),
            "retest_queued": int((st == QUEUED).sum()),
        }

    def metrics(self) -> dict:
        return {**self.pool_sizes(), "retest_share": self.retests_dispatched / max(1, self.dispatched)}

    def priorities(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Current priority p(1-p) of problems ``idx`` (default: all), vectorised."""
        sel = slice(None) if idx is None else idx
        if self.cfg.prior == "group":
            rates = ((self.group_successes + 1.0) / (self.group_attempts + 2.0))[self._group_np[sel]]
            a, b = self.cfg.pseudo_count * rates, self.cfg.pseudo_count * (1 - rates)
        else:
            a, b = self.cfg.alpha, self.cfg.beta
        p = (self._successes_np[sel] + a) / (self._attempts_np[sel] + a + b)
        return p * (1 - p)

    def success_rates(self) -> np.ndarray:
        """Observed success rate of every tested problem (NaN where untested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._attempts_np > 0, self._successes_np / self._attempts_np, np.nan)

    def state_dict(self) -> dict:
        """JSON-able state (lists and numbers only; no pickle)."""
        return {
            "arrays": {name: getattr(self, name).tolist() for name in self.ARRAYS},
            "groups": [self.group_successes.tolist(), self.group_attempts.tolist(), self.group_stamp,
                       self.group_keyed_priority],
            "unseen_order": [o.tolist() for o in self.unseen_order],
            "unseen_pos": list(self.unseen_pos),
            "heap": [list(e) for e in self.heap],
            "pools": {str(k): list(v) for k, v in self.pools.items()},
            "retest_queue": list(self.retest_queue),
            "rng": self.rng.bit_generator.state,
            "gumbel": list(self._gumbel),
            "counters": [self.version, self.last_retest_version, self.dispatched, self.retests_dispatched],
        }

    def load_state_dict(self, st: dict) -> None:
        for name in self.ARRAYS:
            getattr(self, f"_{name}_np")[:] = st["arrays"][name]
        successes, attempts, stamps, keyed = st["groups"]
        self.group_successes, self.group_attempts = np.array(successes), np.array(attempts)
        self.group_stamp, self.group_keyed_priority = list(stamps), list(keyed)
        self.unseen_order = [array("i", o) for o in st["unseen_order"]]
        self.unseen_pos = list(st["unseen_pos"])
        self.heap = [tuple(e) for e in st["heap"]]
        heapq.heapify(self.heap)
        self.pools = {int(k): deque(v) for k, v in st["pools"].items()}
        self.retest_queue = deque(st["retest_queue"])
        self.rng.bit_generator.state = st["rng"]
        self._gumbel = list(st["gumbel"])
        self.version, self.last_retest_version, self.dispatched, self.retests_dispatched = st["counters"]
