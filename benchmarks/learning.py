"""`prl bench learning`: does prioritization learn faster? Every strategy on the built-in task
with the tiny model, the same rollout budget and the same seeds, side by side.

Strategies: uniform GRPO; the DAPO zero-variance filter; problem priority p(1-p) with a flat
prior without retest, with a flat prior and retest, with the group-shared prior and retest;
and the full method (group prior, retest, rollout replay with tau_max). The training pool is
small enough that problems are revisited within the budget; the held-out set is disjoint
from it (prl/tasks). Reported per strategy over seeds: rollouts (and seconds) to reach the
target held-out accuracy, final accuracy (min / median / max), the share of groups with
reward variance, and the generation spent on zero-signal groups; curves as a PNG.
"""

from __future__ import annotations

import argparse
import json
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
MODES = {  # name: (seeds, rollout budget)
    "default": (3, 15_000),
    "long": (5, 40_000),
}


def one_run(name: str, seed: int, budget: int, eval_every: int, heldout: int, pool: list[int], extra: list[str] = ()) -> dict:
    from prl.metrics import read_metrics
    from prl.run import run_pipeline
    from schemas.config import load_config

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(overrides=[
            *STRATEGIES[name], f"run.run_dir='{run_dir}'", f"run.seed={seed}", "learner.max_steps=100000",
            f"learner.eval_every={eval_every}", f"task.heldout_per_digit={heldout}", f"task.train_per_digit={pool}",
            "scheduler.archive=false", "scheduler.snapshot_every=0", "learner.keep_checkpoints=1", *extra,
        ])
        summary = run_pipeline(cfg, progress=False, max_rollouts=budget)
        rows = read_metrics(f"{run_dir}/metrics.jsonl")
    evals = [(r["rollouts_generated"], r["learner/eval/accuracy"], r["time"]) for r in rows if "learner/eval/accuracy" in r]
    sched = [r for r in rows if r["service"] == "scheduler"][-1]
    returned, with_signal = sched["scheduler/groups_returned"], sched["scheduler/signal_share"] * sched["scheduler/groups_returned"]
    return {"curve": [(x, a) for x, a, _ in evals], "times": [t - evals[0][2] for _, _, t in evals],
            "final": evals[-1][1], "start": evals[0][1], "signal_share": sched["scheduler/signal_share"],
            "zero_signal_rollouts": round((returned - with_signal) * cfg.sampling.group_size),
            "rollouts": summary["rollouts_generated"], "seconds": summary["seconds"], "steps": summary["steps"]}


def crossing(run: dict, target: float) -> tuple[float | None, float | None]:
    """Rollouts and seconds at the first evaluation at or above ``target``."""
    for (x, acc), t in zip(run["curve"], run["times"]):
        if acc >= target:
            return x, t
    return None, None


def curves_png(results: dict, out: str, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from prl.plots import save_png

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, runs) in enumerate(results.items()):
        color = f"C{i}"
        for j, run in enumerate(runs):
            xs, ys = zip(*run["curve"])
            ax.plot(xs, ys, "-", color=color, lw=1.6 if name == "full" else 1, alpha=0.8, label=name if j == 0 else None)
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.2f}")
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel("held-out accuracy (mean over 1-4 digits)")
    ax.set_title("prl bench learning: every strategy, same seeds, same budget")
    ax.legend(fontsize=7, ncol=2)
    save_png(fig, out, 120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench learning", description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=list(MODES), default="default", help="default: 3 seeds (about 30 min); long: 5 seeds")
    ap.add_argument("--seeds", type=int, help="override the mode's seed count")
    ap.add_argument("--budget", type=int, help="rollouts generated per run (override the mode's)")
    ap.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    ap.add_argument("--target", type=float, default=0.25, help="held-out accuracy to reach")
    ap.add_argument("--eval-every", type=int, default=2, help="learner steps between evaluations")
    ap.add_argument("--heldout", type=int, default=100, help="held-out problems per difficulty")
    ap.add_argument("--pool", default="[40, 150, 150, 150]", help="training problems per difficulty (revisited within the budget)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every run (e.g. learner.lr=1e-4)")
    ap.add_argument("--png", default="benchmarks/learning_curves.png")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from prl import logs

    logs.configure("console", "warning")
    seeds, budget = MODES[args.mode]
    seeds, budget = args.seeds or seeds, args.budget or budget
    pool = json.loads(args.pool)
    results: dict[str, list[dict]] = {}
    with tqdm(total=len(args.strategies) * seeds, desc="runs", unit="run") as bar:
        for name in args.strategies:
            for seed in range(seeds):
                results.setdefault(name, []).append(one_run(name, seed, budget, args.eval_every, args.heldout, pool, args.set))
                bar.set_postfix(strategy=name, acc=f"{results[name][-1]['final']:.3f}")
                bar.update(1)

    table = {}
    for name, runs in results.items():
        hits = [crossing(r, args.target) for r in runs]
        reached = [h for h in hits if h[0] is not None]
        finals = sorted(r["final"] for r in runs)
        table[name] = {
            "reached": f"{len(reached)}/{len(runs)}",
            "rollouts_to_target_median": statistics.median([h[0] for h in reached]) if len(reached) * 2 > len(runs) else None,
            "seconds_to_target_median": statistics.median([h[1] for h in reached]) if len(reached) * 2 > len(runs) else None,
            "final_min": finals[0], "final_median": statistics.median(finals), "final_max": finals[-1],
            "signal_share": statistics.mean(r["signal_share"] for r in runs),
            "zero_signal_rollouts": statistics.mean(r["zero_signal_rollouts"] for r in runs),
            "rollouts": statistics.mean(r["rollouts"] for r in runs), "seconds": statistics.mean(r["seconds"] for r in runs),
        }
    start = statistics.median(r["start"] for runs in results.values() for r in runs)
    print(f"\nbuilt-in task, tiny model: {seeds} seeds x {len(results)} strategies, budget {budget:,} rollouts, "
          f"target held-out accuracy {args.target} (start {start:.3f}); training pool {pool}, held-out {args.heldout}/difficulty")
    print(f"{'strategy':<25}{'reached':>8}{'rollouts@target':>16}{'s@target':>9}{'final min/med/max':>20}"
          f"{'signal':>8}{'zero-signal rollouts':>21}{'s/run':>7}")
    for name, t in table.items():
        r2t = f"{t['rollouts_to_target_median']:,.0f}" if t["rollouts_to_target_median"] is not None else "-"
        s2t = f"{t['seconds_to_target_median']:.0f}" if t["seconds_to_target_median"] is not None else "-"
        print(f"{name:<25}{t['reached']:>8}{r2t:>16}{s2t:>9}"
              f"{t['final_min']:>8.3f}/{t['final_median']:.3f}/{t['final_max']:.3f}"
              f"{t['signal_share']:>8.3f}{t['zero_signal_rollouts']:>21,.0f}{t['seconds']:>7.0f}")
    base = {k: table[k]["rollouts_to_target_median"] for k in ("uniform", "dapo_filter") if k in table}
    if "full" in table and table["full"]["rollouts_to_target_median"]:
        for k, v in base.items():
            if v:
                print(f"full / {k} rollouts to target: {table['full']['rollouts_to_target_median'] / v:.2f} (goal <= "
                      f"{'0.5' if k == 'uniform' else '0.7'})")
    if "full" in table and "uniform" in table:
        print(f"final accuracy, full - uniform (medians): {100 * (table['full']['final_median'] - table['uniform']['final_median']):+.1f} points (goal >= +5)")
    curves_png(results, args.png, args.target)
    print(f"curves: {args.png}")
    write_json(args, table=table, runs=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
