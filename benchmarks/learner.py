"""`prl bench learner`: tokens per second of the learner step, one process against 2 FSDP2
ranks (torchrun, gloo on CPU), and the effect of the micro-batch token budget.

Each configuration runs the real learner (`prl learner --batches-from`) on
the same file of synthetic TrainBatches and reads its metrics: completion tokens trained
per second of train_step, averaged over the steps after the first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.common import count, output_file, write_json
from prl.learner.sources import write_batches
from prl.schemas import TrainBatch, TrainRollout


def synthetic_batches(n_batches: int, rollouts: int, prompt: int, completion: int, vocab: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(n_batches):
        rows = []
        for i in range(rollouts):
            ids = torch.randint(3, vocab, (prompt + completion,), generator=g).tolist()
            rows.append(TrainRollout(f"{b}/{i}", "p", 0, False, float(torch.randn(1, generator=g)), 0.0, 1.0,
                                     [1] + ids[:prompt], ids[prompt:], (-torch.rand(completion, generator=g)).tolist()))
        out.append(TrainBatch(f"b{b}", b, 0, 0, rows))
    return out


def run(workdir: Path, world: int, micro: int, steps: int, threads: int, model: str = "builtin:tiny-adder",
        bf16: bool = False) -> float:
    name = f"w{world}-m{micro}-{'bf16' if bf16 else 'fp32'}"
    run_dir = workdir / name
    config = workdir / f"{name}.toml"
    config.write_text(f"""
[run]
run_dir = "{run_dir}"
threads = {threads}
[model]
path = "{model}"
[scheduler]
tau_max = 1000
[learner]
eval_every = 0
checkpoint_every = 1000
max_steps = {steps}
micro_batch_tokens = {micro}
bf16_autocast = {'true' if bf16 else 'false'}
""")
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"] if world > 1 \
        else [sys.executable]
    out = subprocess.run(prefix + ["-m", "prl.cli", "learner", "--config", str(config), "--batches-from",
                                   str(workdir / "batches.arrow")], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    rows = [json.loads(x) for x in (run_dir / "metrics-learner.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "learner/train_seconds" in r][1:]  # first step warms up
    return sum(r["learner/tokens"] for r in rows) / sum(r["learner/train_seconds"] for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench learner", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model directory (e.g. an imported SmolLM2): fp32 against bf16 autocast on it, "
                                    "1 process and 2 FSDP2 ranks (default: the tiny built-in model, micro-batch sizes)")
    ap.add_argument("--steps", type=count, default=8)
    ap.add_argument("--rollouts", type=count, default=128, help="rollouts per batch")
    ap.add_argument("--prompt", type=count, default=16)
    ap.add_argument("--completion", type=count, default=32)
    ap.add_argument("--micro", type=count, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    if args.model:
        return real_model(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batches(str(work / "batches.arrow"), synthetic_batches(args.steps, args.rollouts, args.prompt, args.completion))
        big = max(args.micro)
        results = {"single_process": run(work, 1, big, args.steps, 2), "fsdp2_2_ranks": run(work, 2, big, args.steps, 1)}
        micro = {m: run(work, 1, m, args.steps, 2) for m in args.micro}
    print(f"learner step, tiny model, {args.rollouts} rollouts x ({args.prompt}+{args.completion}) tokens per batch, 2 CPU cores")
    print(f"{'configuration':<34}{'completion tokens/s':>20}")
    print(f"{'1 process (2 threads)':<34}{results['single_process']:>20,.0f}")
    print(f"{'2 FSDP2 ranks, gloo (1 thread each)':<34}{results['fsdp2_2_ranks']:>20,.0f}")
    for m, v in micro.items():
        print(f"{f'1 process, micro-batch {m} tokens':<34}{v:>20,.0f}")
    write_json(args, **results, micro_batch=micro)
    return 0


def real_model(args) -> int:
    """The learner step on a real model: fp32 against bf16 autocast, one process and 2 ranks."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    micro = max(args.micro)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_batches(str(work / "batches.arrow"),
                      synthetic_batches(args.steps, args.rollouts, args.prompt, args.completion, vocab))
        results = {
            "fp32_1_process": run(work, 1, micro, args.steps, 2, args.model, bf16=False),
            "bf16_1_process": run(work, 1, micro, args.steps, 2, args.model, bf16=True),
            "bf16_fsdp2_2_ranks": run(work, 2, micro, args.steps, 1, args.model, bf16=True),
        }
    print(f"learner step, {args.model}, {args.rollouts} rollouts x ({args.prompt}+{args.completion}) tokens per batch, "
          f"2 CPU cores, micro-batch {micro} tokens")
    print(f"{'configuration':<40}{'completion tokens/s':>20}")
    for name, label in (("fp32_1_process", "fp32, 1 process (2 threads)"),
                        ("bf16_1_process", "bf16 autocast, 1 process (2 threads)"),
                        ("bf16_fsdp2_2_ranks", "bf16 autocast, 2 FSDP2 ranks (gloo)")):
        print(f"{label:<40}{results[name]:>20,.1f}")
    write_json(args, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
