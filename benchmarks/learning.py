"""`prl bench learning`: does prioritization learn faster, and is it the method or a label?
Every strategy and its controls on the same seeds and the same rollout budget, side by side.

Strategies (all through the same scheduler, replay and learner):
- ``uniform``: uniform problem choice, every group trained (the GRPO baseline);
- ``dapo_filter``: uniform choice with DAPO's zero-variance filter and dynamic sampling
  (generates until a batch is full of groups with a signal): the strongest cheap baseline;
  both draw the pool in shuffled passes, as a data loader does (``BASELINE_SETS``);
- ``priority_flat``: problem priority p(1-p) with a flat prior: no labels at all, on a training
  pool small enough to be revisited several times within the budget (the seed method);
- ``priority_pooled``: the same with the pooled prior: still no label, an unseen problem starts
  at the pool's own first-visit success rate (empirical Bayes) instead of p = 1/2;
- ``priority_group``: the same with the group prior (the task's difficulty label);
- ``priority_shuffled``: the group prior with the labels permuted across problems: if it
  does as well as ``priority_group``, the label carried nothing;
- ``replay_alone``: uniform choice with rollout replay (tau_max, advantage priority);
- ``naive_replay``: uniform choice with replay drawn uniformly from the buffer and no age rule;
- ``full``: group prior, retest, rollout replay;
- ``full_pooled``: the full method without a label: pooled prior, retest, rollout replay;
- ``priority_likelihood``: the group prior over groups the model makes, not a label: the starting
  policy's probability of each problem's reference answer, in 8 quantile bins
  (prl/tasks/likelihood.py, as `prl data likelihood` writes them), each bin's rate starting
  at its mean probability, the model's expected success (``score_start``). The scoring pass is charged
  as one rollout per problem: its curve starts that many rollouts in and its budget is that
  much smaller;
- ``full_likelihood``: the full method with those groups: retest, rollout replay;
- ``priority_flat_screen``: the flat prior with screening (``scheduler.screen_size`` 2, SPEED-RL's
  screen-then-complete): a look at a problem costs 2 completions, and only a screen with a
  signal is completed to a group of 8; still no label;
- ``dapo_screen``: DAPO with the same screening and uniform choice (SPEED-RL itself): the
  baseline that shows what screening alone does;
- ``uniform_drop``: uniform in passes that leaves out a problem never solved after a whole group
  (``scheduler.uniform_drop_unsolved``): the simplest dead-problem filter without a label, the
  flat prior's plain rival.
Every strategy but DAPO and the screened ones trains one batch per ``groups_per_batch`` groups
generated (those three: per ``groups_per_batch`` groups with a signal), each at its own tuned
learning rate (``LR``) and optimizer steps per batch (``UPDATES``: the baselines, the group prior,
its shuffled control and the screened strategies take 2).
Every run is evaluated every ``--eval-every`` rollouts generated (not steps), so strategies
are compared at equal generation cost. Reported: rollouts to each target (median over seeds,
a seed that misses counts as beyond the budget), final accuracy, area under the accuracy-vs-
rollouts curve, groups with signal, zero-signal rollouts, retest and never-dispatched shares,
distinct problems trained on (how broadly, not only how much), completion length of trained vs
dropped-as-stale rollouts, seed paper B's replay figures and the share of batches the
gradient-norm clip rescaled;
each goal figure with its 90% bootstrap interval over seeds (how far other seeds could move it),
and every other strategy against both baselines at every target, likewise;
and each run's final policy on its own training pool beside the held-out set, per difficulty
(how much of what it learned is the pool); and where a final lead lies: each strategy's final
held-out accuracy per difficulty over DAPO's and over each reference strategy's, with its interval.

``--mode large-pool`` runs uniform, DAPO and the full methods on the built-in task's own pool of
1,880 problems (visited about once within the budget, so the label-free priority has nothing
to revisit there): the final-accuracy comparison where the pool does not cap the end point.

``--task chain_sum`` runs the comparison on the real model and task (examples/
smollm2-chain-sum-cpu.toml, a fresh import and dataset, trained on ``--pool`` problems drawn at
random from its training split, the same draw for every run), fewer seeds and strategies.

``--from-json A.json B.json ...`` trains nothing: it pools the runs of earlier invocations of
the same settings (other seeds, other strategies) into one table, goal lines and figure;
``--reference C.json ...`` beside it adds runs on another training pool (the ceiling: the
learnable problems alone), set against the same baselines but not counted as strategies, and
every strategy set against each of them (how far it stays from the ceiling).
``--picks`` runs the reported rows (README's table: the baselines in passes, the flat prior, the
label's group prior, its shuffled control and full method, the likelihood groups and their full
method), each at its tuning pick (``PICKS``), so its runs pool with the stored thirty seeds.
``--tuning A.json ...`` trains nothing either: it lists, per strategy and tuning set (seeds, pool,
budget), every setting the stored tuning runs tried, highest median area first, and marks the
tuning rule's pick: the reported setting unless one is more than ``ADOPT_MARGIN`` above it, else
the highest (``--strategies`` narrows it to theirs; ``--png`` draws each strategy's settings by area,
the pick and its margin).
``--jobs N`` makes N runs at once, each in its own process (default: one per core).

This file runs the strategies and reports them; what each runs is in learning_settings.py, the
figures in learning_figures.py, pooling stored runs and the tuning rule in learning_stored.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import count, fraction, natural, quiet_console, write_json
from benchmarks.learning_figures import (BASELINES, NAME, against_baselines, against_reference, difficulty_cells,
                                         difficulty_differences, goals, print_table, smoothed, table)
from benchmarks.learning_settings import (ADOPT_MARGIN, BASELINE_SETS, BUILTIN_POOL, LIKELIHOOD, LIKELIHOOD_BINS, MODE_UPDATES,
                                          MODES, MU, PICKS, POOL_SEED, REAL, SETTINGS, STRATEGIES, TASK_POOL, UPDATES,
                                          learning_rates, override_scope, pick_args, recorded_overrides, strategy_overrides,
                                          strategy_settings, updates_per_batch)
from benchmarks.learning_stored import (commits_line, machines_line, picks_text, pooled_runs, stored_budget, stored_pool,
                                        tried_settings, tuning_png, tuning_strips)
from benchmarks.real import CONFIG, TASK_SETTINGS, TEST, TRAIN
from prl.tasks import train_problems
from prl.schemas.config import load_config


def one_run(name: str, seed: int, budget: int, eval_every: int, base: list[str], extra: list[str] = ()) -> dict:
    from prl.cli.run import run_pipeline
    from prl.metrics import read_metrics

    with tempfile.TemporaryDirectory() as run_dir:
        overrides = strategy_settings(name, base, list(extra), [f"run.run_dir='{run_dir}'", f"run.seed={seed}",
                                                                f"learner.eval_every_rollouts={eval_every}"])
        scored = 0
        if name in LIKELIHOOD:
            scored = likelihood_groups(load_config(overrides=overrides), f"{run_dir}/groups.parquet")
            overrides.append(f"scheduler.priority.groups_path='{run_dir}/groups.parquet'")
        cfg = load_config(overrides=overrides)
        summary = run_pipeline(cfg, progress=False, max_rollouts=budget - scored)
        rows = read_metrics(f"{run_dir}/metrics.jsonl")
        pool = pool_accuracy(cfg)
    return {**summarize_run(rows, summary, scored, cfg.learner.grad_clip), "pool_end": pool, "peak_rss_gb": peak_rss_gb()}


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, GB: a run's own in a worker process that
    served it alone (``--jobs`` >= 2); with ``--jobs 1``, earlier runs of the benchmark included."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # kB on Linux


def pool_accuracy(cfg) -> dict[str, float]:
    """The run's final policy (its latest checkpoint) on its own training pool, greedy and per
    difficulty, as the held-out set is scored. Beside the held-out figure it says how much of
    what a run learned is the pool itself: a pool the policy has learned caps every strategy's
    final held-out accuracy, however well it chose its problems."""
    from prl.learner.checkpoint import latest_uri
    from prl.learner.evaluate import encode_heldout, heldout_accuracy
    from prl.generation import TransformersBackend
    from prl.rewards import load_reward

    backend = TransformersBackend.from_path(cfg.model.path, cfg.model.dtype)
    backend.load_weights(latest_uri(cfg.run.run_dir), -1)
    problems, max_tokens = train_problems(cfg.task), cfg.sampling.max_tokens
    return heldout_accuracy(backend, problems, encode_heldout(backend, problems, max_tokens), load_reward(cfg.producer.reward),
                            max_tokens)


def likelihood_groups(cfg, out: str) -> int:
    """Score the run's training problems with its starting policy into a groups file ``out``;
    the problems scored, charged as that many rollouts."""
    from prl.tasks.likelihood import score_into_groups

    problems = train_problems(cfg.task)
    score_into_groups(problems, cfg.model.path, out, LIKELIHOOD_BINS, cfg.model.dtype, cfg.sampling.temperature)
    return len(problems)


def summarize_run(rows: list[dict], summary: dict, charged: int = 0, grad_clip: float | None = None) -> dict:
    """One run's figures; ``charged`` rollouts of work before the run (a scoring pass) move its
    curve that far along the rollouts axis; ``grad_clip``, the run's gradient-norm clip: the share
    of batches whose first step it rescaled (their norm before the clip above it)."""
    evals = [r for r in rows if "learner/eval/accuracy" in r]
    sched = [r for r in rows if r["service"] == "scheduler"][-1]
    steps = [r for r in rows if "learner/loss" in r]
    replay_steps = [r for r in steps if r.get("learner/replay/clip_fraction") is not None]
    return {
        "curve": [(r["rollouts_generated"] + charged, r["learner/eval/accuracy"]) for r in evals],
        "by_difficulty": {k.rsplit("_", 1)[-1]: [r[k] for r in evals] for k in evals[-1] if k.startswith("learner/eval/accuracy_")},
        "start": evals[0]["learner/eval/accuracy"], "signal_share": sched["scheduler/signal_share"],
        "zero_signal_rollouts": sched.get("scheduler/zero_signal_rollouts", 0),
        "retest_share": sched.get("scheduler/retest_share", 0.0),
        "never_dispatched_share": sched.get("scheduler/never_dispatched_share", float("nan")),
        "problems_seen": sched.get("scheduler/problems_seen"),
        "problems_trained": sched.get("scheduler/problems_trained"),  # distinct problems trained with a signal; None before it existed
        "completion_tokens_trained": sched.get("scheduler/completion_tokens/trained_mean", float("nan")),
        "completion_tokens_stale": sched.get("scheduler/completion_tokens/stale_dropped_mean", float("nan")),
        "completion_tokens_replay_evicted": sched.get("scheduler/replay/evicted_completion_tokens_mean", float("nan")),
        "replay_share": statistics.mean(r["learner/replay_share"] for r in steps) if steps else 0.0,
        "replay_evicted_never_drawn": sched.get("scheduler/replay/evicted_never_drawn", 0),
        "clip_fresh": statistics.mean(r.get("learner/fresh/clip_fraction", 0.0) for r in steps) if steps else 0.0,
        "clip_replay": statistics.mean(r["learner/replay/clip_fraction"] for r in replay_steps) if replay_steps else None,
        "grad_norm_median": statistics.median(r["learner/grad_norm"] for r in steps) if steps else None,
        "grad_clip_share": (statistics.mean(r["learner/grad_norm"] > grad_clip for r in steps)
                            if steps and grad_clip is not None else None),
        "rollouts": summary["rollouts_generated"] + charged, "charged_rollouts": charged,
        "seconds": summary["seconds"], "steps": summary["steps"],
    }


def curves_png(results: dict, out: str, targets: list[float], title: str, smooth: int,
               reference: dict | None = None) -> None:
    """Every seed's smoothed curve (thin) and the median over seeds (thick), per strategy; the
    ``reference`` runs' medians dashed (another pool or setting, e.g. the ceiling), their seeds
    not drawn."""
    from prl.plots import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(10, 5.5))
    reference = reference or {}
    end = max(run["curve"][-1][0] for group in (results, reference) for runs in group.values() for run in runs)
    grid = np.linspace(0, end, 200)

    def median(runs):
        return np.median([np.interp(grid, [x for x, _ in r["curve"]], r["smoothed"]) for r in runs], axis=0)

    for i, (name, runs) in enumerate(results.items()):
        color = f"C{i}"
        for run in runs:
            ax.plot([x for x, _ in run["curve"]], run["smoothed"], "-", color=color, lw=0.6, alpha=0.3)
        ax.plot(grid, median(runs), "-", color=color, lw=2.4 if name in ("full", "dapo_filter") else 1.4,
                label=f"{name} (median of {len(runs)})")
    for i, (name, runs) in enumerate(reference.items(), start=len(results)):
        ax.plot(grid, median(runs), "--", color=f"C{i}", lw=1.6, label=f"{name}, reference (median of {len(runs)})")
    for t in targets:
        ax.axhline(t, color="grey", ls=":", lw=1)
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel("held-out accuracy" + (f" (trailing mean of {smooth})" if smooth > 1 else ""))
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    save_png(fig, out, 120)


def pool_rows(rows: int, pool: int, seed: int = POOL_SEED) -> list[int]:
    """The training pool: ``pool`` distinct rows of ``rows`` drawn at random, in file order. A draw
    rather than the first rows, which a generator with a small problem space fills with its easy
    problems (chain_sum: 22 of the first 48 are one-digit sums, 172 of all 2,000)."""
    return sorted(random.Random(seed).sample(range(rows), pool))


def real_task_base(task: str, pool: int) -> list[str]:
    """Overrides that run the example SmolLM2 config on a fresh import and a fresh dataset, trained
    on ``pool`` of its training problems (`pool_rows`)."""
    import pyarrow.parquet as pq

    from prl.model_import import import_gguf
    from prl.tasks.reasoning_gym import write_dataset

    tmp = tempfile.mkdtemp(prefix="prl-bench-learning-")
    model = import_gguf("smollm2-135m-instruct", f"{tmp}/model", quiet=True).out_dir
    data = write_dataset(task, TRAIN, TEST, seed=0, out_dir=f"{tmp}/data", settings=TASK_SETTINGS if task == "chain_sum" else {})
    train = f"{data.out_dir}/train.parquet"
    table = pq.read_table(train)
    pq.write_table(table.take(pool_rows(table.num_rows, pool)), train)
    cfg = load_config(CONFIG)
    return [f"model.path={json.dumps(model)}", "task.name='dataset'", f"task.train_path='{data.out_dir}/train.parquet'",
            f"task.heldout_path='{data.out_dir}/test.parquet'", "producer.reward='prl.producers.rewards:reasoning_gym'",
            f"sampling.max_tokens={cfg.sampling.max_tokens}", f"learner.lr={cfg.learner.lr}", "learner.bf16_autocast=auto"]


def strategy_extras(args, strategies: list[str], lrs: dict[str, float]) -> dict[str, list[str]]:
    """Each strategy's items after its own: its rate, its steps per batch (the mode's), its --set items."""
    tuned = {} if args.task else MODE_UPDATES.get(args.mode, UPDATES)
    return {name: [*([f"learner.lr={lrs[name]}"] if name in lrs else []), *([f"{MU}={tuned[name]}"] if name in tuned else []),
                   *strategy_overrides(args.set, name)] for name in strategies}


def run_all(args, base: list[str], strategies: list[str], seeds: int, budget: int, lrs: dict[str, float]) -> dict[str, list[dict]]:
    """Every strategy on every seed, seed-major (a partial run still compares every strategy);
    with ``--jobs N``, N runs at once, each in its own process."""
    from tqdm import tqdm

    extra = strategy_extras(args, strategies, lrs)
    jobs = [(name, seed, budget, args.eval_every, base, extra[name])
            for seed in range(args.first_seed, args.first_seed + seeds) for name in strategies]
    results: dict[str, list[dict]] = {}
    with tqdm(total=len(jobs), desc="runs", unit="run") as bar:
        for (name, seed, *_), run in finished_runs(jobs, min(args.jobs, len(jobs))):
            run = {"seed": seed, "lr": lrs.get(name), "updates": updates_per_batch(extra[name]),
                   "set": recorded_overrides(args.set, name), **run}
            run["smoothed"] = smoothed([a for _, a in run["curve"]], args.smooth)
            run["final"] = run["smoothed"][-1]
            results.setdefault(name, []).append(run)
            results[name].sort(key=lambda r: r["seed"])
            write_json(args, runs=results)  # finished runs survive an interrupted benchmark
            bar.set_postfix(strategy=name, acc=f"{run['final']:.3f}")
            bar.update(1)
    return {name: results[name] for name in strategies if name in results}


def finished_runs(jobs: list[tuple], workers: int, run_json=None):
    """(job, summary) of each ``one_run(*job)`` as it finishes: in this process one after
    another, or in ``workers`` spawned processes, a new one for each run (torch's threads shared
    out between them; summaries come back as JSON text). A process serves one run so that what
    a run leaves allocated goes with it: two reused workers held 9.6 and 12.4 GB when the kernel
    killed one (2026-12-01, `--task chain_sum`, where one run alone holds about 9 GB), and the
    benchmark lost every run still to come. ``run_json``: what each worker calls with a job
    (``one_run_json``; a test's stand-in)."""
    if workers == 1:
        for job in jobs:
            yield job, one_run(*job)
        return
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, cores() // workers)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker,
                               initargs=(threads, os.getpid()), max_tasks_per_child=1)
    try:
        futures = {pool.submit(run_json or one_run_json, *job): job for job in jobs}
        for future in as_completed(futures):
            yield futures[future], json.loads(future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def cores() -> int:
    """CPU cores this process may run on."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_worker(threads: int, parent: int) -> None:
    import torch

    die_with_parent(parent)
    quiet_console()
    torch.set_num_threads(threads)


def die_with_parent(parent: int) -> None:
    """On Linux a worker is sent SIGTERM when the benchmark process dies, however it dies;
    otherwise a benchmark killed with SIGTERM or SIGKILL leaves its workers to run to the end of
    their run. Elsewhere they stop when they next ask for a job."""
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the benchmark died before the line above
        os._exit(1)


def one_run_json(*job) -> str:
    return json.dumps(one_run(*job))


def setting(task: str | None, pool, heldout) -> str:
    if task:
        return f"SmolLM2-135M-Instruct on reasoning-gym {task}, training pool {pool or REAL['pool']}"
    return f"built-in task, tiny model, training pool {pool}, held-out {heldout}/difficulty"


def steps_and_settings(results: dict[str, list[dict]]) -> str:
    """"; optimizer steps per batch {...}; --set ...": what the runs were trained with beyond their rates."""
    mus = {name: runs[0].get("updates", 1) for name, runs in results.items()}
    mu_text = f"; optimizer steps per batch {({n: m for n, m in mus.items() if m != 1})}" if set(mus.values()) != {1} else ""
    sets = {name: runs[0]["set"] for name, runs in results.items() if runs[0].get("set")}
    return mu_text + ("; --set " + "; ".join(f"{n}: {' '.join(items)}" for n, items in sets.items()) if sets else "")


def report(args, results: dict[str, list[dict]], budget: int, where: str, details: str, lr_text: str,
           reference: tuple[str, dict[str, list[dict]]] | None = None) -> None:
    """The table, the goal lines, the replay figures, the curves and the JSON of finished runs;
    ``reference``: (what they are, runs) shown after the goal lines, set against the baselines."""
    t = table(results, args.targets, budget)
    start = statistics.median(r["start"] for runs in results.values() for r in runs)
    print_table(t, args.targets, budget, f"\n{where}: {details} (start {start:.3f}; trailing mean of {args.smooth}); "
                f"{lr_text}{steps_and_settings(results)}")
    for line in goals(t, args.targets, results):
        print(line)
    for target in args.targets:
        if lines := against_baselines(results, target):
            print(f"every strategy against the baselines at {target} (medians over seeds; 90% over seeds in brackets):")
            print("\n".join(lines))
    ref_where, ref_runs = reference or (None, None)
    if ref_runs:
        print_table(table(ref_runs, args.targets, budget), args.targets, budget,
                    f"reference runs, not baselines: {ref_where}{steps_and_settings(ref_runs)}")
        for target in args.targets:
            if lines := against_baselines(results, target, ref_runs):
                print(f"the reference runs against the baselines above at {target}:")
                print("\n".join(lines))
        if lines := against_reference(results, ref_runs, args.targets, budget):
            print("every strategy against the reference runs (medians over seeds; 90% over seeds in brackets):")
            print("\n".join(lines))
    print("last evaluation per difficulty, held-out / training pool (medians over seeds):")
    for name, runs in results.items():
        print(f"  {name:<{NAME}}{difficulty_cells(runs)}")
    pairs = [(name, "dapo_filter", runs, results["dapo_filter"]) for name, runs in results.items()
             if name not in BASELINES and "dapo_filter" in results]
    pairs += [(name, f"reference {ref}", runs, ref_list) for ref, ref_list in (ref_runs or {}).items()
              for name, runs in results.items() if name not in BASELINES]
    if pairs:
        print("final held-out accuracy per difficulty, each strategy over the other named, in points of that "
              "difficulty's own accuracy (medians over seeds; 90% over seeds in brackets):")
        for name, over, runs, other in pairs:
            print(f"  {name:<{NAME}}over {over}: {difficulty_differences(runs, other, args.smooth)}")
    if replayed := [n for n, r in t.items() if r["replay_share"] > 0]:
        print("replay (paper B): " + "; ".join(
            f"{n} share {t[n]['replay_share']:.2f} clip fresh/replay {t[n]['clip_fresh']:.3f}/"
            f"{'-' if t[n]['clip_replay'] is None else format(t[n]['clip_replay'], '.3f')}" for n in replayed))
    if clipped := [n for n, r in t.items() if r["grad_clip_share"] is not None]:
        print("gradient-norm clip: share of batches it rescaled (median norm before it): " + "; ".join(
            f"{n} {t[n]['grad_clip_share']:.2f} ({t[n]['grad_norm_median']:.2f})" for n in clipped))
    if measured := {n: [r["peak_rss_gb"] for r in runs if "peak_rss_gb" in r] for n, runs in results.items()}:
        if any(measured.values()):
            print("peak resident memory of a run's process, GB (max over seeds; with --jobs 1 earlier runs included): "
                  + "; ".join(f"{n} {max(v):.1f}" for n, v in measured.items() if v))
    curves_png(results, args.png, args.targets, f"prl bench learning: {where}", args.smooth, ref_runs)
    print(f"curves: {args.png}")
    write_json(args, table=t, runs=results)


TRAINING_FLAGS = ("mode", "task", "seeds", "first_seed", "budget", "eval_every", "heldout", "pool", "lr",
                  "set", "jobs", "picks")  # what --from-json cannot apply: the stored runs were trained with their own
SEED_FLAGS = ("seeds", "first_seed")  # ... but for these two, which choose the stored seeds it pools


def pooled_curves_path() -> str:
    """Where --from-json draws without --png: the temporary directory, so pooling stored runs
    changes no file of the repository (a trained run's default figure above all)."""
    return str(Path(tempfile.gettempdir()) / "bench-learning-pooled-curves.png")


def curves_path(task: str | None, mode: str = "default") -> str:
    """Where a run's curves go by default: one figure per task, and per mode with its own pool."""
    if task:
        return f"docs/bench-learning-{task}-curves.png"
    return "docs/bench-learning-curves.png" if MODES[mode][2] == BUILTIN_POOL else f"docs/bench-learning-{mode}-curves.png"


def stored_runs_only(ap, args, flag: str, allowed: str, but: tuple[str, ...] = ()) -> None:
    """Exit with one line if a flag that only a training run can use (any of TRAINING_FLAGS but
    ``but``) came with ``flag``."""
    given = [f"--{k.replace('_', '-')}" for k in TRAINING_FLAGS
             if k not in but and getattr(args, k) != ap.get_default(k)]
    if given:
        ap.error(f"{flag} trains nothing, so {' '.join(given)} cannot apply: the stored runs keep the "
                 f"settings they were trained with (only {allowed} do)")


def with_picks(ap, args) -> list[str]:
    """``--picks``: the strategies to run (the reported rows unless named), each one's pick put
    before the given --lr and --set items (which still override it)."""
    if args.task or args.mode != "default":
        ap.error("--picks: the picks were tuned on the built-in task's default mode; drop --task and --mode")
    strategies = args.strategies or list(PICKS)
    if unpicked := [name for name in strategies if name not in PICKS]:
        ap.error(f"--picks: no reported row for {' '.join(unpicked)} (the rows: {' '.join(PICKS)})")
    picked = [pick_args(name) for name in strategies]
    args.lr = [*(item for rate, _ in picked for item in rate), *args.lr]
    args.set = [*(item for _, items in picked for item in items), *args.set]
    return strategies


def tuning_picks(ap, args) -> int:
    """``--tuning``: every setting tried per strategy and tuning set, the rule's pick first."""
    if args.from_json:
        ap.error("--tuning lists the settings tried, --from-json pools runs to report: give one of them")
    stored_runs_only(ap, args, "--tuning", "--strategies, --smooth and --png")
    report_only = [flag for flag, given in (("--targets", args.targets != ap.get_default("targets")),
                                            ("--json", args.json)) if given]
    if report_only:
        ap.error(f"--tuning ranks the settings by area and prints them, so {' '.join(report_only)} cannot apply "
                 "(only --strategies, --smooth and --png do)")
    try:
        tried = tried_settings(args.tuning, args.smooth)
    except ValueError as exc:
        ap.error(str(exc))
    listed = {where[0] for where in tried}
    missing = [name for name in args.strategies or [] if name not in listed]
    if missing:
        ap.error(f"--strategies {' '.join(missing)}: not in the tuning files ({', '.join(sorted(listed))})")
    tried = {where: rows for where, rows in tried.items() if not args.strategies or where[0] in args.strategies}
    print("\n".join(picks_text(tried)))
    if args.png:
        tuning_png(tuning_strips(tried), args.png)
        print(f"areas: {args.png}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench learning", description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=list(MODES), default="default", help="default: 5 seeds, 12k rollouts (16-22 min on "
                    f"2 cores, two runs at once; benchmarks/RESULTS.md); long: 8 seeds, 24k; large-pool: 5 seeds, 12k rollouts, the task's own "
                    f"pool {TASK_POOL} (visited about once), uniform, DAPO and the full methods (15 seeds took 17 min with --jobs 2)")
    ap.add_argument("--task", help="a reasoning-gym task for the real model (e.g. chain_sum); default: the built-in task")
    ap.add_argument("--seeds", type=count, help="override the mode's seed count (with --from-json: pool only the stored "
                    "runs of seeds first-seed .. first-seed + seeds - 1)")
    ap.add_argument("--first-seed", type=natural, default=0, help="seeds first-seed .. first-seed + seeds - 1 (other seeds "
                    "than the reported ones, to tune a setting on; with --from-json, the first seed pooled)")
    ap.add_argument("--budget", type=count, help="rollouts generated per run (override the mode's)")
    ap.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), help="default: every one but the pooled-prior "
                    "and likelihood-group ones on the built-in task (large-pool mode: uniform, dapo_filter, full and "
                    "full_likelihood); uniform, dapo_filter, priority_flat and full with --task; with --from-json, the "
                    "stored strategies to show")
    ap.add_argument("--targets", type=fraction, nargs="+", default=[0.36, 0.38], help="held-out accuracies to reach (smoothed)")
    ap.add_argument("--eval-every", type=count, default=512, help="rollouts generated between evaluations")
    ap.add_argument("--smooth", type=count, default=3, help="evaluations in the trailing mean of the accuracy")
    ap.add_argument("--heldout", type=count, default=200, help="held-out problems per difficulty (built-in task)")
    ap.add_argument("--pool", help=f"training pool: problems per difficulty of the built-in task (default the mode's: "
                    f"{BUILTIN_POOL}, revisited about 5 times within the budget, or {TASK_POOL} in large-pool mode), or with "
                    f"--task the number of problems (default {REAL['pool']}, at most the dataset's {TRAIN})")
    ap.add_argument("--lr", action="append", default=[], metavar="STRATEGY=LR", help="learning rate of one strategy "
                    "(default: LR's tuned rates on the built-in task, the example config's with --task)")
    ap.add_argument("--set", action="append", default=[], metavar="[STRATEGY:]KEY=VALUE", help="config override for every "
                    "run (after the strategy's learning rate), or with STRATEGY: for that strategy's runs only (so one run "
                    "compares a setting against baselines without it); each run records the items it took")
    ap.add_argument("--png", help="where the curves go (default docs/bench-learning-curves.png, in large-pool mode "
                    "docs/bench-learning-large-pool-curves.png, with --task docs/bench-learning-TASK-curves.png, so no "
                    "setting overwrites another's figure; with --from-json the temporary directory's "
                    "bench-learning-pooled-curves.png, so pooling stored runs changes no file of the repository; with --tuning "
                    "no default: the settings tried, by area, drawn only where given)")
    ap.add_argument("--jobs", type=count, default=cores(), help="runs at once, each in its own process with its "
                    "share of the cores (default: one per core; on 2 cores the default mode took 16-22 min with 2 at 0c6f954 "
                    "and 071139f, 28 min with --jobs 1 at a20db31, one run after another in this process; "
                    "benchmarks/RESULTS.md)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--from-json", nargs="+", metavar="PATH", help="train nothing: pool the runs of earlier --json "
                    "files of the same settings (other seeds or strategies) into one table, goal lines and figure; "
                    "PATH:STRATEGY,... pools only those strategies' runs of that file")
    ap.add_argument("--reference", nargs="+", metavar="PATH", help="with --from-json: runs of the same task, budget "
                    "and evaluation on another training pool (e.g. the learnable problems alone, what a perfect "
                    "dead-problem filter gives) or at another setting (e.g. a pick), pooled as --from-json pools, "
                    "shown after the goal lines, set against its baselines and each of its strategies against them "
                    "(a baseline with its own strategy's alone); not baselines themselves")
    ap.add_argument("--picks", action="store_true", help="run the reported rows (default: all eight of them) each at "
                    "its tuning pick (PICKS), so the runs pool with the stored thirty seeds; the built-in task's "
                    "default mode only")
    ap.add_argument("--tuning", nargs="+", metavar="PATH", help="train nothing: list each strategy's settings in these "
                    "stored tuning runs (each with the others of the same seeds, pool and budget) by median area under "
                    "the curve, highest first, marking the tuning rule's pick (the reported setting unless one is more than "
                    f"{ADOPT_MARGIN} above it; with --strategies: theirs alone; with --png: drawn too); a run whose --set "
                    "items make it another strategy (uniform with uniform_drop's items) is listed as that one")
    args = ap.parse_args(argv)
    if args.reference and not args.from_json:
        ap.error("--reference sets stored runs against the baselines of --from-json's runs: give --from-json too")
    if args.tuning:
        return tuning_picks(ap, args)
    if args.from_json:
        stored_runs_only(ap, args, "--from-json", "--strategies, --first-seed, --seeds, --smooth, --targets, --png "
                         "and --json", but=SEED_FLAGS)
        seeds = None if args.seeds is None and not args.first_seed else range(
            args.first_seed, args.first_seed + args.seeds if args.seeds else sys.maxsize)
        try:
            results, stored, rates = pooled_runs(args.from_json, args.smooth, args.strategies, seeds=seeds)
            reference = pooled_runs(args.reference, args.smooth, flag="--reference", seeds=seeds) if args.reference else None
        except ValueError as exc:
            ap.error(str(exc))
        task = stored.get("task")
        budget, pool = stored_budget(stored), stored_pool(stored)
        if reference:
            ref_runs, other, other_rates = reference
            differ = [k for k in ("task", "eval_every", "heldout") if other.get(k) != stored.get(k)]
            differ += ["budget"] * (stored_budget(other) != budget)
            if differ:
                ap.error(f"--reference {args.reference[0]}: {', '.join(differ)} differs from --from-json's runs; "
                         "a reference differs in its training pool only")
            ref_seeds = ", ".join(f"{name} {len(runs)}" for name, runs in ref_runs.items())
            reference = (f"{setting(task, stored_pool(other), other.get('heldout'))}, seeds per strategy: {ref_seeds}; "
                         f"lr {other_rates or 'from the config'}", ref_runs)
        args.png = args.png or pooled_curves_path()
        seeds = ", ".join(f"{name} {len(runs)}" for name, runs in results.items())
        report(args, results, budget, setting(task, pool, stored.get("heldout")), f"pooled from {len(args.from_json)} "
               f"files, seeds per strategy: {seeds}; budget {budget:,} rollouts, evaluated every "
               f"{stored.get('eval_every')} rollouts", f"lr {rates or 'from the config'}", reference)
        print(commits_line(results))
        print(machines_line(results))
        if reference:
            print("reference runs' " + commits_line(reference[1]))
            print("reference runs' " + machines_line(reference[1]))
        return 0
    args.png = args.png or curves_path(args.task, args.mode)
    quiet_console()
    seeds, budget, mode_pool, mode_strategies = MODES[args.mode]
    if args.task:
        seeds, budget, mode_strategies = REAL["seeds"], REAL["budget"], REAL["strategies"]
    seeds, budget = args.seeds or seeds, args.budget or budget
    strategies = args.strategies or mode_strategies
    if args.picks:
        strategies = with_picks(ap, args)
    args.set = [*(item for item in BASELINE_SETS if override_scope(item)[0] in strategies), *args.set]
    if args.task:
        pool = args.pool or str(REAL["pool"])
        if not pool.isdigit() or not 1 <= int(pool) <= TRAIN:
            ap.error(f"--pool {pool}: with --task, a number of training problems from 1 to {TRAIN}")
        base = SETTINGS + real_task_base(args.task, int(pool))
        args.eval_every = args.eval_every if "--eval-every" in (argv or sys.argv) else REAL["eval_every"]
    else:
        pool = args.pool or mode_pool
        base = SETTINGS + [f"task.heldout_per_digit={args.heldout}", f"task.train_per_digit={pool}"]
    for item in args.set:
        scope = override_scope(item)[0]
        if scope not in (None, *STRATEGIES):
            ap.error(f"--set {item}: not a strategy before the ':' (one of {', '.join(STRATEGIES)})")
        if scope not in (None, *strategies):
            ap.error(f"--set {item}: {scope} is not among this run's strategies ({' '.join(strategies)}), so no run "
                     f"would use it; add it to --strategies or drop the item")
    try:
        lrs = learning_rates(args.task, args.lr, args.mode)
        extra = strategy_extras(args, strategies, lrs)  # as run_all gives them to each run
        # each strategy's settings, checked before any run starts, as its runs compose them
        configs = {name: load_config(overrides=strategy_settings(name, base, extra[name])) for name in strategies}
    except ValueError as exc:
        ap.error(str(exc))
    scoring = [name for name in strategies if name in LIKELIHOOD]
    charge = max((len(train_problems(configs[name].task)) for name in scoring), default=0)
    if charge >= budget:
        ap.error(f"--budget {budget}: {', '.join(scoring)} first score the {charge:,} training problems, charged as "
                 f"{charge:,} rollouts, which leaves nothing to train on; raise --budget above {charge:,} or shrink --pool")
    results = run_all(args, base, strategies, seeds, budget, lrs)
    report(args, results, budget, setting(args.task, pool, args.heldout), f"{seeds} seeds x {len(results)} strategies, "
           f"budget {budget:,} rollouts, evaluated every {args.eval_every} rollouts",
           f"lr {({n: lrs[n] for n in results if n in lrs}) or 'from the config'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
