"""Runs stored by earlier `prl bench learning --json` invocations: pooled into one set
(``--from-json``, ``--reference``: only runs of the same settings pool, each seed once), and every
setting tried on a tuning set ranked by area with the tuning rule's pick (``--tuning``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.learning_figures import area_under_curve, smoothed
from benchmarks.learning_settings import (ADOPT_MARGIN, BASELINE_SETS, BUILTIN_POOL, MODES, PICKS, REAL, STRATEGIES,
                                          effective_overrides, learning_rates, named_strategy, pick_args,
                                          recorded_overrides, strategy_overrides, updates_per_batch)

POOLED_SETTINGS = ("mode", "task", "budget", "eval_every", "heldout", "pool")  # must agree to pool runs (and each
# strategy's learning rate, steps per batch and --set items, which each run records)


def file_strategies(item: str) -> tuple[str, list[str] | None]:
    """``PATH:STRATEGY,STRATEGY``: (PATH, those strategies); anything else: (the item, None)."""
    path, _, names = item.rpartition(":")
    picked = names.split(",")
    return (path, picked) if path and all(name in STRATEGIES for name in picked) else (item, None)


def pooled_runs(paths: list[str], smooth: int, only: list[str] | None = None, flag: str = "--from-json",
                seeds: range | None = None) -> tuple[dict[str, list[dict]], dict, dict[str, float]]:
    """The runs stored by earlier ``--json`` invocations as one set (strategies in the
    benchmark's order, or ``only``'s; each seed of a strategy once, each run with its file's commit),
    smoothed with ``smooth``; the first file's arguments; and each pooled strategy's learning
    rate. ``only``: pool these strategies' runs and skip the others; ``seeds``: these seeds'
    runs alone (to set a new run of some seeds against the same seeds of stored ones). Raises
    ValueError, naming the file, for a file that is not this benchmark's, a setting, a strategy's learning rate,
    steps per batch or --set items that differ between files, or a seed stored twice. Strategies
    may differ from each other in all three (each is reported with its own). ``flag``: the option
    the paths came with, named in those errors."""
    results: dict[str, list[dict]] = {}
    seen: set[tuple[str, int]] = set()
    first: dict | None = None
    rates: dict[str, float | None] = {}
    updates: dict[str, int] = {}
    overrides: dict[str, list[str]] = {}
    stored_names: set[str] = set()
    for item in paths:
        path, picked = file_strategies(item)
        try:
            with open(path) as f:
                data = json.load(f)
            stored, runs = data["args"], data["runs"]
            commit, made_on = commit_label(data.get("code")), machine_label(data.get("machine"))
            first = first or stored
            for key in POOLED_SETTINGS:
                if stored.get(key) != first.get(key):
                    raise ValueError(f"{key} is {stored.get(key)!r} there and {first.get(key)!r} in {paths[0]}: "
                                     "only runs of the same settings pool")
            file_rates = learning_rates(stored.get("task"), stored.get("lr") or [], stored.get("mode", "default"))
            for name, stored_runs in runs.items():
                if name not in STRATEGIES:
                    raise ValueError(f"unknown strategy {name!r}")
                if picked and name not in picked:
                    continue
                stored_names.add(name)
                if only and name not in only:
                    continue  # not asked for: it need not agree with the other files' runs of it
                for run in stored_runs:  # runs record their rate (older files: from the file's arguments)
                    rate = run.get("lr", file_rates.get(name))  # None: the config's
                    if rates.setdefault(name, rate) != rate:
                        raise ValueError(f"{name} was trained at lr {rate or 'from the config'} there and at "
                                         f"{rates[name] or 'the config'} in an earlier file: only runs of the same settings pool")
                    mu = run.get("updates", updates_per_batch(stored.get("set") or []))  # older files: their --set
                    if updates.setdefault(name, mu) != mu:
                        raise ValueError(f"{name} was trained at {mu} optimizer steps per batch there and at "
                                         f"{updates[name]} in an earlier file: only runs of the same settings pool")
                    items = run.get("set", recorded_overrides(stored.get("set") or [], name))  # older files: their --set
                    items = effective_overrides(items)  # as they acted: older files kept overridden items too
                    if overrides.setdefault(name, items) != items:
                        raise ValueError(f"{name} was trained with --set {' '.join(items) or 'nothing'} there and with "
                                         f"{' '.join(overrides[name]) or 'nothing'} in an earlier file: only runs of the "
                                         "same settings pool")
                for i, run in enumerate(stored_runs):
                    seed = run.get("seed", stored["first_seed"] + i)  # runs are stored seed-major from first_seed
                    if seeds is not None and seed not in seeds:
                        continue
                    if (name, seed) in seen:
                        raise ValueError(f"{name} seed {seed} is also in an earlier file")
                    seen.add((name, seed))
                    curve = smoothed([a for _, a in run["curve"]], smooth)
                    results.setdefault(name, []).append({  # a pooled file's runs keep the commit and machine they name
                        **run, "seed": seed, "commit": run.get("commit", commit), "machine": run.get("machine", made_on),
                        "smoothed": curve, "final": curve[-1], "updates": updates[name], "set": overrides[name]})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = (exc if isinstance(exc, ValueError) else f"cannot read it ({exc.strerror or exc})" if isinstance(exc, OSError)
                      else f"not a `prl bench learning --json` file ({type(exc).__name__}: {exc})")
            raise ValueError(f"{flag} {item}: {reason}") from None
    missing = [name for name in only or [] if name not in results]
    if missing:
        raise ValueError(f"--strategies {' '.join(missing)}: not in the stored runs "
                         f"({', '.join(name for name in STRATEGIES if name in stored_names)})")
    order = [name for name in (only or STRATEGIES) if name in results]  # --strategies: in that order
    return {name: results[name] for name in order}, first or {}, {n: rates[n] for n in order if rates[n] is not None}


def stored_budget(stored: dict) -> int:
    """The rollout budget of a stored file's runs (its arguments; unset: its mode's or the real task's)."""
    return stored.get("budget") or (REAL["budget"] if stored.get("task") else MODES[stored.get("mode", "default")][1])


def stored_pool(stored: dict) -> str | None:
    """The training pool of a stored file's runs (unset: its mode's; with a task, the default draw)."""
    return stored.get("pool") or (None if stored.get("task") else MODES[stored.get("mode", "default")][2])


def commit_label(code: dict | None) -> str:
    """A stored file's code as a short commit ("+" when the work tree differed from it),
    "unrecorded" for files written before benchmarks recorded it."""
    if not code or not code.get("commit"):
        return "unrecorded"
    return code["commit"][:7] + ("+" if code.get("dirty") else "")


def machine_label(machine: dict | None) -> str:
    """A stored file's machine (``benchmarks.common.machine``) as one short string: the CPU, its
    cores and, where recorded, torch's vector capability and whether bf16 is native; "unrecorded"
    for files written before benchmarks recorded it."""
    if not machine:
        return "unrecorded"
    parts = [str(machine.get("cpu", "?")), f"{machine.get('cores', '?')} cores"]
    if machine.get("torch_cpu_capability"):
        parts.append(str(machine["torch_cpu_capability"]))
    if "native_bf16" in machine:
        parts.append("native bf16" if machine["native_bf16"] else "bf16 emulated")
    return " ".join(parts[:1]) + " (" + ", ".join(parts[1:]) + ")"


def provenance_line(results: dict[str, list[dict]], field: str, what: str, plural: str) -> str:
    """How many of the pooled runs came from each value of ``field`` (their commit or their
    machine): runs of different code may differ in more than their seeds, and runs of different
    machines in the pipeline's off-policy lags (which policy made what depends on timing); the
    reader should know."""
    counts: dict[str, int] = {}
    for runs in results.values():
        for run in runs:
            counts[run[field]] = counts.get(run[field], 0) + 1
    text = ", ".join(f"{c} ({n} runs)" for c, n in counts.items())
    return f"{what}: {text}" + (f"; runs of different {plural} pooled" if len(counts) > 1 else "")


def commits_line(results: dict[str, list[dict]]) -> str:
    """Which code made the pooled runs (``provenance_line``)."""
    return provenance_line(results, "commit", "code", "commits")


def machines_line(results: dict[str, list[dict]]) -> str:
    """Which machines made the pooled runs (``provenance_line``)."""
    return provenance_line(results, "machine", "machine", "machines")


# --tuning: the tuning rule by the command. A strategy's settings compare only when tuned on the same
# task, pool, budget, evaluation and seeds (the mode only sets those; each run records its rate and steps).

def seed_span(seeds: list[int]) -> str:
    """Seeds as "100-109" when they run without a gap, else listed."""
    seeds = sorted(seeds)
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return ",".join(map(str, seeds))


def pool_key(pool) -> str:
    """A training pool as one string whichever way it was given (the mode's list, or --pool's
    text with or without spaces), so runs on the same pool compare."""
    if pool is None:
        return "the task's default draw"
    try:
        pool = json.loads(pool) if isinstance(pool, str) else pool
    except ValueError:
        return str(pool)
    return json.dumps(pool, separators=(", ", ": "))


def tried_settings(paths: list[str], smooth: int) -> dict[tuple, list[dict]]:
    """Each (strategy, what it was tuned on) with the settings tried there: rate, steps per
    batch, --set items, median area over its seeds, and the file; a run listed under the strategy
    it ran as (``named_strategy``). Raises ValueError naming a file that is not this benchmark's
    (as ``--from-json`` does)."""
    tried: dict[tuple, list[dict]] = {}
    for path in paths:
        results, stored, rates = pooled_runs([path], smooth, flag="--tuning")
        budget = stored_budget(stored)
        for name, runs in results.items():
            strategy, items = named_strategy(name, runs[0]["set"])
            where = (strategy, stored.get("task") or "built-in", pool_key(stored_pool(stored)), budget,
                     stored.get("eval_every"), stored.get("heldout"), seed_span([r["seed"] for r in runs]))
            tried.setdefault(where, []).append({
                "lr": rates.get(name), "updates": runs[0]["updates"], "set": items, "file": Path(path).name,
                "code": runs[0]["commit"], "auc": statistics.median(area_under_curve(r, budget) for r in runs)})
    for rows in tried.values():
        rows.sort(key=lambda row: -row["auc"])
    return tried


def reported_setting(name: str) -> tuple[float | None, int, frozenset[str]] | None:
    """A reported row's setting as a ``--picks`` run of it records it (rate, steps per batch,
    --set items; read through the same functions a run's are); None without a reported row."""
    if name not in PICKS:
        return None
    rate, items = pick_args(name)
    items = [*BASELINE_SETS, *items]  # as main composes a --picks run's --set
    return (learning_rates(None, rate)[name], updates_per_batch(strategy_overrides(items, name)),
            frozenset(recorded_overrides(items, name)))


def tuned_setting(row: dict) -> tuple[float | None, int, frozenset[str]]:
    """A tuned setting as ``reported_setting`` gives one: rate, steps per batch, --set items."""
    return row["lr"], row["updates"], frozenset(row["set"])


def rule_pick(rows: list[dict], reported: tuple | None) -> int:
    """The tuning rule over ``rows`` (settings tried on one tuning set, highest area first): the
    index of the reported setting when it is among them and none is more than ADOPT_MARGIN above
    it by area, else of the highest. A setting drawn more than once counts at its highest draw,
    the reported one as any other."""
    at = next((i for i, row in enumerate(rows) if tuned_setting(row) == reported), None)
    return 0 if at is None or rows[0]["auc"] - rows[at]["auc"] > ADOPT_MARGIN else at


def ruled_sets(tried: dict[tuple, list[dict]]):
    """Each tuning set in the order listed, as (what it was tuned on, its settings, the reported
    row's setting where that row was reported (the built-in task's pool at the default mode's
    budget; else None), the index of the rule's pick): what the list and its figure both show."""
    for where, rows in sorted(tried.items(), key=lambda kv: kv[0][:2]):
        name, task, pool, budget = where[:4]
        as_reported = (task, pool, budget) == ("built-in", pool_key(BUILTIN_POOL), MODES["default"][1])
        reported = reported_setting(name) if as_reported else None
        yield where, rows, reported, rule_pick(rows, reported)


def picks_text(tried: dict[tuple, list[dict]]) -> list[str]:
    """Per strategy and tuning set: what it was tuned on, then one line per setting (area, rate,
    steps, the code that ran it, file), highest area first: the rule's pick (``rule_pick``) with
    its --set items, every other setting with the items it adds to the pick's (+) and lacks (-);
    "~" marks a setting within ADOPT_MARGIN of the pick, "(reported)" the reported row's setting."""
    lines = []
    for (name, task, pool, budget, every, heldout, seeds), rows, reported, at in ruled_sets(tried):
        rule = "the highest" if reported != tuned_setting(rows[at]) else (
            f"the reported one, none more than {ADOPT_MARGIN} above it" if at else "the reported one")
        lines.append(f"{name}: {task}, pool {pool}, {budget:,} rollouts, evaluated every {every}, "
                     f"held-out {heldout}, seeds {seeds}; {len(rows)} setting(s), highest area first; pick: {rule}")
        pick = rows[at]["set"]
        for i, row in enumerate(rows):
            rate = "config" if row["lr"] is None else f"{row['lr']:g}"
            items = " ".join(pick) if i == at else " ".join(
                [f"+{item}" for item in row["set"] if item not in pick] + [f"-{item}" for item in pick if item not in row["set"]])
            mark = "pick" if i == at else "   ~" if abs(row["auc"] - rows[at]["auc"]) <= ADOPT_MARGIN else ""
            tag = " (reported)" if reported == tuned_setting(row) else ""
            lines.append(f"  {mark:<4} AUC {row['auc']:.4f}  lr {rate:<8} steps {row['updates']}  code {row['code']:<10}  "
                         f"[{row['file']}]{tag}  {items or ('--set none' if i == at else 'the same --set')}")
    return lines


def tuning_strips(tried: dict[tuple, list[dict]]) -> list[dict]:
    """What ``tuning_png`` draws, one strip per tuning set (``ruled_sets``): its label (strategy,
    task unless built-in, pool, seeds, settings tried; the list prints the budget and evaluation),
    every setting's area, the rule's pick's area and the reported setting's (None when the reported
    setting was not tried there)."""
    strips = []
    for (name, task, pool, _, _, _, seeds), rows, reported, at in ruled_sets(tried):
        label = f"{name}{'' if task == 'built-in' else ', ' + task}, pool {pool.replace(', ', ',')}, seeds {seeds}, {len(rows)} tried"
        strips.append({"label": label, "areas": [row["auc"] for row in rows], "pick": rows[at]["auc"],
                       "reported": next((row["auc"] for row in rows if tuned_setting(row) == reported), None)})
    return strips


def tuning_png(strips: list[dict], out: str) -> None:
    """Each strip's settings as dots along the area, the pick a diamond inside a band of
    ADOPT_MARGIN either side (a setting there could not replace it), the reported setting ringed."""
    from prl.plots import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.32 * len(strips)))
    for y, strip in enumerate(reversed(strips)):
        ax.add_patch(plt.Rectangle((strip["pick"] - ADOPT_MARGIN, y - 0.35), 2 * ADOPT_MARGIN, 0.7, color="C0", alpha=0.15, lw=0))
        ax.plot(strip["areas"], [y] * len(strip["areas"]), "o", color="grey", ms=4, alpha=0.7)
        ax.plot([strip["pick"]], [y], "D", color="C0", ms=6)
        if strip["reported"] is not None:
            ax.plot([strip["reported"]], [y], "o", mfc="none", mec="C3", ms=10, mew=1.4)
    ax.set_yticks(range(len(strips)), [strip["label"] for strip in reversed(strips)], fontsize=7)
    ax.set_ylim(-0.6, len(strips) - 0.4)
    ax.set_xlabel("median area under the accuracy-vs-rollouts curve over the tuning seeds")
    ax.set_title(f"prl bench learning --tuning: per strategy, pool and tuning seeds, each setting tried (dot),\n"
                 f"the rule's pick (diamond), its margin of {ADOPT_MARGIN} either side (band), the reported setting (ring)",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    save_png(fig, out, 120)
