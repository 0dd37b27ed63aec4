"""The figures `prl bench learning` reports, from runs (each a curve of held-out accuracy against
rollouts generated, smoothed, with its final value and counters): rollouts to a target, area
under the curve, medians over seeds, their 90% bootstrap intervals, the goal lines and every
strategy set against the baselines and the reference runs, as numbers and as text."""

from __future__ import annotations

import math
import statistics

import numpy as np

from benchmarks.learning_settings import STRATEGIES

NAME = max(map(len, STRATEGIES)) + 1  # the strategy column of the printed tables: the longest name and a space




def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i + 1 - window) : i + 1]
        out.append(sum(part) / len(part))
    return out


def censored_median(values: list[float | None]) -> float | None:
    """Median where None means "not within the budget" (above every number); None if the
    median itself is not within it."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    n = len(ordered)
    mid = ordered[(n - 1) // 2], ordered[n // 2]
    return None if None in mid else (mid[0] + mid[1]) / 2


def crossing(run: dict, target: float) -> float | None:
    """Rollouts at the first evaluation whose smoothed accuracy is at or above ``target``."""
    for (x, _), acc in zip(run["curve"], run["smoothed"]):
        if acc >= target:
            return x
    return None


def area_under_curve(run: dict, budget: int) -> float:
    """Mean smoothed held-out accuracy over generation 0..budget (trapezoids; the curve held
    at its last value to the budget): one number for "how good, how early"."""
    xs = [x for x, _ in run["curve"]] + [budget]
    ys = run["smoothed"] + [run["smoothed"][-1]]
    keep = [(x, y) for x, y in zip(xs, ys) if x <= budget]
    xs, ys = zip(*keep)
    return float(np.trapezoid(ys, xs) / max(1, xs[-1] - xs[0]))


def table(results: dict[str, list[dict]], targets: list[float], budget: int) -> dict:
    out = {}
    for name, runs in results.items():
        finals = sorted(r["final"] for r in runs)
        out[name] = {
            **{f"rollouts_to_{t}": censored_median([crossing(r, t) for r in runs]) for t in targets},
            **{f"reached_{t}": sum(crossing(r, t) is not None for r in runs) for t in targets},
            "final_min": finals[0], "final_median": statistics.median(finals), "final_max": finals[-1],
            "auc_median": statistics.median(area_under_curve(r, budget) for r in runs),
            "pool_median": pool_median(runs),
            "problems_trained": (statistics.median(r["problems_trained"] for r in runs)
                                 if all(r.get("problems_trained") is not None for r in runs) else None),
            **{k: statistics.mean(r[k] for r in runs) for k in (
                "signal_share", "zero_signal_rollouts", "retest_share", "never_dispatched_share", "steps", "seconds",
                "completion_tokens_trained", "completion_tokens_stale", "replay_share", "clip_fresh")},
            **{k: mean_where_measured(runs, k) for k in ("clip_replay", "grad_norm_median", "grad_clip_share")},
        }
    return out


def mean_where_measured(runs: list[dict], key: str) -> float | None:
    """Mean of ``key`` over the runs that have it (None if none do: no replay, or runs stored
    before the benchmark recorded it)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def pool_median(runs: list[dict], key: str = "accuracy") -> float | None:
    """Median final accuracy on the training pool over the runs that measured it (None if
    none did: runs stored before the benchmark measured it)."""
    values = [r["pool_end"][key] for r in runs if r.get("pool_end") and key in r["pool_end"]]
    return statistics.median(values) if values else None


def difficulty_cells(runs: list[dict]) -> str:
    """Each difficulty's held-out accuracy at the last evaluation beside the training pool's at
    the end, medians over seeds ("-" where a run did not measure the pool)."""
    cells = []
    for key in runs[0].get("by_difficulty", {}):
        held = statistics.median(r["by_difficulty"][key][-1] for r in runs)
        pool = pool_median(runs, f"accuracy_{key}")
        cells.append(f"{key} {held:.2f} / {'-' if pool is None else format(pool, '.2f')}")
    return "   ".join(cells) or "-"


def difficulty_finals(runs: list[dict], smooth: int) -> dict[str, list[float]]:
    """Each difficulty's final held-out accuracy per run: the trailing mean of its last ``smooth``
    evaluations, as a run's ``final`` is of the whole metric (the mean of these, one per
    difficulty). Only the difficulties every run measured."""
    keys = [k for k in runs[0].get("by_difficulty", {}) if all(k in r.get("by_difficulty", {}) for r in runs)]
    return {k: [smoothed(r["by_difficulty"][k], smooth)[-1] for r in runs] for k in keys}


def difficulty_differences(runs: list[dict], other: list[dict], smooth: int) -> str:
    """Where a final lead lies: per difficulty, the median final held-out accuracy of ``runs``
    over ``other``'s on that difficulty's problems alone, in points of that accuracy (the metric
    is the mean over difficulties, so with four each counts a quarter), with its 90% interval over
    seeds. "-" where the two share no difficulty."""
    mine, theirs = difficulty_finals(runs, smooth), difficulty_finals(other, smooth)
    cells = [f"{k} {final_difference(mine[k], theirs[k]):+.1f} ({interval(final_difference, mine[k], theirs[k], '+.1f')})"
             for k in mine if k in theirs]
    return "; ".join(cells) or "-"


def bootstrap_interval(statistic, a: list, b: list, level: float = 0.9, draws: int = 2_000, seed: int = 0) -> tuple[float, float]:
    """The ``level`` interval of ``statistic(a, b)`` over seeds: both samples redrawn with
    replacement ``draws`` times (a percentile bootstrap; draws where it is undefined, NaN, are
    left out). How far the figure could move with other seeds of the same size."""
    rng = np.random.default_rng(seed)
    values = [statistic([a[i] for i in rng.integers(len(a), size=len(a))], [b[i] for i in rng.integers(len(b), size=len(b))])
              for _ in range(draws)]
    values = np.asarray([v for v in values if not math.isnan(v)])
    if not len(values):
        return math.nan, math.nan
    tail = (1 - level) / 2
    return tuple(float(q) for q in np.quantile(values, [tail, 1 - tail], method="inverted_cdf"))


def rollouts_ratio(a: list[float | None], b: list[float | None]) -> float:
    """Median rollouts to a target of a over b's, a miss counting as beyond the budget (inf);
    NaN when neither median is reached."""
    ma, mb = (math.inf if m is None else m for m in (censored_median(a), censored_median(b)))
    return math.nan if math.isinf(ma) and math.isinf(mb) else ma / mb


def ratio_text(value: float, fmt: str, names: tuple = (None, None), share: str = "") -> str:
    """A ratio of rollouts as text. For ``names`` (the numerator's strategy, the denominator's),
    0 means the denominator's median was beyond the budget and inf the numerator's (``share``: in
    how many of the bootstrap's redraws): said so, since "0.00" would read as a measured ratio."""
    if math.isnan(value):
        return "-"
    if value == 0 and names[1] is not None:
        return f"0 ({names[1]}'s median beyond the budget{share})"
    if math.isinf(value) and names[0] is not None:
        return f"inf ({names[0]}'s median beyond the budget{share})"
    return format(value, fmt)


def interval_end(value: float, fmt: str, names: tuple = (None, None)) -> str:
    """One end of a bootstrap interval as text (``ratio_text``; 0 or inf there means a median was
    beyond the budget in at least the tail's share of the redraws: 5% for the 90% interval)."""
    return ratio_text(value, fmt, names, " in 5%+ of redraws")


def median_difference(a: list[float], b: list[float]) -> float:
    return statistics.median(a) - statistics.median(b)


GOAL_PAIRS = (("priority_flat", "uniform", "<= 0.7"), ("priority_flat_screen", "uniform", "<= 0.7"),
              ("uniform_drop", "uniform", "<= 0.7"),
              ("priority_pooled", "uniform", "<= 0.7"), ("priority_likelihood", "uniform", "<= 0.7"),
              ("full_likelihood", "dapo_filter", "<= 0.6"), ("priority_shuffled", "uniform", "<= 1.0"),
              ("full", "dapo_filter", "<= 0.6"))


def interval(statistic, a: list, b: list, fmt: str, names: tuple = (None, None)) -> str:
    """"LO to HI", the 90% interval over seeds of ``statistic(a, b)``; ``names`` (a's, b's) for a
    ratio of rollouts, whose ends may come from a median beyond the budget (``interval_end``)."""
    lo, hi = bootstrap_interval(statistic, a, b)
    return f"{interval_end(lo, fmt, names)} to {interval_end(hi, fmt, names)}"


def final_difference(a: list[float], b: list[float]) -> float:
    """Median final accuracy of a over b's, in points."""
    return 100 * median_difference(a, b)


def goals(t: dict, targets: list[float], results: dict[str, list[dict]] | None = None) -> list[str]:
    """The issue's goals, each as a line with the figure: label-free priority against uniform,
    shuffled labels against uniform, the full method against filtered uniform (DAPO). With the
    runs (``results``), each figure's 90% bootstrap interval over seeds follows it."""
    lines = []
    for target in targets:
        key = f"rollouts_to_{target}"
        for a, b, goal in GOAL_PAIRS:
            if a not in t or b not in t:
                continue
            r = None if not (t[a][key] and t[b][key]) else t[a][key] / t[b][key]
            extra = ""
            if results:
                crossings = ([crossing(run, target) for run in results[n]] for n in (a, b))
                extra = f", 90% over seeds {interval(rollouts_ratio, *crossings, '.2f', (a, b))}"
            lines.append(f"target {target}: {a} / {b} rollouts {'-' if r is None else f'{r:.2f}'}{extra} (goal {goal})")
    for full in ("full", "full_likelihood"):
        if full not in t or "dapo_filter" not in t:
            continue
        diff = 100 * (t[full]["final_median"] - t["dapo_filter"]["final_median"])
        extra = ""
        if results:
            finals = ([run["final"] for run in results[n]] for n in (full, "dapo_filter"))
            extra = f", 90% over seeds {interval(final_difference, *finals, '+.1f')}"
        lines.append(f"final accuracy, {full} - dapo_filter (medians): {diff:+.1f} points{extra} (goal >= +3)")
    return lines


BASELINES = ("uniform", "dapo_filter")


def times(ratio: float, name: str, baseline: str) -> str:
    """"0.82x uniform", or why there is no such multiple (a median beyond the budget)."""
    if 0 < ratio < math.inf:
        return f"{ratio:.2f}x {baseline}"
    return f"{ratio_text(ratio, '.2f', (name, baseline))} against {baseline}"


def against_baselines(results: dict[str, list[dict]], target: float, others: dict[str, list[dict]] | None = None) -> list[str]:
    """Every other strategy against both baselines, one line each: its median rollouts to
    ``target`` as a multiple of uniform's and of DAPO's, and its median final accuracy over DAPO's,
    each with its 90% interval over seeds: for the strategies the goal lines name these repeat
    some of their figures, for the others they are the only ones printed. ``others``: set these
    runs against ``results``' baselines instead (``--reference`` runs, of another training pool).
    Nothing without both baselines among ``results``."""
    if not all(b in results for b in BASELINES):
        return []
    if others is None:
        others = {name: runs for name, runs in results.items() if name not in BASELINES}
    crossings = {name: [crossing(run, target) for run in results[name]] for name in BASELINES}
    finals = {name: [run["final"] for run in results[name]] for name in BASELINES}
    lines = []
    for name, runs in others.items():
        reached, final = [crossing(run, target) for run in runs], [run["final"] for run in runs]
        ratios = "; ".join(f"{times(rollouts_ratio(reached, crossings[b]), name, b)} "
                           f"({interval(rollouts_ratio, reached, crossings[b], '.2f', (name, b))})" for b in BASELINES)
        over = final_difference(final, finals["dapo_filter"])
        lines.append(f"  {name:<{NAME}}to {target} {ratios}; final {over:+.1f} points over dapo_filter "
                     f"({interval(final_difference, final, finals['dapo_filter'], '+.1f')})")
    return lines


def against_reference(results: dict[str, list[dict]], reference: dict[str, list[dict]], targets: list[float],
                      budget: int) -> list[str]:
    """Every strategy that is not a baseline against each reference strategy (e.g. the ceiling),
    and a baseline against the reference runs of its own strategy (e.g. its pick), one line per
    pair: its median rollouts to each target as a multiple of the reference's, its median final
    accuracy and area under the curve over the reference's, each with its 90% interval over
    seeds. How far a strategy stays from what the reference shows is possible."""
    def figures(runs):  # per run: rollouts to each target, final accuracy, area
        return ({t: [crossing(r, t) for r in runs] for t in targets}, [r["final"] for r in runs],
                [area_under_curve(r, budget) for r in runs])

    def compared(name, ref_name):
        return name not in BASELINES or name == ref_name

    strategies = {name: figures(runs) for name, runs in results.items()
                  if any(compared(name, ref_name) for ref_name in reference)}
    lines = []
    for ref_name, ref_runs in reference.items():
        ref_reached, ref_final, ref_area = figures(ref_runs)
        for name, (reached, final, area) in strategies.items():
            if not compared(name, ref_name):
                continue
            cells = []
            for t in targets:
                ratio, names = rollouts_ratio(reached[t], ref_reached[t]), (name, ref_name)
                cells.append(f"to {t} {ratio_text(ratio, '.2f', names)}{'x' if 0 < ratio < math.inf else ''} "
                             f"({interval(rollouts_ratio, reached[t], ref_reached[t], '.2f', names)})")
            cells.append(f"final {final_difference(final, ref_final):+.1f} points "
                         f"({interval(final_difference, final, ref_final, '+.1f')})")
            cells.append(f"AUC {median_difference(area, ref_area):+.4f} "
                         f"({interval(median_difference, area, ref_area, '+.4f')})")
            lines.append(f"  {name:<{NAME}}against reference {ref_name}: " + "; ".join(cells))
    return lines


def print_table(t: dict, targets: list[float], budget: int, header: str) -> None:
    print(header)
    heads = "".join(f"{'to ' + str(x):>10}" for x in targets)
    print(f"{'strategy':<{NAME}}{heads}{'final min/med/max':>20}{'pool':>7}{'AUC':>7}{'signal':>8}{'zero-sig':>9}{'retest':>8}"
          f"{'unseen':>8}{'tok tr/stale':>13}{'batches':>8}{'trained':>8}")  # learner versions; x mu optimizer steps
    for name, r in t.items():
        cells = "".join(f"{'>' + format(budget, ',') if r[f'rollouts_to_{x}'] is None else format(r[f'rollouts_to_{x}'], ',.0f'):>10}"
                        for x in targets)
        pool = "-" if r.get("pool_median") is None else format(r["pool_median"], ".3f")
        print(f"{name:<{NAME}}{cells}{r['final_min']:>8.3f}/{r['final_median']:.3f}/{r['final_max']:.3f}{pool:>7}{r['auc_median']:>7.3f}"
              f"{r['signal_share']:>8.3f}{r['zero_signal_rollouts']:>9,.0f}{r['retest_share']:>8.3f}"
              f"{r['never_dispatched_share']:>8.3f}{r['completion_tokens_trained']:>7.2f}/{r['completion_tokens_stale']:<5.2f}"
              f"{r['steps']:>8.0f}{'-' if r.get('problems_trained') is None else format(r['problems_trained'], '.0f'):>8}")
