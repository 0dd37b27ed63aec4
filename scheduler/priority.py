"""Problem-level prioritized sampling (seed A, arXiv 2601.02648): priority p(1-p), retest pools.

State lives in flat typed arrays indexed by a dense problem index (array.array with numpy
views for vectorised work), not in one Python object per problem.

- **Estimate.** p = (s + a) / (n + a + b) (``prl.formulas.success_estimate``) from s successes
  in n attempts, both halved every ``HALF_LIFE`` learner versions (``prl.formulas.forgetting``:
  a problem the policy regressed on is judged by its recent results), with a Beta(a, b) prior of ``pseudo_count`` attempts at the problem's group
  rate. The group rate counts each problem's *first* group only (an estimate of how a
  never-tried problem of the group does, which retests of its hard problems cannot drive
  down), and starts at 1/2 with the weight of two attempts (Beta(1, 1)). Without a label every
  problem is in one group: an unseen problem is expected to do as the pool's problems did on
  their first visit (empirical Bayes), not to sit at p = 1/2, the maximum of p(1-p), forever.
  With ``task.group_field`` the dataset's column names the groups.
- **Priority** p(1-p) (``prl.formulas.bernoulli_variance``): zero for always- and
  never-solved problems, largest at p = 1/2.
- **Sampling in proportion to priority**, whatever the call size: every choosable problem
  holds an exponential clock in virtual time, set at t with rate w to ring at t + E/w
  (``prl.formulas.exponential_clock``), and each pick is the next clock to ring. By
  memorylessness the next ring is problem i with probability w_i / sum(w) among the problems
  choosable then; a clock is reset when its rate changes. A min-heap with lazy invalidation
  holds the clocks (seed A's heap, in its stochastic mode). The m never-tried problems of a
  group share one clock of rate m w, so an untried pool costs one heap entry per group.
- **Never-tried floor.** At least ``UNSEEN_SHARE`` of dispatches go to never-tried problems
  while any remain, round-robin over groups: no problem starves, whatever its group's rate.
- **Retest.** A problem whose last group of G completions had no signal (rewards all equal,
  as the zero-variance filter judges it) and was all solved (all failed) goes to the solved
  (unsolved) pool, out of the heap. Every ``retest_interval`` learner versions
  ``RETEST_SHARE`` of each pool, longest-untested first, is queued; retests take at most
  ``RETEST_CAP`` of dispatches, and when nothing else is choosable the pools are served
  regardless. A changed result returns the problem to the heap.
- **Wait bound.** A problem not dispatched for ``MAX_WAIT`` times the pool's size in
  dispatches, wherever it is (heap, never tried, a pool), is dispatched ahead of all others
  (checked every ``n / 100`` dispatches): no problem waits more than three times the pool's size.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque

import numpy as np

from prl.formulas import bernoulli_variance, exponential_clock, forgetting, group_outcome, success_estimate

HEAP, IN_FLIGHT, SOLVED, UNSOLVED, QUEUED, RETIRED = 0, 1, 2, 3, 4, 5
STATES = ("choosable", "in flight", "in the solved pool", "in the unsolved pool", "queued for retest", "retired")
GROUP_START_WEIGHT = 2.0  # a group's rate starts at 1/2 with the weight of two attempts: Beta(1, 1)
UNSEEN_SHARE = 0.1  # at least this share of dispatches goes to never-tried problems while any remain
RETEST_SHARE = 0.1  # share of each pool queued per retest round
RETEST_CAP = 0.2  # retests take at most this share of dispatches
MIN_RATE = 1e-12  # a clock of rate 0 would never ring
HALF_LIFE = 50.0  # learner versions over which a problem's success counts halve
MAX_WAIT = 2.0  # a problem not dispatched for this many times the pool's size in dispatches goes next
SCANS_PER_POOL = 100  # how often, per pool-size of dispatches, the overdue problems are looked for


def _typed(code: str, n: int, value=0) -> tuple[array, np.ndarray]:
    a = array(code, [value]) * n
    return a, np.frombuffer(a, dtype=np.dtype(code if code != "f" else "float32")) if n else np.zeros(0)


class PrioritySampler:
    """``scheduler.strategy = "priority"``: next / observe_many / on_version / retire / release,
    state_dict / load_state_dict / check_state, metrics (scheduler/samplers.py: the interface)."""

    zero_variance_filter = True  # a group whose rewards are all equal is counted, not trained
    ARRAYS = ("group", "successes", "attempts", "last_tested", "streak", "state", "stamp", "last_dispatched")
    CODES = {"group": "i", "successes": "f", "attempts": "f", "last_tested": "i", "streak": "i", "state": "B", "stamp": "I",
             "last_dispatched": "q"}

    def __init__(self, groups, pseudo_count: float = 2.0, retest_interval: int = 10, seed: int = 0, group_size: int = 8,
                 half_life: float = HALF_LIFE):
        """``groups[i]``: the prior group of problem i (small ints >= 0, all 0 without a label);
        ``group_size``: completions of a whole group (G), the retest streak's unit; ``half_life``:
        learner versions over which a problem's counts halve (0: they never do)."""
        groups = np.asarray(groups, dtype=np.int32)
        self.pseudo_count, self.retest_interval, self.group_size = pseudo_count, retest_interval, group_size
        self.half_life = half_life
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
        self.unseen_order = [array("i", self.rng.permutation(np.flatnonzero(groups == g)).astype(np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos = [0] * self.num_groups
        self.group_stamp = [0] * self.num_groups
        self.heap: list[tuple[float, int, int]] = []  # (ring time, stamp, id): id >= 0 a problem, id < 0 a group's unseen
        self.now = 0.0  # virtual time of the clocks
        self.pools = {SOLVED: deque(), UNSOLVED: deque()}
        self.retest_queue: deque[int] = deque()
        self.version = self.last_retest_version = 0
        self.dispatched = self.retests_dispatched = self.unseen_dispatched = 0
        self.unseen_cursor = 0  # round-robin over groups for the never-tried floor
        self.overdue: deque[int] = deque()  # problems past the wait bound, longest-waiting first
        self.overdue_dispatched = self.next_scan = 0
        self._arm_groups(range(self.num_groups))

    # -- estimates ------------------------------------------------------------------
    def group_rate(self, g):
        """Group g's first-visit success rate (a Beta(1, 1) start of two attempts)."""
        start = GROUP_START_WEIGHT / 2
        return success_estimate(self.group_successes[g], self.group_attempts[g], start, start)

    def prior(self, idx) -> tuple:
        """(a, b): the Beta prior of problems ``idx``, ``pseudo_count`` attempts at their group's rate."""
        rates = self.group_rate(self._group_np[idx])
        return self.pseudo_count * rates, self.pseudo_count * (1 - rates)

    def priorities(self, idx: np.ndarray | None = None) -> np.ndarray:
        """Current priority p(1-p) of problems ``idx`` (default: all)."""
        sel = slice(None) if idx is None else idx
        return bernoulli_variance(success_estimate(self._successes_np[sel], self._attempts_np[sel], *self.prior(sel)))

    def priority(self, i: int) -> float:
        return float(self.priorities(np.asarray([i]))[0])

    def unseen_priority(self, g: int) -> float:
        return float(bernoulli_variance(self.group_rate(g)))

    def unseen_left(self, g: int) -> int:
        return len(self.unseen_order[g]) - self.unseen_pos[g]

    # -- choosing ---------------------------------------------------------------------
    def next(self, k: int, busy=None) -> list[int]:
        """Up to k problems: overdue ones, due retests within the cap, the never-tried floor,
        then the clocks; retests beyond the cap only when nothing else is choosable. (The
        sampler knows what is in flight; ``busy`` is not needed.)"""
        total = self.dispatched + k
        out = self._overdue(k)
        out += self._due_retests(min(k - len(out), math.floor(RETEST_CAP * total) - self.retests_dispatched))
        out += self._unseen_floor(min(k - len(out), math.ceil(UNSEEN_SHARE * total) - self.unseen_dispatched))
        out += self._from_clocks(k - len(out))
        out += self._retest_early(k - len(out))
        self.dispatched += len(out)
        return out

    def _overdue(self, k: int) -> list[int]:
        """Problems not dispatched for MAX_WAIT x the pool's size in dispatches, longest-waiting
        first, wherever they wait (the heap's and the pools' entries of a taken problem go
        stale and are skipped there, as after any dispatch)."""
        if self.dispatched >= self.next_scan:
            self.next_scan = self.dispatched + max(1, self.n // SCANS_PER_POOL)
            waiting = np.flatnonzero((self.dispatched - self._last_dispatched_np >= MAX_WAIT * self.n)
                                     & (self._state_np != IN_FLIGHT) & (self._state_np != RETIRED))
            self.overdue = deque(waiting[np.argsort(self._last_dispatched_np[waiting], kind="stable")].tolist())
        out: list[int] = []
        while len(out) < k and self.overdue:
            i = self.overdue.popleft()
            if self.state[i] in (IN_FLIGHT, RETIRED):
                continue
            if self._last_tested_np[i] < 0 and self.state[i] == HEAP:  # never tried: leaves its group's order
                self._leave_unseen(i)
                self._arm_unseen(int(self._group_np[i]))
            out.append(self._take(i, retest=self.state[i] != HEAP))
            self.overdue_dispatched += 1
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
        self.last_dispatched[i] = self.dispatched
        return i

    def _take_unseen(self, g: int) -> int:
        i = self.unseen_order[g][self.unseen_pos[g]]
        self.unseen_pos[g] += 1
        self.unseen_dispatched += 1
        self._arm_unseen(g)  # one fewer never-tried problem: the group's clock rate changed
        return self._take(i)

    # -- observing --------------------------------------------------------------------
    def observe(self, i: int, rewards, version: int, threshold: float = 1.0) -> None:
        """Record one returned group's rewards for problem i."""
        solved, attempts, signal = group_outcome(rewards, threshold)
        self.observe_many([i], [solved], [attempts], version, signal=[signal])

    def observe_many(self, idx, solved, attempts, version: int, signal=None) -> None:
        """Record returned groups (problem ``idx[j]``: ``solved[j]`` of ``attempts[j]``
        completions solved; ``signal[j]``: whether its rewards differ, by default whether some
        but not all were solved), vectorised; then move each problem to the heap or a pool."""
        idx = np.asarray(idx, dtype=np.int64)
        solved = np.asarray(solved, dtype=np.float32)
        attempts = np.asarray(attempts, dtype=np.float32)
        signal = (solved > 0) & (solved < attempts) if signal is None else np.asarray(signal, dtype=bool)
        self.version = max(self.version, version)
        self._count_first_groups(idx, solved, attempts)
        if self.half_life:
            tested = idx[self._last_tested_np[idx] >= 0]
            kept = forgetting(version - self._last_tested_np[tested], self.half_life).astype(np.float32)
            self._successes_np[tested] *= kept
            self._attempts_np[tested] *= kept
        np.add.at(self._successes_np, idx, solved)
        np.add.at(self._attempts_np, idx, attempts)
        self._last_tested_np[idx] = version
        self._route(idx, solved, attempts, signal)

    def _count_first_groups(self, idx, solved, attempts) -> None:
        """First results count in their group's first-visit rate. A first result this sampler
        did not ask for (an offline replay of a log, a test's setup) also takes the problem out
        of its group's never-tried order, so no later pick returns it from there as well."""
        first = self._last_tested_np[idx] < 0
        if not first.any():
            return
        for i in idx[first & (self._state_np[idx] == HEAP)].tolist():
            self._leave_unseen(i)
        groups = self._group_np[idx[first]]
        self.group_successes += np.bincount(groups, solved[first], self.num_groups)
        self.group_attempts += np.bincount(groups, attempts[first], self.num_groups)
        self._arm_groups(np.unique(groups).tolist())

    def _leave_unseen(self, i: int) -> None:
        g = int(self._group_np[i])
        order, pos = np.frombuffer(self.unseen_order[g], dtype=np.int32), self.unseen_pos[g]
        found = np.flatnonzero(order[pos:] == i)
        if len(found):  # swapped with the next one due, and passed
            j = pos + int(found[0])
            order[j], order[pos] = order[pos], i
            self.unseen_pos[g] += 1

    def _route(self, idx, solved, attempts, signal) -> None:
        """No signal and all solved (all failed) for a whole group's worth of completions in a
        row: to the solved (unsolved) pool; otherwise back to the heap with a fresh clock."""
        streak = self._streak_np[idx].astype(np.int64)
        n = attempts.astype(np.int64)
        all_solved, all_failed = ~signal & (solved == attempts), ~signal & (solved == 0)
        streak = np.where(all_solved, np.where(streak > 0, streak + n, n),
                          np.where(all_failed, np.where(streak < 0, streak - n, -n), 0))
        self._streak_np[idx] = np.clip(streak, -(1 << 30), 1 << 30)
        k = self.group_size if self.retest_interval else 1 << 30
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
        """The learner's version moved: queue retests when a retest interval has passed."""
        if version <= self.version:
            return
        self.version = version
        if self.retest_interval and self.version - self.last_retest_version >= self.retest_interval:
            self.last_retest_version = self.version
            self._queue_retests()
        self._compact()

    def _queue_retests(self) -> None:
        for pool_id, pool in self.pools.items():
            live = [i for i in pool if self.state[i] == pool_id]
            pool.clear()
            pool.extend(live)
            for _ in range(math.ceil(len(pool) * RETEST_SHARE)):
                i = pool.popleft()
                self.state[i] = QUEUED
                self.retest_queue.append(i)

    # -- clocks ---------------------------------------------------------------------
    def _arm(self, idx: np.ndarray) -> None:
        """(Re)insert problems into the heap with fresh stamps and clocks."""
        if not len(idx):
            return
        self._state_np[idx] = HEAP
        stamps = self._stamp_np[idx] + np.uint32(1)
        self._stamp_np[idx] = stamps
        rings = exponential_clock(self.now, np.maximum(self.priorities(idx), MIN_RATE), self.rng)
        push, heap = heapq.heappush, self.heap
        for entry in zip(rings.tolist(), stamps.tolist(), idx.tolist()):
            push(heap, entry)

    def _arm_groups(self, groups) -> None:
        """Reset the clock of each group's never-tried problems (the group's rate may have moved)."""
        for g in groups:
            self._arm_unseen(g)

    def _arm_unseen(self, g: int) -> None:
        """Reset group g's never-tried clock: rate m w for its m never-tried problems."""
        m = self.unseen_left(g)
        self.group_stamp[g] += 1
        if m:
            ring = exponential_clock(self.now, max(m * self.unseen_priority(g), MIN_RATE), self.rng)
            heapq.heappush(self.heap, (ring, self.group_stamp[g], -g - 1))

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
        return {"heap": int((st == HEAP).sum()) - unseen, "unseen": unseen, "in_flight": int((st == IN_FLIGHT).sum()),
                "solved_pool": int((st == SOLVED).sum()), "unsolved_pool": int((st == UNSOLVED).sum()),
                "retest_queued": int((st == QUEUED).sum()), "retired": int((st == RETIRED).sum())}

    def metrics(self) -> dict:
        return {**self.pool_sizes(), "problems_seen": int((self._attempts_np > 0).sum()),
                "retest_share": self.retests_dispatched / max(1, self.dispatched),
                "overdue_share": self.overdue_dispatched / max(1, self.dispatched)}

    def success_rates(self) -> np.ndarray:
        """Observed success rate of every tested problem (NaN where untested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._attempts_np > 0, self._successes_np / self._attempts_np, np.nan)

    def state_dict(self) -> dict:
        """State as numpy arrays and JSON-able values (no pickle): arrays go to safetensors,
        the rest to JSON (scheduler/snapshot.py)."""
        heap = np.array(self.heap, dtype=np.float64).reshape(-1, 3)
        return {
            "sampler": "priority", "groups": self.num_groups,
            "arrays": {name: getattr(self, f"_{name}_np").copy() for name in self.ARRAYS},
            "group_successes": self.group_successes.copy(), "group_attempts": self.group_attempts.copy(),
            "unseen_order": {str(g): np.asarray(o, dtype=np.int32) for g, o in enumerate(self.unseen_order)},
            "unseen_pos": list(self.unseen_pos), "group_stamp": list(self.group_stamp),
            "heap_keys": heap[:, 0].copy(), "heap_stamps": heap[:, 1].astype(np.int64),
            "heap_problems": heap[:, 2].astype(np.int64),
            "solved_pool": np.asarray(self.pools[SOLVED], dtype=np.int64),
            "unsolved_pool": np.asarray(self.pools[UNSOLVED], dtype=np.int64),
            "retest_queue": np.asarray(self.retest_queue, dtype=np.int64),
            "overdue": np.asarray(self.overdue, dtype=np.int64),
            "rng": self.rng.bit_generator.state, "virtual_time": self.now,
            "counters": [self.version, self.last_retest_version, self.dispatched, self.retests_dispatched,
                         self.unseen_dispatched, self.unseen_cursor, self.overdue_dispatched, self.next_scan],
        }

    def check_state(self, st: dict) -> None:
        """Raise ValueError naming the field unless ``st`` is a state of this sampler's pool that
        holds together: every per-problem array and per-group list of the right length, every
        problem or group it names inside the pool (a snapshot that fails is passed over)."""
        from prl.scheduler.snapshot import expect_state, expect_inside, expect_sized

        fits = st.get("sampler") == "priority" and (len(st["arrays"]["group"]), st.get("groups")) == (self.n, self.num_groups)
        labels = f" in {self.num_groups} prior groups" if self.num_groups > 1 else " without a label"
        expect_state(st, "priority", f"{self.n:,} problems{labels}", fits)
        missing = [f"arrays.{k}" for k in self.ARRAYS if k not in st["arrays"]] + (["overdue"] if "overdue" not in st else [])
        if missing or len(st["counters"]) != 8:
            raise ValueError(f"the snapshot lacks {', '.join(missing) or 'counters'}: an older release made it")
        groups, heap = self.num_groups, len(st["heap_keys"])
        if sorted(st["unseen_order"], key=int) != [str(g) for g in range(groups)]:
            raise ValueError(f"unseen_order is for groups {sorted(st['unseen_order'], key=int)}, not 0..{groups - 1}")
        expect_sized({**{f"arrays.{k}": (v, self.n) for k, v in st["arrays"].items()},
                      **{k: (st[k], groups) for k in ("group_successes", "group_attempts", "unseen_pos", "group_stamp")},
                      "heap_stamps": (st["heap_stamps"], heap), "heap_problems": (st["heap_problems"], heap)})
        expect_inside({"arrays.group": (st["arrays"]["group"], 0, groups),
                       "heap_problems": (st["heap_problems"], -groups, self.n),  # a group's clock is -1 - group
                       **{k: (st[k], 0, self.n) for k in ("solved_pool", "unsolved_pool", "retest_queue", "overdue")},
                       **{f"unseen_order.{g}": (st["unseen_order"][str(g)], 0, self.n) for g in range(groups)},
                       **{f"unseen_pos.{g}": ([p], 0, len(st["unseen_order"][str(g)]) + 1)
                          for g, p in enumerate(st["unseen_pos"])}})

    def load_state_dict(self, st: dict) -> None:
        self.check_state(st)
        for name in self.ARRAYS:
            getattr(self, f"_{name}_np")[:] = np.asarray(st["arrays"][name])
        self.group_successes = np.asarray(st["group_successes"], dtype=np.float64).copy()
        self.group_attempts = np.asarray(st["group_attempts"], dtype=np.float64).copy()
        self.unseen_order = [array("i", np.asarray(st["unseen_order"][str(g)], dtype=np.int32).tobytes())
                             for g in range(self.num_groups)]
        self.unseen_pos, self.group_stamp = list(st["unseen_pos"]), list(st["group_stamp"])
        self.pools = {SOLVED: deque(np.asarray(st["solved_pool"]).tolist()),
                      UNSOLVED: deque(np.asarray(st["unsolved_pool"]).tolist())}
        self.retest_queue = deque(np.asarray(st["retest_queue"]).tolist())
        self.overdue = deque(np.asarray(st["overdue"]).tolist())
        self.rng.bit_generator.state = st["rng"]
        (self.version, self.last_retest_version, self.dispatched, self.retests_dispatched,
         self.unseen_dispatched, self.unseen_cursor, self.overdue_dispatched, self.next_scan) = st["counters"]
        self.now = float(st["virtual_time"])
        self.heap = list(zip(np.asarray(st["heap_keys"]).tolist(), np.asarray(st["heap_stamps"]).tolist(),
                             np.asarray(st["heap_problems"]).astype(int).tolist()))
        heapq.heapify(self.heap)
