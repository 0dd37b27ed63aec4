"""Problem-level prioritized sampling (arXiv 2601.02648): priority p(1-p), retest pools.

State lives in flat typed arrays indexed by a dense problem index (array.array, shared
with numpy views for vectorised work), not in one Python object per problem.

- **Estimate.** p = (s + a) / (n + a + b) (``prl.formulas.success_estimate``), s and n the
  successes and attempts, decayed *on read* by ``half_life_versions``, so a problem without
  new results drifts back toward its prior; (a, b) is a flat Beta(alpha, beta) or the
  problem's group rate as ``pseudo_count`` attempts. The group rate counts each problem's
  *first* group only: an estimate of how a never-tried problem of the group does, which
  retests of the group's hard problems cannot drive down; before any first visit it stands at
  the group's starting rate (1/2, or the model's own expected success for answer-likelihood
  groups, ``score_start``) with the weight of ``group_start_weight`` attempts (2: Beta(1, 1)).
  ``pooled`` is the group prior with one group of every problem: no label, an unseen problem
  at the pool's own first-visit rate (empirical Bayes) rather than at p = 1/2, the maximum of
  p(1-p). (Its never-tried problems still share one clock of rate m x priority, so a mostly
  untried pool is still mostly drawn from its untried problems: measured, no faster than the
  flat prior.)
- **Priority** p(1-p) (``prl.formulas.bernoulli_variance``), or with ``weight = "signal"``
  the chance that a group of G has a signal, 1 - p^G - (1-p)^G
  (``prl.formulas.signal_probability``): nearly as high at p = 0.8 (0.83) as at 1/2 (0.99), so
  the sampler keeps training nearly-solved problems instead of concentrating on p = 1/2; or
  with ``weight = "solvable"`` the chance that a group solves it at least once, 1 - (1-p)^G
  (``prl.formulas.pass_at_k``): only problems that look never solved are set aside; over
  ``solvable_groups`` = n groups, 1 - (1-p)^(nG), every problem that may be solved weighs alike.
- **Sampling in proportion to priority** (``gumbel`` mode), whatever the call size and
  history: every choosable problem holds an exponential clock in virtual time; a clock set
  at time t with rate w rings at t + E/w (E ~ Exp(1), ``prl.formulas.exponential_clock``),
  and each pick is the next clock to ring, which moves virtual time there. By
  memorylessness the next ring is problem i with probability w_i / sum(w) among the problems
  choosable at that moment, however long each has waited; a clock is reset whenever its
  problem's rate changes. A min-heap with lazy invalidation holds the clocks. The m
  never-tried problems of a group share one rate w and so one clock of rate m w (their
  first ring). ``periodic`` mode gives each tried problem a clock that rings once per period
  1/w instead (``prl.formulas.periodic_clock``): the same shares, at evenly spaced times,
  so equal priorities draw the pool in shuffled passes once every problem has been tried. Its
  first looks come from the never-tried clock of rate m w, as independent draws (a pass's worth
  of picks leaves about a third of a pool of equal weights untried); with ``unseen_clock =
  "periodic"`` each never-tried problem is due once within one period 1/w instead, at a uniform
  time (``prl.formulas.first_pass_clock``, one clock per group still), so the first look at the
  pool is a pass too. ``greedy`` mode pops the highest priority instead.
- **Never-tried floor.** At least ``unseen_share`` of the dispatches go to never-tried
  problems while any remain, round-robin over groups: every problem is dispatched within
  pool size / (unseen_share x dispatches per round) rounds, whatever its group's rate.
- **Retest.** A problem whose last ``retest_after`` groups were all solved (all failed) goes
  to the solved (unsolved) pool, out of the heap (the streak is counted in completions, so a
  screen of s completions, ``scheduler.screen_size``, counts as s / G of a group). Every
  ``retest_interval`` learner versions ``retest_share`` of each pool, longest-untested
  first, is queued; retests take at most ``retest_cap`` of all dispatches (the rest wait in
  the queue), and when nothing else is choosable the queue and pools are served regardless.
  A changed result returns the problem to the heap.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

import numpy as np

from prl.formulas import (bernoulli_variance, decay_factor, exponential_clock, first_pass_clock, pass_at_k, periodic_clock, signal_probability,
                          success_estimate)
from prl.scheduler.snapshot import expect_state

HEAP, IN_FLIGHT, SOLVED, UNSOLVED, QUEUED, RETIRED = 0, 1, 2, 3, 4, 5
MIN_RATE = 1e-12  # a clock of rate 0 would never ring


def _typed(code: str, n: int, value=0) -> tuple[array, np.ndarray]:
    a = array(code, [value]) * n
    return a, np.frombuffer(a, dtype=np.dtype(code if code != "f" else "float32")) if n else np.zeros(0)


class PrioritySampler:
    ARRAYS = ("group", "successes", "attempts", "updated_at", "last_tested", "streak", "state", "stamp")
    CODES = {"group": "i", "successes": "f", "attempts": "f", "updated_at": "i", "last_tested": "i",
             "streak": "i", "state": "B", "stamp": "I"}

    def __init__(self, groups, cfg, seed: int = 0, group_start=None, group_size: int = 8):
        """``groups[i]``: the prior group (e.g. difficulty) of problem i, small ints >= 0;
        ``group_start[g]``: group g's rate before any first visit (default 1/2);
        ``group_size``: completions of a whole group (G), the retest streak's unit."""
        groups = np.asarray(groups, dtype=np.int32)
        if cfg.prior in ("pooled", "flat"):
            # one group: no label reaches the sampler, not even the never-tried floor's
            # round-robin, which would otherwise balance first visits across the labels
            groups = np.zeros_like(groups)
        self.cfg = cfg
        self.group_size = group_size
        self.shared_prior = cfg.prior != "flat"  # the prior is a group's rate
        self.n = n = len(groups)
        self.rng = np.random.default_rng(seed)
        for name, code in self.CODES.items():
            a, view = _typed(code, n, -1 if name == "last_tested" else 0)
            setattr(self, name, a)
            setattr(self, f"_{name}_np", view)
        self._group_np[:] = groups
        self.num_groups = int(groups.max()) + 1 if n else 0
        self.group_successes = np.zeros(self.num_groups)  # first groups of each problem only
        self.group_attempts = np.zeros(self.num_groups)
        self.start_given = group_start is not None
        self.group_start = np.full(self.num_groups, 0.5) if group_start is None else \
            np.clip(np.asarray(group_start, dtype=float), 0.0, 1.0)
        self.unseen_order = [array("i", self.rng.permutation(np.flatnonzero(groups == g)).astype(np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = [0] * self.num_groups
        self.group_stamp = [0] * self.num_groups
        self.unseen_w = [0.0] * self.num_groups  # priority of one never-tried problem per group, as last armed
        self.unseen_deadline = [0.0] * self.num_groups  # when the group's first pass ends (read by unseen_clock = periodic)
        self.heap: list[tuple[float, int, int]] = []  # (key, stamp, id): id >= 0 a problem, id < 0 a group's unseen
        self.now = 0.0  # virtual time of the clocks
        self.pools = {SOLVED: deque(), UNSOLVED: deque()}
        self.retest_queue: deque[int] = deque()
        self.version = self.last_retest_version = 0
        self.dispatched = self.retests_dispatched = self.unseen_dispatched = 0
        self.unseen_cursor = 0  # round-robin over groups for the never-tried floor
        self._arm_groups(range(self.num_groups))

    # -- estimates ------------------------------------------------------------------
    def group_rate(self, g) -> float | np.ndarray:
        """Group g's first-visit rate, from a Beta prior of ``group_start_weight`` attempts at its
        starting rate."""
        start, weight = self.group_start[g], self.cfg.group_start_weight
        return success_estimate(self.group_successes[g], self.group_attempts[g], weight * start, weight * (1 - start))

    def prior(self, idx) -> tuple:
        """(a, b): the Beta prior of problems ``idx``."""
        if self.shared_prior:
            rates = self.group_rate(self._group_np[idx])
            return self.cfg.pseudo_count * rates, self.cfg.pseudo_count * (1 - rates)
        return self.cfg.alpha, self.cfg.beta

    def priorities(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Current priority (``weight``) of problems ``idx`` (default: all), counts decayed to the
        current version."""
        sel = slice(None) if idx is None else idx
        s, n = self._successes_np[sel], self._attempts_np[sel]
        if self.cfg.half_life_versions > 0:
            f = decay_factor(np.maximum(self.version - self._updated_at_np[sel], 0), self.cfg.half_life_versions)
            s, n = s * f, n * f
        return self.weight(success_estimate(s, n, *self.prior(sel)))

    def weight(self, p):
        """A problem's priority from its success estimate p (``cfg.weight``): p(1-p), the chance
        that its next group has a signal, or the chance that its next ``solvable_groups`` groups solve
        the problem at least once."""
        if self.cfg.weight == "signal":
            return signal_probability(p, self.group_size)
        if self.cfg.weight == "solvable":
            return pass_at_k(p, self.cfg.solvable_groups * self.group_size)
        return bernoulli_variance(p)

    def priority(self, i: int) -> float:
        return float(self.priorities(np.asarray([i]))[0])

    def unseen_priority(self, g: int) -> float:
        p = self.group_rate(g) if self.shared_prior else success_estimate(0, 0, self.cfg.alpha, self.cfg.beta)
        return float(self.weight(p))

    def unseen_left(self, g: int) -> int:
        return len(self.unseen_order[g]) - self.unseen_pos[g]

    # -- the sampler interface ------------------------------------------------------
    def next(self, k: int, busy: set[int] | None = None) -> list[int]:
        """Up to k problems: due retests within the cap, the never-tried floor, then the
        clocks; retests beyond the cap only when nothing else is choosable. ``busy`` is not
        needed (the sampler tracks what is in flight); kept for parity with the uniform one."""
        total = self.dispatched + k
        out = self._due_retests(min(k, math.floor(self.cfg.retest_cap * total) - self.retests_dispatched))
        out += self._unseen_floor(min(k - len(out), math.ceil(self.cfg.unseen_share * total) - self.unseen_dispatched))
        out += self._from_clocks(k - len(out))
        out += self._retest_early(k - len(out))
        self.dispatched += len(out)
        return out

    def _due_retests(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k and self.retest_queue:
            i = self.retest_queue.popleft()
            if self.state[i] == QUEUED:
                out.append(self._take(i, retest=True))
        return out

    def _unseen_floor(self, k: int) -> list[int]:
        """Never-tried problems, one group after another."""
        out: list[int] = []
        while len(out) < k:
            groups = [g for g in range(self.num_groups) if self.unseen_left(g)]
            if not groups:
                break
            g = groups[self.unseen_cursor % len(groups)]
            self.unseen_cursor += 1
            out.append(self._take_unseen(g))
        return out

    def _from_clocks(self, k: int) -> list[int]:
        out: list[int] = []
        heap, stamp, state = self.heap, self.stamp, self.state
        while len(out) < k and heap:
            key, st, ident = heapq.heappop(heap)
            if ident >= 0 and (state[ident] != HEAP or stamp[ident] != st):
                continue  # stale entry: lazy invalidation
            if ident < 0 and (st != self.group_stamp[-ident - 1] or not self.unseen_left(-ident - 1)):
                continue
            if self.cfg.mode != "greedy":
                self.now = max(self.now, key)
            out.append(self._take(ident) if ident >= 0 else self._take_unseen(-ident - 1))
        return out

    def _retest_early(self, k: int) -> list[int]:
        """When nothing else is choosable (a small pool, mostly solved or hopeless): queued
        retests, then the pools, longest-untested first, alternating between the pools."""
        out = self._due_retests(k)
        pools = list(self.pools.items())
        while len(out) < k and any(pool for _, pool in pools):
            for pool_id, pool in pools:
                while pool and self.state[pool[0]] != pool_id:
                    pool.popleft()  # left the pool already (retired, or queued)
                if pool and len(out) < k:
                    out.append(self._take(pool.popleft(), retest=True))
        return out

    def _take(self, i: int, retest: bool = False) -> int:
        self.state[i] = IN_FLIGHT
        self.retests_dispatched += retest
        return i

    def _take_unseen(self, g: int) -> int:
        i = self.unseen_order[g][self.unseen_pos[g]]
        self.unseen_pos[g] += 1
        self.unseen_dispatched += 1
        self._arm_unseen(g)  # one fewer never-tried problem: the group's clock rate changed
        return self._take(i)

    def observe(self, i: int, rewards, version: int) -> None:
        """Record one returned group's rewards for problem i."""
        self.observe_many([i], [sum(1 for r in rewards if r > 0)], [len(rewards)], version)

    def observe_many(self, idx, solved, attempts, version: int) -> None:
        """Record returned groups (problem ``idx[j]``: ``solved[j]`` of ``attempts[j]``
        rewards positive), vectorised; then move each problem to the heap or a pool."""
        idx = np.asarray(idx, dtype=np.int64)
        solved = np.asarray(solved, dtype=np.float32)
        attempts = np.asarray(attempts, dtype=np.float32)
        self.version = max(self.version, version)
        if self.cfg.half_life_versions > 0:  # stored counts are brought to this version before adding
            elapsed = np.maximum(version - self._updated_at_np[idx], 0)
            factor = decay_factor(elapsed, self.cfg.half_life_versions)
            self._successes_np[idx] *= factor
            self._attempts_np[idx] *= factor
        self._updated_at_np[idx] = np.maximum(self._updated_at_np[idx], version)
        self._count_first_groups(idx, solved, attempts)
        np.add.at(self._successes_np, idx, solved)
        np.add.at(self._attempts_np, idx, attempts)
        self._last_tested_np[idx] = version
        self._route(idx, solved, attempts)

    def _leave_unseen(self, idx) -> None:
        """Problems with a first result that were never dispatched (a result this sampler did not
        ask for: an offline replay of a log, a test's setup) are tried now: each leaves its group's
        never-tried order, swapped with the next one due and passed, so no later pick returns it
        from there as well as from the heap. The scheduler service observes only its own
        dispatches, which left that order when they were taken: for them this does nothing."""
        for i in idx.tolist():
            g = int(self._group_np[i])
            order, pos = np.frombuffer(self.unseen_order[g], dtype=np.int32), self.unseen_pos[g]
            found = np.flatnonzero(order[pos:] == i)
            if len(found):
                j = pos + int(found[0])
                order[j], order[pos] = order[pos], i
                self.unseen_pos[g] += 1
                self._arm_unseen(g)  # one fewer never-tried problem: the group's clock rate changed

    def _count_first_groups(self, idx, solved, attempts) -> None:
        """First results: counted in their group's first-visit rate (a problem's first result not
        asked for by a dispatch also takes it out of the never-tried order, ``_leave_unseen``)."""
        first = self._last_tested_np[idx] < 0
        if first.any():
            self._leave_unseen(idx[first & (self._state_np[idx] == HEAP)])
            groups = self._group_np[idx[first]]
            self.group_successes += np.bincount(groups, solved[first], self.num_groups)
            self.group_attempts += np.bincount(groups, attempts[first], self.num_groups)
            if self.shared_prior:
                self._arm_groups(np.unique(groups).tolist())

    def _route(self, idx, solved, attempts) -> None:
        """All solved (all failed) ``retest_after`` groups' worth of completions in a row: to
        the solved (unsolved) pool; otherwise back to the heap with a fresh clock."""
        streak = self._streak_np[idx].astype(np.int64)
        n = attempts.astype(np.int64)
        all_solved, all_failed = solved == attempts, solved == 0
        streak = np.where(all_solved, np.where(streak > 0, streak + n, n),
                          np.where(all_failed, np.where(streak < 0, streak - n, -n), 0))
        self._streak_np[idx] = np.clip(streak, -(1 << 30), 1 << 30)
        k = self.cfg.retest_after * self.group_size if self.cfg.retest else 1 << 30
        for pool, members in ((SOLVED, idx[streak >= k]), (UNSOLVED, idx[streak <= -k])):
            self._state_np[members] = pool
            self.pools[pool].extend(members.tolist())  # after its test: longest-untested first
        self._arm(idx[(streak > -k) & (streak < k)])

    def retire(self, i: int) -> None:
        """Never choose problem i again (it cannot be served); it leaves heap and pools lazily."""
        self.state[i] = RETIRED

    def release(self, i: int) -> None:
        """A dispatch abandoned without a result: the problem becomes choosable again."""
        if self.state[i] == IN_FLIGHT:
            self._arm(np.asarray([i]))

    def on_version(self, version: int) -> None:
        """The learner's version moved: decayed rates change (clocks are reset), and retests
        are queued when a retest interval has passed."""
        if version <= self.version:
            return
        self.version = version
        if self.cfg.half_life_versions > 0:
            self._arm(np.flatnonzero((self._state_np == HEAP) & (self._last_tested_np >= 0)))
        if self.cfg.retest and self.version - self.last_retest_version >= self.cfg.retest_interval:
            self.last_retest_version = self.version
            self._queue_retests()
        self._compact()

    def _queue_retests(self) -> None:
        for pool_id, pool in self.pools.items():
            live = [i for i in pool if self.state[i] == pool_id]
            pool.clear()
            pool.extend(live)
            for _ in range(math.ceil(len(pool) * self.cfg.retest_share)):
                i = pool.popleft()
                self.state[i] = QUEUED
                self.retest_queue.append(i)

    # -- clocks ---------------------------------------------------------------------
    def _keys(self, rates, shared: bool = False):
        """Heap keys (smallest pops first): the ring time of a fresh clock, or -priority; a
        float for a float (one clock, no arrays), else an array. ``shared``: the clock of a
        group's never-tried problems, exponential in every mode but greedy (m problems share it
        only because the first of m exponential clocks rings as one of rate m w)."""
        rates = max(rates, MIN_RATE) if isinstance(rates, float) else np.maximum(rates, MIN_RATE)
        if self.cfg.mode == "greedy":
            return -rates
        clock = periodic_clock if self.cfg.mode == "periodic" and not shared else exponential_clock
        return clock(self.now, rates, self.rng)

    def _arm(self, idx: np.ndarray) -> None:
        """(Re)insert problems into the heap with fresh stamps and clocks."""
        if not len(idx):
            return
        self._state_np[idx] = HEAP
        stamps = self._stamp_np[idx] + np.uint32(1)
        self._stamp_np[idx] = stamps
        push, heap = heapq.heappush, self.heap
        for entry in zip(self._keys(self.priorities(idx)).tolist(), stamps.tolist(), idx.tolist()):
            push(heap, entry)

    def _arm_groups(self, groups) -> None:
        """Reset the clock of each group's never-tried problems, their priority w recomputed
        (the group's rate may have moved)."""
        for g in groups:
            w_before, self.unseen_w[g] = self.unseen_w[g], self.unseen_priority(g)
            # kept whatever the clock, so a run resumed with unseen_clock = periodic finds its passes' ends
            self.unseen_deadline[g] = self._pass_end(g, w_before)
            self._arm_unseen(g)

    def _pass_end(self, g: int, w_before: float) -> float:
        """When group g's first pass ends: one period 1/w from its first arming; when w moves,
        what is left of the window is stretched (or shrunk) by w_before / w, so the never-tried
        problems keep their share of w."""
        w = max(self.unseen_w[g], MIN_RATE)
        if w_before <= 0:
            return self.now + 1.0 / w
        return self.now + max(self.unseen_deadline[g] - self.now, 0.0) * max(w_before, MIN_RATE) / w

    def _arm_unseen(self, g: int) -> None:
        """Reset group g's never-tried clock at its last priority w: rate m w for m problems
        (greedy: the key -w). Scalar arithmetic: this runs once per never-tried pick."""
        m = self.unseen_left(g)
        self.group_stamp[g] += 1
        if m:
            w = self.unseen_w[g]
            if self.cfg.unseen_clock == "periodic":
                key = first_pass_clock(self.now, self.unseen_deadline[g], m, self.rng)
            else:
                key = self._keys(w if self.cfg.mode == "greedy" else m * w, shared=True)
            heapq.heappush(self.heap, (key, self.group_stamp[g], -g - 1))

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber live ones (bounds memory)."""
        live = int((self._state_np == HEAP).sum())
        if len(self.heap) < max(1024, 2 * live + 2 * self.num_groups):
            return
        state, stamp = self.state, self.stamp
        self.heap = [e for e in self.heap if (e[2] >= 0 and state[e[2]] == HEAP and stamp[e[2]] == e[1])
                     or (e[2] < 0 and e[1] == self.group_stamp[-e[2] - 1])]
        heapq.heapify(self.heap)

    # -- state and metrics ----------------------------------------------------------
    def pool_sizes(self) -> dict[str, int]:
        st = self._state_np
        unseen = sum(self.unseen_left(g) for g in range(self.num_groups))
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
        return {**self.pool_sizes(), "problems_seen": int((self._attempts_np > 0).sum()),
                "retest_share": self.retests_dispatched / max(1, self.dispatched),
                "never_dispatched_share": sum(self.unseen_left(g) for g in range(self.num_groups)) / max(1, self.n)}

    def success_rates(self) -> np.ndarray:
        """Observed success rate of every tested problem (NaN where untested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._attempts_np > 0, self._successes_np / self._attempts_np, np.nan)

    def state_dict(self) -> dict:
        """State as numpy arrays and JSON-able values (no pickle): arrays go to
        safetensors, the rest to JSON (scheduler/snapshot.py)."""
        heap = np.array(self.heap, dtype=np.float64).reshape(-1, 3)
        return {
            "sampler": "priority",
            "groups": self.num_groups,
            "arrays": {name: getattr(self, f"_{name}_np").copy() for name in self.ARRAYS},
            "group_successes": self.group_successes.copy(),
            "group_attempts": self.group_attempts.copy(),
            "unseen_order": {str(g): np.asarray(o, dtype=np.int32) for g, o in enumerate(self.unseen_order)},
            "unseen_pos": list(self.unseen_pos),
            "group_stamp": list(self.group_stamp),
            "unseen_deadline": list(self.unseen_deadline),
            "heap_keys": heap[:, 0].copy(),
            "heap_stamps": heap[:, 1].astype(np.int64),
            "heap_problems": heap[:, 2].astype(np.int64),
            "solved_pool": np.asarray(self.pools[SOLVED], dtype=np.int64),
            "unsolved_pool": np.asarray(self.pools[UNSOLVED], dtype=np.int64),
            "retest_queue": np.asarray(self.retest_queue, dtype=np.int64),
            "rng": self.rng.bit_generator.state,
            "virtual_time": self.now,
            "counters": [self.version, self.last_retest_version, self.dispatched, self.retests_dispatched,
                         self.unseen_dispatched, self.unseen_cursor],
        }

    def load_state_dict(self, st: dict) -> None:
        expect_state(st, "priority", self.n, self.num_groups)
        for name in self.ARRAYS:
            getattr(self, f"_{name}_np")[:] = np.asarray(st["arrays"][name])
        self.group_successes = np.asarray(st["group_successes"], dtype=np.float64).copy()
        self.group_attempts = np.asarray(st["group_attempts"], dtype=np.float64).copy()
        self.unseen_order = [array("i", np.asarray(st["unseen_order"][str(g)], dtype=np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = list(st["unseen_pos"])
        self.unseen_w = [self.unseen_priority(g) for g in range(self.num_groups)]  # group rates restored above
        self.pools = {SOLVED: deque(np.asarray(st["solved_pool"]).tolist()),
                      UNSOLVED: deque(np.asarray(st["unsolved_pool"]).tolist())}
        self.retest_queue = deque(np.asarray(st["retest_queue"]).tolist())
        self.rng.bit_generator.state = st["rng"]
        counters = list(st["counters"]) + [0] * (6 - len(st["counters"]))
        (self.version, self.last_retest_version, self.dispatched, self.retests_dispatched,
         self.unseen_dispatched, self.unseen_cursor) = counters
        if "virtual_time" in st:
            self.now = float(st["virtual_time"])
            self.group_stamp = list(st["group_stamp"])
            self.unseen_deadline = list(st.get("unseen_deadline", [self.now + 1.0 / max(w, MIN_RATE) for w in self.unseen_w]))
            self.heap = list(zip(np.asarray(st["heap_keys"]).tolist(), np.asarray(st["heap_stamps"]).tolist(),
                                 np.asarray(st["heap_problems"]).astype(int).tolist()))
            heapq.heapify(self.heap)
        else:  # a snapshot from before the clocks: fresh clocks for everything choosable
            self.heap = []
            self._arm(np.flatnonzero((self._state_np == HEAP) & (self._last_tested_np >= 0)))
            self._arm_groups(range(self.num_groups))
