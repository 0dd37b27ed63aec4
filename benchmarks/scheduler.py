"""`prl bench scheduler`: the problem sampler at a million problems, against a naive one.

Synthetic outcomes: problem i has a hidden success probability drawn from Beta(0.5, 0.5)
(most problems nearly always or never solved, as in practice), and a group of G
rollouts returns Binomial(G, p_i) successes. Both samplers see the same outcome stream.

- prl: scheduler/priority.py (heap with lazy invalidation, gumbel mode, retest pools).
- naive: recomputes every priority and sorts all of them for each dispatch round.

Measured on one core: dispatches per second, success updates (returned groups) per
second, and resident bytes of sampler state per problem.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc

import numpy as np

from benchmarks.common import count, natural, output_file, write_json
from prl.formulas import bernoulli_variance, success_estimate
from prl.scheduler.priority import PrioritySampler
from prl.schemas.config import PriorityConfig


class NaiveSortingSampler:
    """The obvious baseline: priorities of all problems, argsort, take the top k not busy."""

    def __init__(self, n: int):
        self.successes = np.zeros(n, dtype=np.float32)
        self.attempts = np.zeros(n, dtype=np.float32)
        self.busy = np.zeros(n, dtype=bool)

    def next(self, k: int) -> list[int]:
        prio = np.where(self.busy, -1.0, bernoulli_variance(success_estimate(self.successes, self.attempts, 1.0, 1.0)))
        top = np.argsort(-prio, kind="stable")[:k].tolist()
        self.busy[top] = True
        return top

    def observe(self, i: int, solved: int, g: int) -> None:
        self.successes[i] += solved
        self.attempts[i] += g
        self.busy[i] = False


def run_prl(n: int, rounds: int, k: int, g: int, seed: int) -> dict:
    """Timed pass without tracing, then the same run again under tracemalloc for bytes."""
    timed = _prl_pass(n, rounds, k, g, seed, trace=False)
    traced = _prl_pass(n, rounds, k, g, seed, trace=True)
    return {**timed, "bytes_per_problem": traced["bytes_per_problem"], "peak_bytes_per_problem": traced["peak_bytes_per_problem"]}


def _prl_pass(n: int, rounds: int, k: int, g: int, seed: int, trace: bool) -> dict:
    rng = np.random.default_rng(seed)
    truth = rng.beta(0.5, 0.5, n)
    groups = rng.integers(0, 8, n)
    if trace:
        tracemalloc.start()
    p = PriorityConfig()  # the defaults a user gets
    sampler = PrioritySampler(groups, p.pseudo_count, p.retest_interval, seed, group_size=g)
    dispatch_s = observe_s = 0.0
    dispatched = observed = 0
    for r in range(rounds):
        t0 = time.perf_counter()
        picked = sampler.next(k)
        t1 = time.perf_counter()
        solved = rng.binomial(g, truth[picked])
        t2 = time.perf_counter()
        sampler.observe_many(picked, solved, np.full(len(picked), g), r)
        t3 = time.perf_counter()
        sampler.on_version(r)
        dispatch_s += t1 - t0
        observe_s += t3 - t2
        dispatched += len(picked)
        observed += len(picked)
    current, peak = tracemalloc.get_traced_memory() if trace else (0, 0)
    if trace:
        tracemalloc.stop()
    return {
        "dispatches_per_s": dispatched / dispatch_s,
        "updates_per_s": observed / observe_s,
        "bytes_per_problem": current / n,
        "peak_bytes_per_problem": peak / n,
        "dispatched": dispatched,
    }


def run_naive(n: int, rounds: int, k: int, g: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    truth = rng.beta(0.5, 0.5, n)
    rng.integers(0, 8, n)
    sampler = NaiveSortingSampler(n)
    dispatch_s = observe_s = 0.0
    dispatched = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        picked = sampler.next(k)
        t1 = time.perf_counter()
        solved = rng.binomial(g, truth[picked])
        t2 = time.perf_counter()
        for i, s in zip(picked, solved):
            sampler.observe(i, int(s), g)
        observe_s += time.perf_counter() - t2
        dispatch_s += t1 - t0
        dispatched += len(picked)
    state_bytes = sampler.successes.nbytes + sampler.attempts.nbytes + sampler.busy.nbytes
    return {"dispatches_per_s": dispatched / dispatch_s, "updates_per_s": dispatched / observe_s,
            "bytes_per_problem": state_bytes / n, "dispatched": dispatched}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench scheduler", description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=count, default=1_000_000)
    ap.add_argument("--rounds", type=count, default=4000, help="dispatch rounds for prl (4000 x 512: every problem seen twice)")
    ap.add_argument("--naive-rounds", type=count, default=20, help="dispatch rounds for the naive sampler (it is slow)")
    ap.add_argument("--batch", type=count, default=512, help="problems dispatched per round")
    ap.add_argument("--group-size", type=count, default=8)
    ap.add_argument("--seed", type=natural, default=0)
    ap.add_argument("--json", metavar="PATH", type=output_file, help="write the figures as JSON")
    args = ap.parse_args(argv)
    prl = run_prl(args.problems, args.rounds, args.batch, args.group_size, args.seed)
    naive = run_naive(args.problems, args.naive_rounds, args.batch, args.group_size, args.seed)
    goals = {"dispatches_per_s": 200_000, "updates_per_s": 200_000, "bytes_per_problem": 200}
    print(f"scheduler sampler, {args.problems:,} problems, batch {args.batch}, G={args.group_size}, one core")
    print(f"{'figure':<22}{'prl (heap)':>16}{'naive (sort)':>16}{'goal':>12}")
    for key, goal in goals.items():
        print(f"{key:<22}{prl[key]:>16,.0f}{naive[key]:>16,.0f}{('<= ' if 'bytes' in key else '>= ') + f'{goal:,}':>12}")
    print(f"{'peak_bytes_per_problem':<22}{prl['peak_bytes_per_problem']:>16,.0f}")
    write_json(args, prl=prl, naive=naive, goals=goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
