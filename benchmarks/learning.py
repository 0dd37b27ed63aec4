"""`prl bench learning`: does prioritization learn faster? Every strategy on the built-in task
with the tiny model, the same rollout budget and the same seeds, side by side.

Strategies: uniform GRPO; the DAPO zero-variance filter (dynamic sampling: it generates
until a batch is full of groups with a signal); problem priority p(1-p) with a flat prior
without retest, with a flat prior and retest, with the group-shared prior and retest; and
the full method (group prior, retest, rollout replay with tau_max). Every strategy but DAPO
takes one optimizer step per ``groups_per_batch`` groups generated, so at an equal rollout
budget they take the same number of steps and differ only in which problems they spend
them on. The training pool (the task's default, 1,880 problems) is small enough that
problems are revisited within the budget; the held-out set is disjoint from it.

Reported per strategy over seeds: rollouts (and training seconds, evaluation excluded) to
reach the target held-out accuracy, final accuracy (min / median / max), the share of
groups with reward variance, and the generation spent on zero-signal groups; learning
curves as a PNG. Accuracy is a trailing mean over ``--smooth`` evaluations: the 1-digit
block has only 19 held-out problems, so one of them moves a single evaluation's mean
over 1-4 digits by 1.3 points.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile

from benchmarks.common import write_json

STRATEGIES = {
    "uniform": ["scheduler.strategy='uniform'", "scheduler.replay.enabled=false"],
    "dapo_filter": ["scheduler.strategy='dapo_filter'", "scheduler.replay.enabled=false"],
    "priority_flat_no_retest": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'",
                                "scheduler.priority.retest=false", "scheduler.replay.enabled=false"],
    "priority_flat_retest": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'",
                             "scheduler.replay.enabled=false"],
    "priority_group_retest": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'",
                              "scheduler.replay.enabled=false"],
    "full": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'", "scheduler.replay.enabled=true"],
}
# The same for every strategy: 8 groups x 8 completions per step, AdamW lr 1e-4 (the tiny
# model's working rate; 3e-5 learns too slowly to separate anything within a budget), the
# task's default training pool, few checkpoints kept, no archive or snapshots.
SETTINGS = [
    "scheduler.groups_per_batch=8", "scheduler.max_in_flight=16", "learner.lr=1e-4", "learner.max_steps=100000",
    "scheduler.archive=false", "scheduler.snapshot_every=0", "learner.keep_checkpoints=1",
]
# Seeds: the median of 3 is one seed, and two 3-seed runs put the crossing ratio on both
# sides of its goal (0.50, 0.54); 5 seeds still fit in 30 minutes on 2 cores (18 min).
MODES = {  # name: (seeds, rollout budget)
    "default": (5, 12_000),
    "long": (8, 24_000),
}


def one_run(name: str, seed: int, budget: int, eval_every: int, heldout: int, pool: list[int], extra: list[str] = ()) -> dict:
    from prl.metrics import read_metrics
    from prl.cli.run import run_pipeline
    from schemas.config import load_config

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(overrides=[
            *SETTINGS, *STRATEGIES[name], f"run.run_dir='{run_dir}'", f"run.seed={seed}",
            f"learner.eval_every={eval_every}", f"task.heldout_per_digit={heldout}", f"task.train_per_digit={pool}", *extra,
        ])
        summary = run_pipeline(cfg, progress=False, max_rollouts=budget)
        rows = read_metrics(f"{run_dir}/metrics.jsonl")
    evals = [r for r in rows if "learner/eval/accuracy" in r]
    sched = [r for r in rows if r["service"] == "scheduler"][-1]
    returned, with_signal = sched["scheduler/groups_returned"], sched["scheduler/signal_share"] * sched["scheduler/groups_returned"]
    return {"curve": [(r["rollouts_generated"], r["learner/eval/accuracy"]) for r in evals],
            "times": training_seconds(evals), "eval_steps": [r["step"] for r in evals],
            "by_difficulty": {k.rsplit("_", 1)[-1]: [r[k] for r in evals] for k in evals[-1] if k.startswith("learner/eval/accuracy_")},
            "start": evals[0]["learner/eval/accuracy"], "signal_share": sched["scheduler/signal_share"],
            "zero_signal_rollouts": round((returned - with_signal) * cfg.sampling.group_size),
            "rollouts": summary["rollouts_generated"], "seconds": summary["seconds"], "steps": summary["steps"]}


def training_seconds(evals: list[dict]) -> list[float]:
    """Wall seconds since the first evaluation at each evaluation, less the time spent
    evaluating (the learner evaluates inline; a strategy that takes more steps evaluates more)."""
    out, spent = [], 0.0
    for i, r in enumerate(evals):
        spent += r["learner/eval/eval_seconds"] if i else 0.0  # each row is written after its evaluation
        out.append(r["time"] - evals[0]["time"] - spent)
    return out


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i + 1 - window) : i + 1]
        out.append(sum(part) / len(part))
    return out


def difficulty_finals(runs: list[dict], smooth: int) -> dict[str, float]:
    """Median over seeds of each difficulty's smoothed final held-out accuracy."""
    return {d: statistics.median(smoothed(r["by_difficulty"][d], smooth)[-1] for r in runs) for d in runs[0]["by_difficulty"]}


def censored_median(values: list[float | None]) -> float | None:
    """Median where None means "not within the budget" (above every number); None if the
    median itself is not within it."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    n = len(ordered)
    mid = ordered[(n - 1) // 2], ordered[n // 2]
    return None if None in mid else (mid[0] + mid[1]) / 2


def crossing(run: dict, target: float) -> tuple[float | None, float | None]:
    """Rollouts and training seconds at the first evaluation whose smoothed accuracy is at or above ``target``."""
    for (x, _), acc, t in zip(run["curve"], run["smoothed"], run["times"]):
        if acc >= target:
            return x, t
    return None, None


def curves_png(results: dict, out: str, target: float, smooth: int) -> None:
    """Every seed's smoothed curve (thin) and the median over seeds (thick), per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from prl.plots import save_png

    fig, ax = plt.subplots(figsize=(9, 5))
    end = max(run["curve"][-1][0] for runs in results.values() for run in runs)
    grid = np.linspace(0, end, 200)
    for i, (name, runs) in enumerate(results.items()):
        color = f"C{i}"
        for run in runs:
            xs = [x for x, _ in run["curve"]]
            ax.plot(xs, run["smoothed"], "-", color=color, lw=0.6, alpha=0.35)
        median = np.median([np.interp(grid, [x for x, _ in r["curve"]], r["smoothed"]) for r in runs], axis=0)
        ax.plot(grid, median, "-", color=color, lw=2.4 if name == "full" else 1.6, label=f"{name} (median of {len(runs)})")
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.2f}")
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel(f"held-out accuracy, mean over 1-4 digits\n(trailing mean of {smooth} evaluations)")
    ax.set_title("prl bench learning: every strategy, same seeds, same rollout budget")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    save_png(fig, out, 120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench learning", description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=list(MODES), default="default", help="default: 5 seeds, 12k rollouts (about 20 min on 2 cores); long: 8 seeds, 24k (about an hour)")
    ap.add_argument("--seeds", type=int, help="override the mode's seed count")
    ap.add_argument("--budget", type=int, help="rollouts generated per run (override the mode's)")
    ap.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    ap.add_argument("--target", type=float, default=0.36, help="held-out accuracy to reach (smoothed)")
    ap.add_argument("--eval-every", type=int, default=4, help="learner steps between evaluations")
    ap.add_argument("--smooth", type=int, default=3, help="evaluations in the trailing mean of the accuracy")
    ap.add_argument("--heldout", type=int, default=200, help="held-out problems per difficulty (1-digit has 19 in all)")
    ap.add_argument("--pool", default="[80, 600, 600, 600]", help="training problems per difficulty (revisited within the budget)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every run (e.g. learner.lr=1e-4)")
    ap.add_argument("--png", default="benchmarks/learning_curves.png")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)

    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from prl import logs

    logs.configure("console", "warning")
    hf_logging.disable_progress_bar()
    seeds, budget = MODES[args.mode]
    seeds, budget = args.seeds or seeds, args.budget or budget
    pool = json.loads(args.pool)
    results: dict[str, list[dict]] = {}
    with tqdm(total=len(args.strategies) * seeds, desc="runs", unit="run") as bar:
        for name in args.strategies:
            for seed in range(seeds):
                run = one_run(name, seed, budget, args.eval_every, args.heldout, pool, args.set)
                run["smoothed"] = smoothed([a for _, a in run["curve"]], args.smooth)
                run["final"] = run["smoothed"][-1]  # the accuracy the run ends with
                results.setdefault(name, []).append(run)
                bar.set_postfix(strategy=name, acc=f"{results[name][-1]['final']:.3f}")
                bar.update(1)

    table = {}
    for name, runs in results.items():
        hits = [crossing(r, args.target) for r in runs]
        finals = sorted(r["final"] for r in runs)
        table[name] = {
            "reached": f"{sum(h[0] is not None for h in hits)}/{len(runs)}",
            "rollouts_to_target_median": censored_median([h[0] for h in hits]),
            "seconds_to_target_median": censored_median([h[1] for h in hits]),
            "steps": statistics.mean(r["steps"] for r in runs),
            "final_min": finals[0], "final_median": statistics.median(finals), "final_max": finals[-1],
            "signal_share": statistics.mean(r["signal_share"] for r in runs),
            "zero_signal_rollouts": statistics.mean(r["zero_signal_rollouts"] for r in runs),
            "rollouts": statistics.mean(r["rollouts"] for r in runs), "seconds": statistics.mean(r["seconds"] for r in runs),
        }
    start = statistics.median(r["start"] for runs in results.values() for r in runs)
    print(f"\nbuilt-in task, tiny model: {seeds} seeds x {len(results)} strategies, budget {budget:,} rollouts, "
          f"target held-out accuracy {args.target} (start {start:.3f}; trailing mean of {args.smooth} evaluations); "
          f"training pool {pool}, held-out {args.heldout}/difficulty")
    print(f"{'strategy':<25}{'reached':>8}{'rollouts@target':>16}{'s@target':>9}{'final min/med/max':>20}"
          f"{'signal':>8}{'zero-signal rollouts':>21}{'steps':>7}{'s/run':>7}")
    for name, t in table.items():
        r2t = f"{t['rollouts_to_target_median']:,.0f}" if t["rollouts_to_target_median"] is not None else f">{budget:,}"
        s2t = f"{t['seconds_to_target_median']:.0f}" if t["seconds_to_target_median"] is not None else "-"
        print(f"{name:<25}{t['reached']:>8}{r2t:>16}{s2t:>9}"
              f"{t['final_min']:>8.3f}/{t['final_median']:.3f}/{t['final_max']:.3f}"
              f"{t['signal_share']:>8.3f}{t['zero_signal_rollouts']:>21,.0f}{t['steps']:>7.0f}{t['seconds']:>7.0f}")
    first = next(iter(results.values()))[0]["by_difficulty"]
    print("final accuracy per difficulty, median over seeds (start: " + ", ".join(f"{d} {v[0]:.2f}" for d, v in first.items()) + ")")
    for name, runs in results.items():
        table[name]["final_by_difficulty"] = per_difficulty = difficulty_finals(runs, args.smooth)
        print(f"  {name:<25}" + "  ".join(f"{d} {v:.3f}" for d, v in per_difficulty.items()))
    base = {k: table[k]["rollouts_to_target_median"] for k in ("uniform", "dapo_filter") if k in table}
    if "full" in table and table["full"]["rollouts_to_target_median"]:
        for k, v in base.items():
            if v:
                print(f"full / {k} rollouts to target: {table['full']['rollouts_to_target_median'] / v:.2f} (goal <= "
                      f"{'0.5' if k == 'uniform' else '0.7'})")
    if "full" in table and "uniform" in table:
        print(f"final accuracy, full - uniform (medians): {100 * (table['full']['final_median'] - table['uniform']['final_median']):+.1f} points (goal >= +5)")
    curves_png(results, args.png, args.target, args.smooth)
    print(f"curves: {args.png}")
    write_json(args, table=table, runs=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
