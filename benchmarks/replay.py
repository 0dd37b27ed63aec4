"""`prl bench replay`: replay-buffer throughput at 30,000 rollouts, against a naive list.

Each step inserts a batch of fresh rollouts (advantages of a Bernoulli group), evicts
everything older than tau_max versions, and draws round(r * fresh) rollouts without
replacement by priority^alpha: the scheduler's per-batch work. Throughput counts rollouts
inserted plus drawn per second. Baseline: a Python list scanned per draw (weights
recomputed, successive weighted choices), the obvious implementation.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np

from benchmarks.common import count, fraction, natural, output_file, write_json
from prl.formulas import rollout_age
from prl.scheduler.replay import ReplayBuffer
from prl.schemas import TrainRollout


def make_rollouts(rng, n, version, counter):
    adv = rng.normal(0, 1, n)
    return [TrainRollout(f"r{counter + i}", "p", version, False, float(a), 1.0, 1.0, [1], [2], [-0.1])
            for i, a in enumerate(adv)]


class NaiveBuffer:
    def __init__(self, capacity, alpha):
        self.items, self.capacity, self.alpha = [], capacity, alpha

    def insert(self, rollouts):
        self.items.extend(rollouts)
        del self.items[: max(0, len(self.items) - self.capacity)]

    def evict_stale(self, version, tau_max):
        self.items = [r for r in self.items if rollout_age(version, r.policy_version) <= tau_max]

    def draw(self, k):
        pool = list(self.items)
        weights = [(abs(r.advantage) + 1e-6) ** self.alpha for r in pool]
        out = []
        for _ in range(min(k, len(pool))):
            i = random.choices(range(len(pool)), weights)[0]
            out.append(pool.pop(i))
            weights.pop(i)
        return out


def run(buffer_cls, steps, fresh, ratio, tau_max, capacity, seed):
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(capacity, 0.5, seed=seed) if buffer_cls is ReplayBuffer else NaiveBuffer(capacity, 0.5)
    # Fill to capacity first (versions spread over tau_max), outside the timing.
    per_version = capacity // (tau_max + 1)
    for v in range(tau_max + 1):
        batch = make_rollouts(rng, per_version, v, v * per_version)
        buf.insert(batch, [0] * len(batch)) if isinstance(buf, ReplayBuffer) else buf.insert(batch)
    version, moved, elapsed = tau_max, 0, 0.0
    for step in range(steps):
        version += 1
        batch = make_rollouts(rng, fresh, version, 10**7 + step * fresh)
        t0 = time.perf_counter()
        buf.evict_stale(version, tau_max)
        drawn = buf.draw(round(ratio * fresh))
        buf.insert(batch, [0] * fresh) if isinstance(buf, ReplayBuffer) else buf.insert(batch)
        elapsed += time.perf_counter() - t0
        moved += fresh + len(drawn)
    size = len(buf) if isinstance(buf, ReplayBuffer) else len(buf.items)
    return {"rollouts_per_s": moved / elapsed, "buffer_size": size, "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench replay", description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=count, default=30_000)
    ap.add_argument("--fresh", type=count, default=2_730, help="fresh rollouts per step (fills 30,000 over tau_max+1 versions)")
    ap.add_argument("--ratio", type=fraction, default=0.5)
    ap.add_argument("--tau-max", type=natural, default=10)
    ap.add_argument("--steps", type=count, default=200)
    ap.add_argument("--naive-steps", type=count, default=3)
    ap.add_argument("--seed", type=natural, default=0)
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    prl = run(ReplayBuffer, args.steps, args.fresh, args.ratio, args.tau_max, args.capacity, args.seed)
    naive = run(NaiveBuffer, args.naive_steps, args.fresh, args.ratio, args.tau_max, args.capacity, args.seed)
    print(f"replay buffer, {args.capacity:,} rollouts, {args.fresh} fresh + {round(args.ratio * args.fresh)} drawn per step, "
          f"tau_max {args.tau_max}")
    print(f"{'figure':<22}{'prl (numpy)':>16}{'naive (list)':>16}{'goal':>14}")
    print(f"{'rollouts_per_s':<22}{prl['rollouts_per_s']:>16,.0f}{naive['rollouts_per_s']:>16,.0f}{'>= 100,000':>14}")
    print(f"{'buffer_size':<22}{prl['buffer_size']:>16,}{naive['buffer_size']:>16,}")
    write_json(args, prl=prl, naive=naive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
