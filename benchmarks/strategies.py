"""`prl bench strategies`: a short real run per problem-selection strategy on the built-in
task, reporting the share of returned groups with non-zero reward variance (the training
signal the priority exists to raise), rollouts generated and held-out accuracy."""

from __future__ import annotations

import argparse
import sys
import tempfile

from benchmarks.common import count, natural, write_json

STRATEGIES = {
    "uniform": ["scheduler.strategy='uniform'"],
    "priority_flat_prior": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'"],
    "priority_group_prior": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'"],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench strategies", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=count, default=40, help="learner steps per strategy")
    ap.add_argument("--seed", type=natural, default=0)
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = ap.parse_args(argv)

    from prl import logs
    from prl.cli.run import run_pipeline
    from prl.metrics import read_metrics
    from prl.schemas.config import load_config

    logs.configure("console", "warning")
    results = {}
    for name, overrides in STRATEGIES.items():
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = load_config(overrides=[*overrides, f"run.run_dir='{run_dir}'", f"learner.max_steps={args.steps}",
                                         f"run.seed={args.seed}", f"learner.eval_every={args.steps}"])
            summary = run_pipeline(cfg, progress=False)
            last = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["service"] == "scheduler"][-1]
        results[name] = {
            "signal_share": last["scheduler/signal_share"],
            "groups_returned": last["scheduler/groups_returned"],
            "rollouts_generated": summary["rollouts_generated"],
            "rollouts_per_step": summary["rollouts_generated"] / max(1, summary["steps"]),
            "accuracy_end": summary["accuracy_end"],
            "seconds": summary["seconds"],
        }
    print(f"strategy comparison, {args.steps} learner steps each, seed {args.seed}")
    print(f"{'strategy':<24}{'signal share':>14}{'rollouts/step':>15}{'held-out acc':>14}{'seconds':>9}")
    for name, r in results.items():
        print(f"{name:<24}{r['signal_share']:>14.3f}{r['rollouts_per_step']:>15.0f}{r['accuracy_end']:>14.3f}{r['seconds']:>9.0f}")
    write_json(args, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
