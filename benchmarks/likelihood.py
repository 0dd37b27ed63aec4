"""`prl bench likelihood`: does the answer-likelihood score rank problems as sampling does,
and better than the task's difficulty label?

The groups `prl data likelihood` writes (prl/tasks/likelihood.py) are only as good as the score's
ranking. On the training pool `prl bench learning` uses (the built-in task, or ``--task
chain_sum`` on SmolLM2-135M-Instruct), every problem is scored once with the starting policy and
sampled ``--samples`` times at the run's settings, rewarded by the run's reward function.
Printed side by side, against the sampled success rate: the rank correlation (Spearman) of the
score, of its bins and of the difficulty label's groups (the baseline: the column the group prior
uses), each group standing at its own mean rate, as the group prior learns it; how the
sampled rate varies across the score's bins (beside each bin's mean exp(score), the rate the
group prior starts it at with ``score_start``) and across the label's groups; the share of problems
no sample solved found in the score's lower half of bins; and the cost, the scoring pass's seconds
against sampling one completion per problem.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks.common import count, quiet_console, write_json

SAMPLING_CHUNK = 64  # problems per generate call


def spearman(a, b) -> float:
    """Rank correlation, ties given their mean rank."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # mean rank of ties
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1]) if ra.std() and rb.std() else float("nan")


def sampled_success(backend, problems, reward_fn, sampling, samples: int, progress=None) -> np.ndarray:
    """The share of ``samples`` completions per problem that earn a reward > 0."""
    from prl.generation import Request

    rates = []
    for lo in range(0, len(problems), SAMPLING_CHUNK):
        part = problems[lo : lo + SAMPLING_CHUNK]
        out = backend.generate([Request(backend.encode(p.prompt, p.chat), samples, sampling) for p in part])
        rates += [np.mean([reward_fn(backend.decode(c.token_ids), p.answer) > 0 for c in group]) for p, group in zip(part, out)]
        if progress:
            progress(len(rates))
    return np.asarray(rates)


def group_means(rates: np.ndarray, keys) -> np.ndarray:
    """Each problem's group's mean rate: what the group prior learns of it from first visits."""
    groups = by_group(rates, keys)
    return np.asarray([groups[str(k)]["success_mean"] for k in keys])


def by_group(rates: np.ndarray, keys, expected: np.ndarray | None = None) -> dict[str, dict]:
    """Per group, for the table: its problem count and mean sampled rate (shorter names first),
    and with ``expected`` (the rate each problem's group starts at) the group's starting rate."""
    keys = np.asarray([str(k) for k in keys])
    out = {k: {"problems": int((keys == k).sum()), "success_mean": float(rates[keys == k].mean())}
           for k in sorted(set(keys), key=lambda k: (len(k), k))}
    for k in out if expected is not None else ():
        out[k]["expected_mean"] = float(expected[keys == k].mean())
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.learning import real_task_base
    from benchmarks.learning_settings import BUILTIN_POOL, REAL

    ap = argparse.ArgumentParser(prog="prl bench likelihood", description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=["chain_sum"], help="the real model on this reasoning-gym task (default: the built-in task)")
    ap.add_argument("--pool", type=count, help=f"training problems: --task draws this many (default {REAL['pool']}); the "
                                               f"built-in pool is {BUILTIN_POOL}")
    ap.add_argument("--samples", type=count, default=16, help="sampled completions per problem (default 16)")
    ap.add_argument("--bins", type=count, default=8, help="quantile bins of the score (default 8, as the learning bench)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    quiet_console()

    from tqdm import tqdm

    from prl.generation import TransformersBackend
    from prl.rewards import load_reward
    from prl.tasks import train_problems
    from prl.tasks.likelihood import answer_logprobs, expected_success, quantile_bins
    from prl.schemas import Sampling
    from prl.schemas.config import load_config

    if args.task:
        base = real_task_base(args.task, args.pool or REAL["pool"])
    else:
        base = [f"task.train_per_digit={BUILTIN_POOL}"]
    cfg = load_config(overrides=base)
    problems = train_problems(cfg.task)
    backend = TransformersBackend.from_path(cfg.model.path, cfg.model.dtype)
    sampling = Sampling(cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_tokens, [])
    t0 = time.perf_counter()
    scores = answer_logprobs(backend.model, backend.tokenizer, problems, cfg.sampling.temperature)
    score_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with tqdm(total=len(problems), desc="problems sampled", unit="problem", file=sys.stderr, dynamic_ncols=True) as bar:
        rates = sampled_success(backend, problems, load_reward(cfg.producer.reward), sampling, args.samples,
                                progress=lambda n: bar.update(n - bar.n))
    sample_s = time.perf_counter() - t0
    bins = quantile_bins(scores, args.bins)
    labels = [p.group_key for p in problems]
    never = rates == 0
    lower = bins < args.bins / 2
    figures = {
        "task": args.task or "builtin", "problems": len(problems), "samples": args.samples,
        "spearman_score": spearman(scores, rates),
        "spearman_score_bins": spearman(group_means(rates, bins), rates),
        "spearman_label": spearman(group_means(rates, labels), rates),
        "never_solved_share": float(never.mean()),
        "never_solved_in_lower_half_of_bins": float((never & lower).sum() / max(1, never.sum())),
        "with_signal_share": float(((rates > 0) & (rates < 1)).mean()),
        "by_bin": by_group(rates, bins, expected_success(scores, bins, args.bins)[bins]), "by_label": by_group(rates, labels),
        "score_seconds": score_s, "sampling_seconds_per_completion_per_problem": sample_s / args.samples,
    }
    print(f"{figures['task']}: {len(problems)} training problems, {args.samples} samples each at temperature "
          f"{sampling.temperature}, {sampling.max_tokens} tokens; never solved {figures['never_solved_share']:.2f}, "
          f"with a signal {figures['with_signal_share']:.2f}")
    print(f"{'rank correlation with sampled success':<52}{'':>3}")
    print(f"{'answer-likelihood score (no label)':<52}{figures['spearman_score']:>6.2f}")
    print(f"{f'its {args.bins} bins, each at its mean rate (no label)':<52}{figures['spearman_score_bins']:>6.2f}")
    print(f"{'the difficulty label, each group at its mean rate':<52}{figures['spearman_label']:>6.2f}")
    print("sampled success by score bin (0 = least likely), beside the mean exp(score) the bin starts at: " + ", ".join(
        f"{k}: {v['success_mean']:.2f} / {v['expected_mean']:.2f} ({v['problems']})" for k, v in figures["by_bin"].items()))
    print("sampled success by label: " + ", ".join(
        f"{k}: {v['success_mean']:.2f} ({v['problems']})" for k, v in figures["by_label"].items()))
    print(f"never-solved problems in the score's lower half of bins: {figures['never_solved_in_lower_half_of_bins']:.2f}")
    print(f"cost: scoring pass {score_s:.1f} s for {len(problems)} problems; sampling one completion per problem "
          f"{sample_s / args.samples:.1f} s")
    write_json(args, **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
