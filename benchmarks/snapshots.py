"""`prl bench snapshots`: a scheduler's bytes written per snapshot with a full replay buffer,
against writing the whole buffer each time.

A replay buffer of 30,000 rollouts of 2,000 completion tokens (ids and log-probs: about 0.5 GB)
takes a batch's fresh rollouts each step and drops as many of its oldest, as the scheduler's does
at full capacity; 64 accepted groups wait for a batch, a batch's worth arriving and leaving each
step; each step then writes the scheduler's snapshot with the batch it is about to publish (its
fresh rollouts and half as many replayed), into a local directory.

- prl: scheduler/snapshot.py, the new rollouts and groups appended as one segment per log a step.
- whole buffer: the same snapshot with every rollout in the buffer and every waiting group
  written again each step, as the scheduler wrote them before segments (the batch named in it).

Bytes written are the sizes of the files the step wrote (snapshot, segment, manifest, latest).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from benchmarks.common import count, natural, output_file, write_json
from prl.scheduler.snapshot import Logs, write_snapshot
from prl.schemas import Rollout, RolloutGroup, TrainBatch, TrainRollout


def rollouts(rng, start: int, n: int, tokens: int) -> list[TrainRollout]:
    ids = rng.integers(0, 50_000, (n, tokens), dtype=np.int32)
    logprobs = -rng.exponential(1.0, (n, tokens)).astype(np.float32)
    return [TrainRollout(f"d{(start + i) // 8}/{(start + i) % 8}", "p", 0, False, 0.5, 1.0, 1.0,
                         np.arange(64, dtype=np.int32), ids[i], logprobs[i]) for i in range(n)]


def groups(rng, start: int, n: int, tokens: int) -> list[RolloutGroup]:
    """``n`` accepted groups of 8 rollouts, their dispatches numbered from ``start``."""
    ids = rng.integers(0, 50_000, (n, 8, tokens), dtype=np.int32)
    logprobs = -rng.exponential(1.0, (n, 8, tokens)).astype(np.float32)
    return [RolloutGroup(f"g{start + g}", "p", 0, "producer", np.arange(64, dtype=np.int32), 1.0,
                         [Rollout(ids[g, i], logprobs[g, i], 1.0, "stop") for i in range(8)]) for g in range(n)]


def files(root: Path) -> dict:
    """Every file under ``root``: its path -> (inode, modification time, size)."""
    return {p: (st.st_ino, st.st_mtime_ns, st.st_size) for p in root.rglob("*") if p.is_file() and (st := p.stat())}


def written(before: dict, after: dict) -> int:
    """Bytes of the files that are new or changed from ``before`` to ``after``."""
    return sum(size for p, (*_, size) in after.items() if before.get(p) != after[p])


def run(mode: str, args, buffer: deque, rng, first_id: int) -> dict:
    """``args.steps`` snapshot steps, their fresh rollouts numbered from ``first_id`` (ids are
    unique, as the scheduler's are); bytes and seconds per step (the first, which writes the
    buffer once in both modes, is left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        logs = Logs.at(str(run_dir))
        state = {"next_seq": 0, "trained": np.zeros(args.problems, dtype=np.uint8), "in_flight": {}}
        waiting, per_batch = deque(groups(rng, first_id, args.waiting, args.tokens)), args.fresh // 8
        figures = []
        for seq in range(args.steps + 1):
            waiting.extend(groups(rng, first_id + args.waiting + seq * per_batch, per_batch, args.tokens))
            for _ in range(per_batch):
                waiting.popleft()  # into the batch
            fresh = rollouts(rng, first_id + seq * args.fresh, args.fresh, args.tokens)
            buffer.extend(fresh)  # full: the oldest leave as these enter
            replayed = [buffer[i] for i in rng.choice(len(buffer) - args.fresh, args.fresh // 2, replace=False)]
            pending = TrainBatch(f"b{seq}", seq, seq, 0, fresh + replayed)
            before = files(run_dir)
            start = time.perf_counter()
            write_snapshot(str(run_dir), seq, {**state, "next_seq": seq}, list(waiting), list(buffer), pending,
                           logs if mode == "prl" else None)
            seconds = time.perf_counter() - start
            figures.append((written(before, files(run_dir)), seconds))
        steps = figures[1:]
        return {"bytes_per_step": sum(b for b, _ in steps) / len(steps), "seconds_per_step": sum(s for _, s in steps) / len(steps)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench snapshots", description=__doc__.splitlines()[0])
    ap.add_argument("--buffer", type=count, default=30_000, help="rollouts in the full replay buffer")
    ap.add_argument("--tokens", type=count, default=2_000, help="completion tokens per rollout")
    ap.add_argument("--fresh", type=count, default=256, help="fresh rollouts per batch (32 groups of 8)")
    ap.add_argument("--waiting", type=count, default=64, help="accepted groups of 8 waiting for a batch at each snapshot")
    ap.add_argument("--problems", type=count, default=100_000, help="problems in the pool (the sampler's arrays)")
    ap.add_argument("--steps", type=count, default=3)
    ap.add_argument("--seed", type=natural, default=0)
    ap.add_argument("--json", metavar="PATH", type=output_file, help="write the figures as JSON")
    args = ap.parse_args(argv)
    if args.fresh * 2 > args.buffer:
        ap.error("--fresh must be at most half of --buffer")
    rng = np.random.default_rng(args.seed)
    buffer = deque(rollouts(rng, 0, args.buffer, args.tokens), maxlen=args.buffer)
    figures = {mode: run(mode, args, buffer, rng, first_id=(i + 1) * 10**9)
               for i, mode in enumerate(("prl", "whole_buffer"))}
    share = figures["prl"]["bytes_per_step"] / figures["whole_buffer"]["bytes_per_step"]
    print(f"scheduler snapshot per step: replay buffer of {args.buffer:,} rollouts x {args.tokens:,} tokens, "
          f"{args.fresh} fresh rollouts a batch, {args.waiting} groups waiting")
    print(f"{'figure':<20}{'prl (segments)':>18}{'whole buffer':>18}")
    print(f"{'MB_written_per_step':<20}{figures['prl']['bytes_per_step'] / 1e6:>18,.1f}"
          f"{figures['whole_buffer']['bytes_per_step'] / 1e6:>18,.1f}")
    print(f"{'seconds_per_step':<20}{figures['prl']['seconds_per_step']:>18,.2f}{figures['whole_buffer']['seconds_per_step']:>18,.2f}")
    print(f"prl writes {share:.1%} of the whole buffer's bytes a step (goal <= 5%)")
    write_json(args, **figures, share=share, goal_share=0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
