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
  each group keeps a shuffled order of its unseen problems; each ``next`` draws the
  group's best keys from the order statistics of its m members' keys and merges them
  with the heap's (in gumbel mode these are drawn afresh per call, heap keys at insertion).
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

from prl.formulas import bernoulli_variance, decay_factor, gumbel_keys, success_estimate, top_gumbel_keys_of_equals

HEAP, IN_FLIGHT, SOLVED, UNSOLVED, QUEUED, RETIRED = 0, 1, 2, 3, 4, 5


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
        self.unseen_order = [array("i", self.rng.permutation(np.flatnonzero(groups == g)).astype(np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = [0] * self.num_groups
        self.heap: list[tuple[float, int, int]] = []  # (-key, stamp, problem), seen problems only
        self.pools = {SOLVED: deque(), UNSOLVED: deque()}
        self.retest_queue: deque[int] = deque()
        self.version = 0
        self.last_retest_version = 0
        self.dispatched = 0
        self.retests_dispatched = 0

    # -- estimates ------------------------------------------------------------------
    def group_rate(self, g: int) -> float:
        return success_estimate(self.group_successes[g], self.group_attempts[g], 1.0, 1.0)

    def priority(self, i: int) -> float:
        return float(self.priorities(np.asarray([i]))[0])

    def unseen_priority(self, g: int) -> float:
        p = self.group_rate(g) if self.cfg.prior == "group" else success_estimate(0, 0, self.cfg.alpha, self.cfg.beta)
        return bernoulli_variance(p)

    # -- the sampler interface ------------------------------------------------------
    def next(self, k: int, busy: set[int] | None = None) -> list[int]:
        """Up to k problems: due retests first, then the best keys of the heap and of the
        unseen groups, merged. ``busy`` is not needed (the sampler tracks what is in
        flight); it is kept for interface parity with the uniform sampler."""
        out: list[int] = []
        state = self.state
        queue = self.retest_queue
        while len(out) < k and queue:
            i = queue.popleft()
            if state[i] == QUEUED:
                state[i] = IN_FLIGHT
                self.retests_dispatched += 1
                out.append(i)
        ukeys, ugroups = self._unseen_candidates(k - len(out))
        heap, stamp, pop = self.heap, self.stamp, heapq.heappop
        orders, positions = self.unseen_order, self.unseen_pos
        j, nu = 0, len(ukeys)
        while len(out) < k:
            while heap and (state[heap[0][2]] != HEAP or stamp[heap[0][2]] != heap[0][1]):
                pop(heap)  # stale entry: lazy invalidation
            if heap and (j >= nu or -heap[0][0] >= ukeys[j]):
                i = pop(heap)[2]
            elif j < nu:
                g = ugroups[j]
                j += 1
                i = orders[g][positions[g]]
                positions[g] += 1
            else:
                break
            state[i] = IN_FLIGHT
            out.append(i)
        if len(out) < k:
            out += self._retest_early(k - len(out))
        self.dispatched += len(out)
        return out

    def _retest_early(self, k: int) -> list[int]:
        """When heap and unseen problems are used up (a small pool, mostly solved or
        hopeless), pooled problems are retested now, longest-untested first, alternating
        between the pools, rather than leaving the generators idle until the next round."""
        out: list[int] = []
        pools = [(pool_id, pool) for pool_id, pool in self.pools.items()]
        while len(out) < k and any(pool for _, pool in pools):
            for pool_id, pool in pools:
                while pool and self.state[pool[0]] != pool_id:
                    pool.popleft()  # left the pool already (retired, or queued)
                if pool and len(out) < k:
                    i = pool.popleft()
                    self.state[i] = IN_FLIGHT
                    self.retests_dispatched += 1
                    out.append(i)
        return out

    def _unseen_candidates(self, need: int) -> tuple[list[float], list[int]]:
        """The best ``need`` keys among all unseen problems, (keys descending, group of each).

        Unseen problems of a group share one priority; in gumbel mode the top keys of its
        m members are drawn at once from the order statistics of m Gumbels
        (prl.formulas.top_gumbel_keys_of_equals)."""
        if need <= 0:
            return [], []
        keys, groups = [], []
        for g in range(self.num_groups):
            m = len(self.unseen_order[g]) - self.unseen_pos[g]
            if m <= 0:
                continue
            r = min(need, m)
            prio = max(self.unseen_priority(g), 1e-12)
            if self.cfg.mode == "greedy":
                keys.append(np.full(r, prio))
            else:
                keys.append(top_gumbel_keys_of_equals(math.log(prio), m, r, self.rng))
            groups.append(np.full(r, g))
        if not keys:
            return [], []
        keys_a, groups_a = np.concatenate(keys), np.concatenate(groups)
        top = np.argsort(-keys_a, kind="stable")[:need]
        return keys_a[top].tolist(), groups_a[top].tolist()

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
            factor = decay_factor(elapsed, self.cfg.half_life_versions)
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

    def retire(self, i: int) -> None:
        """Never choose problem i again (it cannot be served); it leaves heap and pools lazily."""
        self.state[i] = RETIRED

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
        keys = prio if self.cfg.mode == "greedy" else gumbel_keys(np.log(np.maximum(prio, 1e-12)), self.rng)
        push, heap = heapq.heappush, self.heap
        for entry in zip((-keys).tolist(), stamps.tolist(), idx.tolist()):
            push(heap, entry)

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber live ones (bounds memory)."""
        live = int((self._state_np == HEAP).sum())
        if len(self.heap) < max(1024, 2 * live):
            return
        state, stamp = self.state, self.stamp
        self.heap = [e for e in self.heap if state[e[2]] == HEAP and stamp[e[2]] == e[1]]
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
            "retired": int((st == RETIRED).sum()),
        }

    def metrics(self) -> dict:
        return {**self.pool_sizes(), "retest_share": self.retests_dispatched / max(1, self.dispatched)}

    def priorities(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Current priority p(1-p) of problems ``idx`` (default: all), vectorised."""
        sel = slice(None) if idx is None else idx
        if self.cfg.prior == "group":
            rates = success_estimate(self.group_successes, self.group_attempts, 1.0, 1.0)[self._group_np[sel]]
            a, b = self.cfg.pseudo_count * rates, self.cfg.pseudo_count * (1 - rates)
        else:
            a, b = self.cfg.alpha, self.cfg.beta
        return bernoulli_variance(success_estimate(self._successes_np[sel], self._attempts_np[sel], a, b))

    def success_rates(self) -> np.ndarray:
        """Observed success rate of every tested problem (NaN where untested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._attempts_np > 0, self._successes_np / self._attempts_np, np.nan)

    def state_dict(self) -> dict:
        """State as numpy arrays and JSON-able values (no pickle): arrays go to
        safetensors, the rest to JSON (scheduler/snapshot.py)."""
        heap = np.array(self.heap, dtype=np.float64).reshape(-1, 3)
        return {
            "arrays": {name: getattr(self, f"_{name}_np").copy() for name in self.ARRAYS},
            "group_successes": self.group_successes.copy(),
            "group_attempts": self.group_attempts.copy(),
            "unseen_order": {str(g): np.asarray(o, dtype=np.int32) for g, o in enumerate(self.unseen_order)},
            "unseen_pos": list(self.unseen_pos),
            "heap_keys": heap[:, 0].copy(),
            "heap_stamps": heap[:, 1].astype(np.int64),
            "heap_problems": heap[:, 2].astype(np.int64),
            "solved_pool": np.asarray(self.pools[SOLVED], dtype=np.int64),
            "unsolved_pool": np.asarray(self.pools[UNSOLVED], dtype=np.int64),
            "retest_queue": np.asarray(self.retest_queue, dtype=np.int64),
            "rng": self.rng.bit_generator.state,
            "counters": [self.version, self.last_retest_version, self.dispatched, self.retests_dispatched],
        }

    def load_state_dict(self, st: dict) -> None:
        for name in self.ARRAYS:
            getattr(self, f"_{name}_np")[:] = np.asarray(st["arrays"][name])
        self.group_successes = np.asarray(st["group_successes"], dtype=np.float64).copy()
        self.group_attempts = np.asarray(st["group_attempts"], dtype=np.float64).copy()
        self.unseen_order = [array("i", np.asarray(st["unseen_order"][str(g)], dtype=np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = list(st["unseen_pos"])
        self.heap = list(zip(np.asarray(st["heap_keys"]).tolist(), np.asarray(st["heap_stamps"]).tolist(),
                             np.asarray(st["heap_problems"]).tolist()))
        heapq.heapify(self.heap)
        self.pools = {SOLVED: deque(np.asarray(st["solved_pool"]).tolist()),
                      UNSOLVED: deque(np.asarray(st["unsolved_pool"]).tolist())}
        self.retest_queue = deque(np.asarray(st["retest_queue"]).tolist())
        self.rng.bit_generator.state = st["rng"]
        self.version, self.last_retest_version, self.dispatched, self.retests_dispatched = st["counters"]
