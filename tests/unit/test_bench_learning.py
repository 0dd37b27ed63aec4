"""The arithmetic behind `prl bench learning`'s figures (the runs themselves are the benchmark)."""

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.learning import cores, curves_path, main, pool_accuracy, pool_rows
from benchmarks.learning_figures import (against_baselines, against_reference, area_under_curve, bootstrap_interval,
                                         censored_median, crossing, difficulty_cells, difficulty_differences,
                                         difficulty_finals, goals, median_difference, pool_median, rollouts_ratio, smoothed)
from benchmarks import learning_settings as settings
from benchmarks.learning_settings import STRATEGIES, effective_overrides


def test_a_seed_that_never_reaches_the_target_counts_as_beyond_the_budget():
    assert censored_median([3_000, None, 1_000]) == 3_000  # not 2,000: the miss is the largest value
    assert censored_median([None, None, 1_000]) is None  # the median itself was not reached
    assert censored_median([2_000, 4_000]) == 3_000


def test_crossing_uses_the_smoothed_curve():
    run = {"curve": [(0, 0.30), (100, 0.41), (200, 0.33), (300, 0.40)]}
    run["smoothed"] = smoothed([a for _, a in run["curve"]], 2)
    assert run["smoothed"] == pytest.approx([0.30, 0.355, 0.37, 0.365])
    assert crossing(run, 0.36) == 200  # the lone spike at 100 does not count
    assert crossing(run, 0.40) is None


def test_area_under_the_curve_is_the_mean_accuracy_over_the_budget():
    run = {"curve": [(0, 0.2), (100, 0.4)], "smoothed": [0.2, 0.4]}
    assert area_under_curve(run, 100) == pytest.approx(0.3)
    assert area_under_curve(run, 200) == pytest.approx((0.3 * 100 + 0.4 * 100) / 200)  # held at its last value


def test_goal_lines_name_each_ratio():
    t = {"uniform": {"rollouts_to_0.4": 1000, "final_median": 0.40}, "dapo_filter": {"rollouts_to_0.4": 800, "final_median": 0.41},
         "priority_flat": {"rollouts_to_0.4": 600, "final_median": 0.42}, "full": {"rollouts_to_0.4": None, "final_median": 0.45}}
    lines = goals(t, [0.4])
    assert lines[0] == "target 0.4: priority_flat / uniform rollouts 0.60 (goal <= 0.7)"
    assert lines[1] == "target 0.4: full / dapo_filter rollouts - (goal <= 0.6)"
    assert lines[-1] == "final accuracy, full - dapo_filter (medians): +4.0 points (goal >= +3)"
    assert len(lines) == 3  # no line for a strategy that did not run (shuffled, pooled)


def test_rollouts_ratio_counts_a_miss_as_beyond_the_budget():
    assert rollouts_ratio([500, 700, 900], [1_000, 1_400, 1_800]) == pytest.approx(0.5)
    assert rollouts_ratio([500, None, None], [1_000, 1_400, 1_800]) == math.inf  # a's median missed
    assert rollouts_ratio([500, 600, None], [None, None, 1_000]) == 0.0
    assert math.isnan(rollouts_ratio([None, None], [None, None]))


def test_bootstrap_interval_over_seeds_brackets_the_figure_and_narrows_with_more_seeds():
    rng = np.random.default_rng(1)
    few, many = ([list(rng.normal(mu, 0.02, n)) for mu in (0.40, 0.37)] for n in (5, 80))
    lo5, hi5 = bootstrap_interval(median_difference, *few)
    lo80, hi80 = bootstrap_interval(median_difference, *many)
    assert lo5 <= median_difference(*few) <= hi5
    assert lo80 < 0.03 < hi80 and hi80 - lo80 < hi5 - lo5
    assert bootstrap_interval(rollouts_ratio, [None] * 3, [None] * 3) != bootstrap_interval(rollouts_ratio, [1, 2], [3, 4])
    assert all(math.isnan(v) for v in bootstrap_interval(rollouts_ratio, [None] * 3, [None] * 3))


def test_goal_lines_with_the_runs_give_each_figure_its_interval_over_seeds():
    def runs(crossings, finals):
        return [{"curve": [(0, 0.3), (c, 0.4)], "smoothed": [0.3, 0.4], "final": f} for c, f in zip(crossings, finals)]
    results = {"uniform": runs([1_000, 1_200, 1_400], [0.40, 0.41, 0.42]),
               "dapo_filter": runs([1_000, 1_000, 1_000], [0.40, 0.40, 0.40]),
               "priority_flat": runs([500, 600, 700], [0.40, 0.40, 0.40]), "full": runs([500, 500, 500], [0.43, 0.44, 0.45])}
    t = {n: {"rollouts_to_0.4": censored_median([crossing(r, 0.4) for r in v]), "final_median": statistics.median(r["final"] for r in v)}
         for n, v in results.items()}
    lines = goals(t, [0.4], results)
    assert lines[0].startswith("target 0.4: priority_flat / uniform rollouts 0.50, 90% over seeds ")
    lo, hi = (float(x) for x in lines[0].split("over seeds ")[1].split(" (")[0].split(" to "))
    assert 500 / 1_400 <= lo <= 0.5 <= hi <= 700 / 1_000
    assert lines[1] == "target 0.4: full / dapo_filter rollouts 0.50, 90% over seeds 0.50 to 0.50 (goal <= 0.6)"
    assert lines[2].startswith("final accuracy, full - dapo_filter (medians): +4.0 points, 90% over seeds +3.0 to +5.0")


def test_an_interval_end_from_a_median_beyond_the_budget_says_so_instead_of_printing_a_ratio():
    def runs(crossings):
        return [{"curve": [(0, 0.3)] + ([] if c is None else [(c, 0.4)]), "smoothed": [0.3] + ([] if c is None else [0.4]),
                 "final": 0.4} for c in crossings]
    results = {"dapo_filter": runs([900, 1_000, 1_100, None, None]), "full": runs([500, 500, 500, 500, 500])}
    t = {n: {"rollouts_to_0.4": censored_median([crossing(r, 0.4) for r in v]), "final_median": 0.4} for n, v in results.items()}
    line = goals(t, [0.4], results)[0]
    assert line.startswith("target 0.4: full / dapo_filter rollouts 0.45, 90% over seeds "
                           "0 (dapo_filter's median beyond the budget in 5%+ of redraws) to ")
    assert "0.00" not in line
    assert goals(t, [0.4], results)[-1].endswith("+0.0 points, 90% over seeds +0.0 to +0.0 (goal >= +3)")  # a difference of 0 is a figure


def test_every_strategy_is_set_against_both_baselines_with_its_intervals():
    def runs(crossings, finals):
        return [{"curve": [(0, 0.3), (c, 0.4)], "smoothed": [0.3, 0.4], "final": f} for c, f in zip(crossings, finals)]
    results = {"uniform": runs([1_000, 1_000, 1_000], [0.40, 0.40, 0.40]),
               "dapo_filter": runs([2_000, 2_000, 2_000], [0.41, 0.41, 0.41]),
               "priority_group": runs([500, 500, 500], [0.43, 0.43, 0.43])}
    lines = against_baselines(results, 0.4)
    assert len(lines) == 1  # not the baselines themselves
    assert lines[0].split() == ["priority_group", "to", "0.4", "0.50x", "uniform", "(0.50", "to", "0.50);", "0.25x",
                                "dapo_filter", "(0.25", "to", "0.25);", "final", "+2.0", "points", "over", "dapo_filter",
                                "(+2.0", "to", "+2.0)"]
    assert against_baselines({n: results[n] for n in ("uniform", "priority_group")}, 0.4) == []  # needs both baselines


def test_every_strategy_is_set_against_the_reference_runs_how_far_from_the_ceiling_it_stays():
    def runs(crossings, finals):
        return [{"curve": [(0, 0.3), (c, 0.4), (2_000, f)], "smoothed": [0.3, 0.4, f], "final": f}
                for c, f in zip(crossings, finals)]
    results = {"uniform": runs([1_000] * 3, [0.40] * 3), "dapo_filter": runs([1_000] * 3, [0.40] * 3),
               "priority_likelihood": runs([1_500] * 3, [0.42] * 3)}
    ceiling = {"uniform": runs([500] * 3, [0.44] * 3)}
    lines = against_reference(results, ceiling, [0.4, 0.5], 2_000)
    # the strategies against each reference strategy, a baseline against its own strategy's alone
    assert [line.split(":")[0].split()[0] for line in lines] == ["uniform", "priority_likelihood"]
    assert "to 0.4 2.00x (2.00 to 2.00)" in lines[0] and "final -4.0 points" in lines[0]
    line = lines[1]
    assert line.split(":")[0].split() == ["priority_likelihood", "against", "reference", "uniform"]
    assert "to 0.4 3.00x (3.00 to 3.00)" in line
    assert "to 0.5 -" in line  # neither reaches it: no ratio
    assert "final -2.0 points (-2.0 to -2.0)" in line
    area = area_under_curve(results["priority_likelihood"][0], 2_000) - area_under_curve(ceiling["uniform"][0], 2_000)
    assert area < 0 and f"AUC {area:+.4f}" in line


def test_runs_on_another_pool_are_shown_as_a_reference_against_the_baselines(tmp_path, capsys, monkeypatch):
    """--reference: runs of another training pool (the ceiling) are printed apart from the
    strategies and set against the --from-json runs' baselines at every target; the figure draws
    the --from-json runs, titled with their setting, and the reference runs beside them."""
    import benchmarks.learning

    titles, drawn = [], []
    monkeypatch.setattr(benchmarks.learning, "curves_png", lambda results, out, targets, title, smooth, reference:
                        (titles.append(title), drawn.append((list(results), list(reference)))))
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2, 0.3, 0.4]] * 3, "dapo_filter": [[0.1, 0.2, 0.2, 0.4]] * 3})
    ceiling = stored(tmp_path / "c.json", 0, {"uniform": [[0.1, 0.4, 0.4, 0.5]] * 3}, pool="[20,100,0,0]")
    assert main(["--from-json", a, "--reference", ceiling, "--smooth", "1", "--targets", "0.36", "0.45",
                 "--png", str(tmp_path / "c.png")]) == 0
    printed = capsys.readouterr().out
    assert "reference runs, not baselines: " in printed and "training pool [20,100,0,0]" in printed
    after = printed.split("the reference runs against the baselines above at 0.36:\n")[1].splitlines()
    assert after[0].split()[:9] == ["uniform", "to", "0.36", "0.33x", "uniform", "(0.33", "to", "0.33);", "0.33x"]
    assert "final +10.0 points over dapo_filter" in after[0]
    assert "reference runs' code: unrecorded (3 runs)" in printed
    assert len(titles) == 1 and "[20,100,0,0]" not in titles[0] and "seeds per strategy" not in titles[0]
    assert drawn == [(["uniform", "dapo_filter"], ["uniform"])]
    beyond = printed.split("the reference runs against the baselines above at 0.45:\n")[1].splitlines()[0]
    assert beyond.split(";")[0].strip() == (  # the baselines never reach 0.45: no multiple, and each end says why
        "uniform              to 0.45 0 (uniform's median beyond the budget) against uniform "
        "(0 (uniform's median beyond the budget in 5%+ of redraws) to 0 (uniform's median beyond the budget in 5%+ of redraws))")


def test_the_figure_draws_the_reference_medians_dashed_beside_the_strategies(tmp_path, monkeypatch):
    import prl.plots
    from benchmarks.learning import curves_png

    figures = []
    monkeypatch.setattr(prl.plots, "save_png", lambda fig, out, dpi: figures.append(fig))
    run = {"curve": [(0, 0.3), (1_000, 0.4)], "smoothed": [0.3, 0.4]}
    curves_png({"uniform": [run] * 3}, str(tmp_path / "c.png"), [0.36], "t", 1, {"uniform": [run] * 2})
    lines = {line.get_label(): line.get_linestyle() for line in figures[0].axes[0].get_lines()}
    assert lines["uniform (median of 3)"] == "-" and lines["uniform, reference (median of 2)"] == "--"


@pytest.mark.parametrize("argv, reason", [
    (["--reference", "{c}"], "--reference sets stored runs against the baselines of --from-json's runs: give --from-json too"),
    (["--from-json", "{a}", "--reference", "{b}"], "--reference {b}: eval_every, budget differs from --from-json's runs"),
])
def test_a_reference_that_is_not_the_same_benchmark_on_another_pool_fails_with_one_line(tmp_path, capsys, argv, reason):
    paths = {"a": stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]}),
             "b": stored(tmp_path / "b.json", 0, {"uniform": [[0.1, 0.3]]}, eval_every=256, budget=6_000),
             "c": stored(tmp_path / "c.json", 0, {"uniform": [[0.1, 0.3]]}, pool="[20,100,0,0]")}
    with pytest.raises(SystemExit) as exit_:
        main([item.format(**paths) for item in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert reason.format(**paths) in err and "Traceback" not in err


def test_pool_accuracy_scores_the_latest_checkpoint_on_the_training_pool(tmp_path):
    import torch

    from prl.learner.checkpoint import write_checkpoint
    from prl.models import export_state, load_model, resolve_model_dir
    from prl.schemas.config import load_config

    cfg = load_config(overrides=[f"run.run_dir='{tmp_path}'", "task.train_per_digit=[20, 20, 0]"])
    model, base_dir = load_model(cfg.model.path), resolve_model_dir(cfg.model.path)
    write_checkpoint(str(tmp_path), 1, export_state(model), None, {}, base_dir, keep=2)
    warm = pool_accuracy(cfg)
    assert set(warm) == {"accuracy", "accuracy_d1", "accuracy_d2"}  # the pool's difficulties, not the held-out set's three
    assert warm["accuracy_d1"] >= 0.7  # the warm-started model knows most 1-digit sums
    write_checkpoint(str(tmp_path), 2, {k: torch.zeros_like(v) for k, v in export_state(model).items()}, None, {}, base_dir, keep=2)
    assert pool_accuracy(cfg)["accuracy"] == 0.0  # the newest checkpoint is what is scored, not the base model


def test_pool_figures_are_medians_over_the_runs_that_measured_them():
    runs = [{"by_difficulty": {"d1": [0.5, 0.9]}, "pool_end": {"accuracy": 0.8, "accuracy_d1": 0.8}},
            {"by_difficulty": {"d1": [0.5, 0.7]}, "pool_end": {"accuracy": 1.0, "accuracy_d1": 1.0}},
            {"by_difficulty": {"d1": [0.5, 0.8]}}]  # stored before the pool was measured
    assert pool_median(runs) == pytest.approx(0.9)
    assert pool_median(runs[2:]) is None
    assert difficulty_cells(runs) == "d1 0.80 / 0.90"
    assert difficulty_cells(runs[2:]) == "d1 0.80 / -"


def test_a_final_lead_is_split_by_difficulty_each_final_a_trailing_mean_like_the_metrics():
    def run(d1, d2):
        return {"by_difficulty": {"d1": d1, "d2": d2}}
    mine = [run([0.8, 0.9, 1.0], [0.5, 0.6, 0.7])] * 3
    theirs = [run([1.0, 0.9, 0.8], [0.4, 0.4, 0.4])] * 3
    assert difficulty_finals(mine, 2) == {"d1": [pytest.approx(0.95)] * 3, "d2": [pytest.approx(0.65)] * 3}
    # the lead is all the 2-digit block's: none on 1-digit sums over the last two evaluations
    assert difficulty_differences(mine, theirs, 2) == "d1 +10.0 (+10.0 to +10.0); d2 +25.0 (+25.0 to +25.0)"
    assert difficulty_differences(mine, theirs, 3) == "d1 +0.0 (+0.0 to +0.0); d2 +20.0 (+20.0 to +20.0)"
    assert difficulty_differences(mine, [{"by_difficulty": {"d3": [0.1]}}], 1) == "-"


@pytest.mark.parametrize("pool", ["abc", "0", "2001", "[20, 100]"])
def test_a_real_task_pool_that_is_not_a_problem_count_fails_before_any_import(pool, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--task", "chain_sum", "--pool", pool])
    assert exit_.value.code == 2
    assert f"--pool {pool}: with --task, a number of training problems from 1 to 2000" in capsys.readouterr().err


@pytest.mark.parametrize("argv, reason", [
    (["--pool", "abc"], "task.train_per_digit: Input should be a valid list"),
    (["--set", "learner.lr=-1"], "learner.lr"),
    (["--set", "fulll:scheduler.priority.retest=false"], "--set fulll:scheduler.priority.retest=false: not a strategy "
     "before the ':'"),
    (["--strategies", "uniform", "full", "--set", "full:scheduler.priority.weight=odd"], "scheduler.priority.weight"),
    (["--strategies", "uniform", "--set", "full:scheduler.priority.retest=false"], "--set full:scheduler.priority.retest=false: "
     "full is not among this run's strategies (uniform), so no run would use it"),
    (["--budget", "320", "--strategies", "uniform", "full_likelihood"], "--budget 320: full_likelihood first score the 320 "
     "training problems, charged as 320 rollouts, which leaves nothing to train on"),
    (["--strategies", "priority_flat", "--set", "scheduler.uniform_drop_unsolved=true"],  # checked with the strategy's own items
     "scheduler: uniform_drop_unsolved acts only with strategy uniform or dapo_filter"),
])
def test_settings_no_run_could_use_fail_before_any_run_starts(argv, reason, capsys, monkeypatch):
    monkeypatch.setattr("benchmarks.learning.run_all", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as exit_:
        main(["--seeds", "1", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert reason in err and "Traceback" not in err


def test_the_real_task_pool_is_one_random_draw_shared_by_every_run():
    rows = pool_rows(2_000, 48)
    assert rows == sorted(set(rows)) and len(rows) == 48 and 0 <= rows[0] and rows[-1] < 2_000
    assert pool_rows(2_000, 48) == rows  # the same pool for every strategy and seed
    assert rows != list(range(48))  # not the file's first rows (a generator puts its easy problems first)
    assert max(rows) > 1_000  # spread over the whole split
    assert pool_rows(5, 5) == [0, 1, 2, 3, 4]


def test_a_real_task_run_draws_its_curves_beside_the_built_in_figure_not_over_it():
    assert curves_path(None) == "docs/bench-learning-curves.png"
    assert curves_path("chain_sum") == "docs/bench-learning-chain_sum-curves.png"


def untrained_runs(monkeypatch, key=lambda name, seed: name) -> dict:
    """The benchmark's runs replaced by a flat curve, none trained: returns, per ``key(strategy,
    seed)``, the config overrides each run was launched with."""
    import benchmarks.learning as learning

    launched = {}

    def fake_runs(jobs, workers):
        for job in jobs:
            launched[key(job[0], job[1])] = job[5]
            yield job, {"curve": [[0, 0.3], [256, 0.3]], "start": 0.3}

    monkeypatch.setattr(learning, "finished_runs", fake_runs)
    return launched


def stored(path, first_seed, curves: dict[str, list[list[float]]], code=None, machine=None, **args):
    """A file as `prl bench learning --json` writes it, for runs with these accuracy curves
    (``code``, ``machine``: the commit and machine it records; files from before benchmarks
    recorded them have none)."""
    def run(accs):
        return {"curve": [[512 * i, a] for i, a in enumerate(accs)], "start": accs[0], "signal_share": 0.5,
                "zero_signal_rollouts": 0, "retest_share": 0.0, "never_dispatched_share": 0.0, "steps": 10,
                "seconds": 1.0, "completion_tokens_trained": 5.0, "completion_tokens_stale": 0.0, "replay_share": 0.0,
                "clip_fresh": 0.0, "clip_replay": None}
    settings = {"mode": "default", "task": "chain_sum", "budget": None, "eval_every": 500, "heldout": 200, "pool": None,
                "lr": [], "set": [], "first_seed": first_seed, **args}
    runs = {k: [run(c) for c in v] for k, v in curves.items()}
    path.write_text(json.dumps({"args": settings, "runs": runs, **({"code": code} if code else {}),
                                **({"machine": machine} if machine else {})}))
    return str(path)


def test_stored_runs_of_other_seeds_pool_into_one_table(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2, 0.3, 0.3]], "priority_flat": [[0.1, 0.4, 0.4, 0.4]]})
    b = stored(tmp_path / "b.json", 1, {"uniform": [[0.1, 0.2, 0.4, 0.4], [0.1, 0.3, 0.3, 0.4]],
                                        "priority_flat": [[0.1, 0.2, 0.4, 0.4], [0.1, 0.4, 0.4, 0.4]]})
    out = tmp_path / "pooled.json"
    assert main(["--from-json", a, b, "--smooth", "1", "--targets", "0.36", "--png", str(tmp_path / "c.png"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "seeds per strategy: uniform 3, priority_flat 3" in printed
    assert "priority_flat / uniform rollouts 0.33, 90% over seeds " in printed  # medians of 3: 512 against 1,536
    pooled = json.loads(out.read_text())
    assert [r["seed"] for r in pooled["runs"]["uniform"]] == [0, 1, 2]
    assert (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.parametrize("other, reason", [
    ({"first_seed": 0}, "uniform seed 0 is also in an earlier file"),
    ({"first_seed": 1, "pool": "96"}, "pool is '96' there and None in"),
    ({"first_seed": 1, "lr": ["uniform=1e-4"]}, "uniform was trained at lr 0.0001 there and at the config in an earlier file"),
])
def test_stored_runs_that_do_not_belong_together_fail_with_one_line(tmp_path, capsys, other, reason):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]})
    b = stored(tmp_path / "b.json", curves={"uniform": [[0.1, 0.3]]}, **other)
    with pytest.raises(SystemExit) as exit_:
        main(["--from-json", a, b])
    assert exit_.value.code == 2
    assert f"--from-json {b}: {reason}" in capsys.readouterr().err


def test_strategies_trained_at_their_own_rates_in_different_files_pool(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]}, lr=["uniform=1e-4"])
    b = stored(tmp_path / "b.json", 0, {"priority_flat": [[0.1, 0.3]]}, lr=["priority_flat=5e-5"])
    assert main(["--from-json", a, b, "--png", str(tmp_path / "c.png")]) == 0
    assert "lr {'uniform': 0.0001, 'priority_flat': 5e-05}" in capsys.readouterr().out


def test_the_longest_strategy_name_stays_apart_from_its_difficulty_cells(tmp_path, capsys):
    longest = max(STRATEGIES, key=len)
    a = stored(tmp_path / "a.json", 0, {longest: [[0.1, 0.2]]})
    assert main(["--from-json", a, "--png", str(tmp_path / "c.png")]) == 0
    assert f"  {longest} -" in capsys.readouterr().out  # stored runs without per-difficulty curves


def test_pooling_stored_runs_without_png_draws_outside_the_repository(tmp_path, monkeypatch, capsys):
    """A --from-json command copied from RESULTS.md without --png must not replace the default
    mode's figure in docs/: it draws into the temporary directory and says where."""
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a docs/ figure, if one were written, would land here
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]})
    assert main(["--from-json", a]) == 0
    assert (tmp_path / "bench-learning-pooled-curves.png").stat().st_size > 0
    assert not (tmp_path / "docs").exists()
    assert f"curves: {tmp_path / 'bench-learning-pooled-curves.png'}" in capsys.readouterr().out


def test_pooled_runs_name_the_commits_that_made_them(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]}, code={"commit": "a" * 40, "dirty": False})
    b = stored(tmp_path / "b.json", 1, {"uniform": [[0.1, 0.3]]}, code={"commit": "b" * 40, "dirty": True})
    c = stored(tmp_path / "c.json", 2, {"uniform": [[0.1, 0.3]]})
    assert main(["--from-json", a, b, c, "--png", str(tmp_path / "c.png")]) == 0
    assert ("code: aaaaaaa (1 runs), bbbbbbb+ (1 runs), unrecorded (1 runs); runs of different commits pooled"
            in capsys.readouterr().out)


def test_pooled_runs_name_the_machines_that_made_them_and_keep_them_when_pooled_again(tmp_path, capsys):
    """Wall times and the pipeline's off-policy lags depend on the machine, so the pooled table
    says which machines its runs (and the reference's) came from; a file written by pooling keeps
    each run's own machine and commit, not the pooling machine's."""
    zen = {"cpu": "AMD EPYC", "cores": 2, "torch_cpu_capability": "AVX512", "native_bf16": True}
    avx2 = {"cpu": "AMD EPYC", "cores": 2, "torch_cpu_capability": "AVX2", "native_bf16": False}
    builtin = {"task": None, "eval_every": 512}  # what a pooled file's own arguments say, so it pools again
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]}, code={"commit": "a" * 40, "dirty": False}, machine=zen,
               **builtin)
    b = stored(tmp_path / "b.json", 1, {"uniform": [[0.1, 0.3]]}, machine=avx2, **builtin)
    c = stored(tmp_path / "c.json", 2, {"uniform": [[0.1, 0.3]]}, **builtin)
    ref = stored(tmp_path / "r.json", 0, {"uniform": [[0.1, 0.4]]}, machine=zen, pool="[20,100,0,0]", **builtin)
    pooled = tmp_path / "pooled.json"
    assert main(["--from-json", a, b, c, "--reference", ref, "--png", str(tmp_path / "c.png"), "--json", str(pooled)]) == 0
    printed = capsys.readouterr().out
    assert ("machine: AMD EPYC (2 cores, AVX512, native bf16) (1 runs), AMD EPYC (2 cores, AVX2, bf16 emulated) (1 runs), "
            "unrecorded (1 runs); runs of different machines pooled") in printed
    assert "reference runs' machine: AMD EPYC (2 cores, AVX512, native bf16) (1 runs)\n" in printed
    d = stored(tmp_path / "d.json", 3, {"uniform": [[0.1, 0.3]]}, machine=zen, **builtin)
    assert main(["--from-json", str(pooled), d, "--png", str(tmp_path / "c.png")]) == 0
    printed = capsys.readouterr().out
    assert "machine: AMD EPYC (2 cores, AVX512, native bf16) (2 runs), AMD EPYC (2 cores, AVX2, bf16 emulated) (1 runs), " \
           "unrecorded (1 runs);" in printed
    assert "code: aaaaaaa (1 runs), unrecorded (3 runs);" in printed


def test_a_training_flag_beside_from_json_fails_with_one_line(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]})
    with pytest.raises(SystemExit) as exit_:
        main(["--from-json", a, "--budget", "3000", "--set", "learner.lr=1e-4", "--jobs", str(cores() + 1)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--from-json trains nothing, so --budget --set --jobs cannot apply" in err
    assert "Traceback" not in err


def test_from_json_with_seeds_pools_those_seeds_alone_in_the_runs_and_the_reference(tmp_path, capsys):
    """--first-seed and --seeds choose which stored seeds pool, so a new run of seeds 0-4 can be
    set beside the same five seeds of a stored thirty."""
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]] * 3, "priority_flat": [[0.1, 0.4]] * 3})
    b = stored(tmp_path / "b.json", 3, {"uniform": [[0.1, 0.2]] * 2, "priority_flat": [[0.1, 0.4]] * 2})
    ref = stored(tmp_path / "r.json", 0, {"uniform": [[0.1, 0.4]] * 5}, pool="[20,100,0,0]")
    out = tmp_path / "pooled.json"
    assert main(["--from-json", a, b, "--reference", ref, "--first-seed", "2", "--seeds", "2",
                 "--png", str(tmp_path / "c.png"), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "seeds per strategy: uniform 2, priority_flat 2" in printed
    assert "seeds per strategy: uniform 2;" in printed  # the reference's
    assert [r["seed"] for r in json.loads(out.read_text())["runs"]["uniform"]] == [2, 3]
    assert main(["--from-json", a, b, "--first-seed", "4", "--png", str(tmp_path / "c.png")]) == 0
    assert "seeds per strategy: uniform 1, priority_flat 1" in capsys.readouterr().out


def test_benchmark_json_records_the_commit_it_ran_from(tmp_path):
    from argparse import Namespace

    from benchmarks.common import write_json

    out = tmp_path / "b.json"
    write_json(Namespace(json=str(out)), figure=1.0)
    code = json.loads(out.read_text())["code"]
    assert set(code) == {"commit", "dirty"}
    checkout = (Path(__file__).parents[2] / ".git").exists() and shutil.which("git")
    if checkout:  # a clone, as in CI: the commit is named; an installed copy has none
        assert len(code["commit"]) == 40 and isinstance(code["dirty"], bool)


def test_benchmark_json_records_the_machine_and_its_bf16(tmp_path):
    """Wall times and off-policy lags depend on the machine (a CPU without native bf16 trained
    16x slower under autocast), so every results file says what it ran on."""
    from argparse import Namespace

    import torch

    from benchmarks.common import write_json
    from prl.models import native_bf16

    out = tmp_path / "b.json"
    write_json(Namespace(json=str(out)), figure=1.0)
    machine = json.loads(out.read_text())["machine"]
    assert machine["cpu"] and machine["cores"] >= 1
    assert machine["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["native_bf16"] is native_bf16()


def test_the_code_version_is_read_before_the_results_file_is_rewritten(tmp_path, monkeypatch):
    """Rewriting a committed results file must not mark the run's own code as changed: the
    tree is checked before the file is opened (and so truncated)."""
    from argparse import Namespace

    from benchmarks import common

    out = tmp_path / "results.json"
    out.write_text("the committed figures")
    seen = []
    monkeypatch.setattr(common, "code_version", lambda: seen.append(out.read_text()) or {"commit": None, "dirty": None})
    common.write_json(Namespace(json=str(out)), figure=1.0)
    assert seen == ["the committed figures"]
    assert json.loads(out.read_text())["figure"] == 1.0


def test_a_benchmark_records_the_tree_as_it_started_not_as_edited_while_it_ran(monkeypatch, tmp_path):
    """`prl bench` reads the code version before the benchmark runs; a results file written
    after an edit made meanwhile still names the tree the runs came from."""
    from argparse import Namespace

    from benchmarks import common, learning
    from prl.cli import main as prl

    edited = []
    monkeypatch.setattr(common, "git_state", lambda: {"commit": "a" * 40, "dirty": bool(edited)})
    common.code_version.cache_clear()
    out = tmp_path / "b.json"

    def benchmark(argv):  # the tree is edited while it runs, before it writes its results
        edited.append("README.md")
        common.write_json(Namespace(json=str(out)), figure=1.0)
        return 0

    monkeypatch.setattr(learning, "main", benchmark)
    try:
        assert prl(["bench", "learning"]) == 0
    finally:
        common.code_version.cache_clear()
    assert json.loads(out.read_text())["code"] == {"commit": "a" * 40, "dirty": False}


def test_each_run_in_parallel_gets_a_process_of_its_own():
    """--jobs N runs each job in a new spawned process, so memory a run leaves allocated is
    returned before the next run starts in its place (a real-model benchmark was killed for it)."""
    from benchmarks.learning import finished_runs
    from tests.support.worker_pid import pid_json

    jobs = [("uniform", seed) for seed in range(3)]
    done = [summary for _, summary in finished_runs(jobs, 2, run_json=pid_json)]
    assert sorted(tuple(d["job"]) for d in done) == jobs
    assert len({d["pid"] for d in done}) == 3 and os.getpid() not in {d["pid"] for d in done}


@pytest.mark.slow
def test_runs_in_parallel_processes_are_stored_as_sequential_ones_are(tmp_path):
    """--jobs 2 runs each seed in its own process: the stored runs are the same strategies and
    seeds in the same order, each a complete run summary, as with --jobs 1."""
    stored_runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}.json"
        assert main(["--budget", "256", "--eval-every", "128", "--seeds", "2", "--strategies", "uniform", "priority_flat",
                     "--jobs", str(jobs), "--json", str(out), "--png", str(tmp_path / f"j{jobs}.png")]) == 0
        stored_runs[jobs] = json.loads(out.read_text())["runs"]
    one, two = stored_runs[1], stored_runs[2]
    assert list(one) == list(two) == ["uniform", "priority_flat"]
    for name in one:
        assert [r["seed"] for r in one[name]] == [r["seed"] for r in two[name]] == [0, 1]
        assert all(set(a) == set(b) and a["rollouts"] >= 256 and len(b["curve"]) >= 2 for a, b in zip(one[name], two[name]))


@pytest.mark.slow
def test_the_likelihood_strategy_is_charged_its_scoring_pass(tmp_path, monkeypatch):
    """priority_likelihood scores every training problem before it trains: its curve starts a
    rollout per problem in, and its pipeline is given the budget less that charge (how far a
    run overshoots its budget depends on how far the producer ran ahead, so the limit each
    pipeline was given is what is compared)."""
    import prl.cli.run

    limits, run_pipeline = [], prl.cli.run.run_pipeline

    def recording(cfg, **kw):
        limits.append(kw["max_rollouts"])
        return run_pipeline(cfg, **kw)

    monkeypatch.setattr(prl.cli.run, "run_pipeline", recording)
    out = tmp_path / "ll.json"
    assert main(["--budget", "320", "--eval-every", "128", "--seeds", "1", "--pool", "[4, 8, 8, 8]", "--jobs", "1",
                 "--strategies", "uniform", "priority_likelihood", "--json", str(out), "--png", str(tmp_path / "ll.png")]) == 0
    runs = json.loads(out.read_text())["runs"]
    (uniform,), (scored,) = runs["uniform"], runs["priority_likelihood"]
    assert scored["charged_rollouts"] == 28 and scored["curve"][0][0] == 28
    assert uniform["charged_rollouts"] == 0 and uniform["curve"][0][0] == 0
    assert sorted(limits) == [320 - 28, 320]
    assert scored["rollouts"] >= 320 and uniform["rollouts"] >= 320


def test_stored_runs_can_be_shown_for_some_strategies_only(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]], "priority_flat": [[0.1, 0.3]], "full": [[0.1, 0.4]]})
    assert main(["--from-json", a, "--strategies", "full", "uniform", "--png", str(tmp_path / "c.png")]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith(("uniform", "full", "priority"))]
    assert rows == ["full", "uniform"]
    with pytest.raises(SystemExit) as exit_:
        main(["--from-json", a, "--strategies", "dapo_filter"])
    assert exit_.value.code == 2
    assert "--strategies dapo_filter: not in the stored runs (uniform, priority_flat, full)" in capsys.readouterr().err


def test_the_large_pool_mode_trains_on_the_task_s_own_pool_at_its_own_rates():
    from benchmarks.learning_settings import LR, MODES, TASK_POOL, learning_rates
    from prl.schemas.config import TaskConfig

    assert json.loads(TASK_POOL) == TaskConfig().train_per_digit  # what `prl run` trains on
    assert MODES["large-pool"][2] == TASK_POOL
    rates = learning_rates(None, [], "large-pool")
    assert rates["full"] == 5e-5 != LR["full"] and rates["priority_flat"] == LR["priority_flat"]  # re-tuned ones only
    assert learning_rates(None, ["full=1e-4"], "large-pool")["full"] == 1e-4  # --lr still wins
    assert curves_path(None, "large-pool") == "docs/bench-learning-large-pool-curves.png"
    assert curves_path(None, "long") == "docs/bench-learning-curves.png"


def test_each_strategy_trains_at_the_optimizer_steps_per_batch_tuned_for_its_pool(tmp_path, monkeypatch):
    """UPDATES gives a strategy its own steps per batch on the built-in small pool (--set still
    wins), MODE_UPDATES on the large pool (there uniform takes one); each run records what it used."""
    import benchmarks.learning as learning

    launched = untrained_runs(monkeypatch, key=lambda name, seed: (name, seed))
    monkeypatch.setattr(learning, "write_json", lambda *a, **k: None)
    args = learning.argparse.Namespace(first_seed=0, eval_every=256, set=[], task=None, mode="default", jobs=1, smooth=1)
    runs = learning.run_all(args, [], ["uniform", "priority_flat"], 1, 256, {})
    assert "learner.updates_per_batch=2" in launched[("uniform", 0)] and settings.UPDATES["uniform"] == 2
    assert not any("updates_per_batch" in item for item in launched[("priority_flat", 0)])
    assert runs["uniform"][0]["updates"] == 2 and runs["priority_flat"][0]["updates"] == 1
    args.set = ["learner.updates_per_batch=3"]
    assert learning.run_all(args, [], ["uniform"], 1, 256, {})["uniform"][0]["updates"] == 3
    args.mode, args.set = "large-pool", []
    runs = learning.run_all(args, [], ["uniform", "dapo_filter"], 1, 256, {})
    assert runs["uniform"][0]["updates"] == 1 and runs["dapo_filter"][0]["updates"] == settings.MODE_UPDATES["large-pool"]["dapo_filter"] == 2


def test_the_baselines_draw_the_pool_in_passes_and_their_runs_record_it(tmp_path, monkeypatch):
    """uniform and DAPO run with scheduler.uniform_passes (a data loader's epochs, the stronger
    baselines), recorded as a --set item so they never pool with runs of independent draws; the
    priorities do not take it, and --set can still turn it off."""
    import benchmarks.learning as learning

    launched, stored = untrained_runs(monkeypatch), {}
    monkeypatch.setattr(learning, "report", lambda args, results, *rest: stored.update(results))
    assert main(["--budget", "256", "--seeds", "1", "--strategies", "uniform", "dapo_filter", "priority_flat",
                 "--png", str(tmp_path / "c.png")]) == 0
    for name in ("uniform", "dapo_filter"):
        assert "scheduler.uniform_passes=true" in launched[name]
        assert stored[name][0]["set"] == ["scheduler.uniform_passes=true"]
    assert not any("uniform_passes" in item for item in launched["priority_flat"]) and stored["priority_flat"][0]["set"] == []
    assert main(["--budget", "256", "--seeds", "1", "--strategies", "uniform", "--set",
                 "uniform:scheduler.uniform_passes=false", "--png", str(tmp_path / "c.png")]) == 0
    assert launched["uniform"][-1] == "scheduler.uniform_passes=false"  # the later item wins


def test_stored_runs_pool_only_at_the_same_optimizer_steps_per_batch(tmp_path, capsys):
    """A file whose --set gave two steps per batch pools with others of the same settings (the
    item is the run's own, not a shared setting) and the table says so; one strategy at two
    different steps per batch across files does not pool."""
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]}, set=["learner.updates_per_batch=2"])
    b = stored(tmp_path / "b.json", 0, {"priority_flat": [[0.1, 0.3]]})
    assert main(["--from-json", a, b, "--png", str(tmp_path / "c.png")]) == 0
    assert "optimizer steps per batch {'uniform': 2}" in capsys.readouterr().out
    c = stored(tmp_path / "c.json", 1, {"uniform": [[0.1, 0.3]]})
    with pytest.raises(SystemExit):
        main(["--from-json", a, c])
    assert (f"--from-json {c}: uniform was trained at 1 optimizer steps per batch there and at 2 in an earlier file"
            in capsys.readouterr().err)


def test_strategies_not_asked_for_are_not_pooled(tmp_path, capsys):
    """--strategies, and PATH:STRATEGY,... for one file, pick what is pooled: a superseded run of
    another strategy (here uniform at another steps per batch, on the same seed) does not stop
    the others from pooling."""
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]], "priority_flat": [[0.1, 0.3]]})
    b = stored(tmp_path / "b.json", 0, {"uniform": [[0.1, 0.4]]}, set=["learner.updates_per_batch=2"])
    with pytest.raises(SystemExit):
        main(["--from-json", a, b, "--png", str(tmp_path / "c.png")])
    assert "uniform was trained at 2 optimizer steps per batch there and at 1" in capsys.readouterr().err
    assert main(["--from-json", a, b, "--strategies", "priority_flat", "--png", str(tmp_path / "c.png")]) == 0
    assert "seeds per strategy: priority_flat 1;" in capsys.readouterr().out
    assert main(["--from-json", f"{a}:priority_flat", b, "--png", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "seeds per strategy: uniform 1, priority_flat 1;" in out and "optimizer steps per batch {'uniform': 2}" in out
    with pytest.raises(SystemExit):
        main(["--from-json", f"{a}:priority_flat,greedy", "--png", str(tmp_path / "c.png")])
    assert "cannot read it" in capsys.readouterr().err  # not a strategy list: read as a path


def test_settings_are_checked_with_the_strategy_they_run_under(monkeypatch):
    """A --set item valid only with a strategy's own items (its scheduler.strategy) passes the
    check before any run: the check builds each strategy's config as its runs do."""
    class Started(Exception):
        pass

    def start(*args):
        raise Started

    monkeypatch.setattr("benchmarks.learning.run_all", start)
    with pytest.raises(Started):  # past the check, at the runs
        main(["--seeds", "1", "--strategies", "uniform", "--set", "uniform:scheduler.uniform_drop_unsolved=true"])


def test_the_check_before_the_runs_loads_each_strategy_as_its_runs_do(monkeypatch):
    """The config checked before any run is composed as each run composes its own (one helper,
    so the two cannot drift): the strategy's items, then its rate, steps per batch and --set items."""
    import benchmarks.learning as learning

    checked, real_load = [], learning.load_config
    launched = untrained_runs(monkeypatch)
    monkeypatch.setattr(learning, "load_config", lambda overrides: checked.append(overrides) or real_load(overrides=overrides))
    monkeypatch.setattr(learning, "report", lambda *a, **k: None)
    assert main(["--seeds", "1", "--strategies", "uniform", "priority_flat", "--lr", "uniform=1e-5",
                 "--set", "uniform:scheduler.uniform_drop_unsolved=true"]) == 0
    assert {"learner.lr=1e-05", "learner.updates_per_batch=2", "scheduler.uniform_drop_unsolved=true"} <= set(launched["uniform"])
    for name in ("uniform", "priority_flat"):
        own = [*STRATEGIES[name], *launched[name]]
        assert any(items[-len(own):] == own for items in checked), name


def test_a_setting_scoped_to_one_strategy_reaches_its_runs_alone(monkeypatch):
    """--set STRATEGY:KEY=VALUE changes that strategy's runs and no other's (so one run compares
    a setting against baselines without it); each run records the items it took."""
    import benchmarks.learning as learning

    launched = untrained_runs(monkeypatch)
    monkeypatch.setattr(learning, "write_json", lambda *a, **k: None)
    args = learning.argparse.Namespace(first_seed=0, eval_every=256, task=None, mode="default", jobs=1, smooth=1,
                                       set=["learner.clip_low=0.3", "full:scheduler.priority.retest=false"])
    runs = learning.run_all(args, [], ["uniform", "full"], 1, 256, {})
    assert "scheduler.priority.retest=false" in launched["full"] and "learner.clip_low=0.3" in launched["full"]
    assert not any("retest" in item for item in launched["uniform"]) and "learner.clip_low=0.3" in launched["uniform"]
    assert runs["full"][0]["set"] == ["learner.clip_low=0.3", "scheduler.priority.retest=false"]
    assert runs["uniform"][0]["set"] == ["learner.clip_low=0.3"]


def test_strategies_with_settings_of_their_own_pool_and_one_strategy_at_two_settings_does_not(tmp_path, capsys):
    """A file whose --set changed one strategy pools with baselines run without it (each strategy
    is compared at its own settings, which the table names); the same strategy with and without
    the setting does not pool."""
    a = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2]]})
    b = stored(tmp_path / "b.json", 0, {"full": [[0.1, 0.3]]}, set=["scheduler.priority.retest=false", "learner.updates_per_batch=2"])
    assert main(["--from-json", a, b, "--png", str(tmp_path / "c.png")]) == 0
    assert "--set full: scheduler.priority.retest=false" in capsys.readouterr().out
    c = stored(tmp_path / "c.json", 1, {"full": [[0.1, 0.3]]}, set=["learner.updates_per_batch=2"])
    with pytest.raises(SystemExit):
        main(["--from-json", a, b, c])
    assert (f"--from-json {c}: full was trained with --set nothing there and with scheduler.priority.retest=false in an "
            "earlier file" in capsys.readouterr().err)


def test_tuning_files_list_each_strategys_settings_highest_area_first_only_against_the_same_seeds(tmp_path, capsys):
    """The tuning rule by the command: per strategy, the settings tried on the same seeds and pool
    ranked by median area, the pick first with its items, the others with theirs against it; runs
    on other seeds or another pool are another list, not a rival."""
    low = stored(tmp_path / "tune-low.json", 100, {"full": [[0.30, 0.32, 0.34], [0.30, 0.33, 0.35]],
                                                   "uniform": [[0.30, 0.31, 0.32], [0.30, 0.31, 0.32]]}, lr=["full=5e-5"])
    high = stored(tmp_path / "tune-high.json", 100, {"full": [[0.30, 0.36, 0.38], [0.30, 0.35, 0.37]]},
                  set=["scheduler.replay.ratio=1.0", "learner.updates_per_batch=2"])
    other_seeds = stored(tmp_path / "tune-other.json", 110, {"full": [[0.30, 0.40, 0.40], [0.30, 0.40, 0.40]]})
    other_pool = stored(tmp_path / "tune-pool.json", 100, {"full": [[0.30, 0.40, 0.40], [0.30, 0.40, 0.40]]}, pool="96")
    assert main(["--tuning", low, high, other_seeds, other_pool, "--smooth", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index(next(line for line in out if line.startswith("full: ") and "seeds 100-101" in line
                        and "pool the task's default draw" in line))
    assert "2 setting(s), highest area first" in out[at]
    pick, other = out[at + 1].split(), out[at + 2].split()
    assert pick[0] == "pick" and pick[-2:] == ["[tune-high.json]", "scheduler.replay.ratio=1.0"]
    assert pick[pick.index("steps") + 1] == "2" and pick[pick.index("lr") + 1] == "config"
    assert other[-2:] == ["[tune-low.json]", "-scheduler.replay.ratio=1.0"] and other[other.index("lr") + 1] == "5e-05"
    assert float(pick[pick.index("AUC") + 1]) > float(other[other.index("AUC") + 1])
    assert any(line.startswith("full: ") and "seeds 110-111" in line for line in out)  # its own list, not a rival
    assert any(line.startswith("full: ") and "pool 96" in line for line in out)
    assert any(line.startswith("uniform: ") and "1 setting(s)" in line for line in out)
    assert main(["--tuning", low, high, "--strategies", "uniform", "--smooth", "1"]) == 0  # one strategy's lists alone
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out if not line.startswith(" ")] == ["uniform"]


def test_tuning_lists_a_run_under_the_strategy_its_set_items_made_it(tmp_path, capsys):
    """A uniform run whose --set items are uniform_drop's own ran as uniform_drop, and --tuning
    lists it there beside runs made under that name (not at the top of uniform's list); the
    group prior and the likelihood groups, alike in their items, stay apart."""
    from benchmarks.learning_settings import named_strategy

    drop = ["scheduler.uniform_passes=true", "scheduler.uniform_drop_unsolved=true"]
    assert named_strategy("uniform", [*drop, "learner.clip_low=0.3"]) == ("uniform_drop", ["learner.clip_low=0.3"])
    assert named_strategy("uniform", drop[:1]) == ("uniform", drop[:1])  # passes alone: still uniform
    assert named_strategy("priority_group", ["x=1"]) == ("priority_group", ["x=1"])  # not priority_likelihood
    assert named_strategy("uniform", [*drop, "scheduler.uniform_passes=false"])[0] == "uniform"  # a leftover undoes it
    as_uniform = stored(tmp_path / "tune-a.json", 100, {"uniform": [[0.30, 0.40, 0.40], [0.30, 0.40, 0.40]]}, set=drop)
    plain = stored(tmp_path / "tune-b.json", 100, {"uniform": [[0.30, 0.32, 0.33], [0.30, 0.32, 0.33]]}, set=drop[:1])
    named = stored(tmp_path / "tune-c.json", 100, {"uniform_drop": [[0.30, 0.35, 0.36], [0.30, 0.35, 0.36]]},
                   code={"commit": "855ee9e0123", "dirty": True})
    assert main(["--tuning", as_uniform, plain, named, "--smooth", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    lists = {line.split(":")[0]: i for i, line in enumerate(out) if not line.startswith(" ")}
    assert "2 setting(s)" in out[lists["uniform_drop"]] and "1 setting(s)" in out[lists["uniform"]]
    assert out[lists["uniform_drop"] + 1].split()[-3:] == ["[tune-a.json]", "--set", "none"]  # its own items: none left
    assert "[tune-b.json]" in out[lists["uniform"] + 1]
    assert "code 855ee9e+    [tune-c.json]" in out[lists["uniform_drop"] + 2]  # the code each setting ran at
    assert "code unrecorded  [tune-a.json]" in out[lists["uniform_drop"] + 1]  # a file from before commits were kept


def test_an_item_set_again_pools_and_lists_as_the_one_that_acted(tmp_path, capsys):
    """A --set item that overrides a pick's item of the same key (the run trained with the later
    one) pools with runs given that one alone, and --tuning lists the run with it alone."""
    ratio, other = "scheduler.replay.ratio", "scheduler.priority.mode=periodic"
    again = stored(tmp_path / "tune-a.json", 100, {"full": [[0.30, 0.40, 0.40]]}, set=[f"{ratio}=1.0", other, f"{ratio}=2.0"])
    once = stored(tmp_path / "tune-b.json", 101, {"full": [[0.30, 0.40, 0.40]]}, set=[other, f"{ratio}=2.0"])
    assert main(["--from-json", again, once, "--smooth", "1", "--png", str(tmp_path / "c.png")]) == 0
    assert "seeds per strategy: full 2" in capsys.readouterr().out
    lower = stored(tmp_path / "tune-c.json", 100, {"full": [[0.30, 0.35, 0.35]]}, set=[other, f"{ratio}=1.0"])
    assert main(["--tuning", again, lower, "--smooth", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith(f"[tune-a.json]  {other} {ratio}=2.0")
    assert out[2].endswith(f"[tune-c.json]  +{ratio}=1.0 -{ratio}=2.0")


def test_a_setting_replaces_the_reported_one_only_past_the_margin(tmp_path, capsys):
    """The tuning rule with its margin: a setting less than ADOPT_MARGIN above the reported row's
    setting by area is listed above it, marked "~", and the reported one stays the pick; one more
    than the margin above it becomes the pick. Without a reported setting the highest is the pick."""
    from benchmarks.learning_settings import ADOPT_MARGIN, MU, PICKS

    def tuned(name, auc, items, seed=100):
        return stored(tmp_path / f"tune-{name}.json", seed, {"full": [[auc] * 3, [auc] * 3]}, task=None,
                      set=[*PICKS["full"], f"{MU}=2", *items])

    reported = tuned("reported", 0.380, [])
    within = tuned("within", 0.380 + ADOPT_MARGIN * 2 / 3, ["learner.clip_low=0.3"])
    assert main(["--tuning", reported, within, "--smooth", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"pick: the reported one, none more than {ADOPT_MARGIN} above it")
    assert out[1].split()[0] == "~" and "[tune-within.json]  +learner.clip_low=0.3" in out[1]
    assert out[2].split()[0] == "pick" and "[tune-reported.json] (reported)  scheduler." in out[2]
    beyond = tuned("beyond", 0.380 + ADOPT_MARGIN * 4 / 3, ["learner.clip_low=0.4"])
    assert main(["--tuning", reported, within, beyond, "--smooth", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("pick: the highest") and out[1].split()[0] == "pick" and "[tune-beyond.json]" in out[1]
    assert out[2].split()[0] == "~" and "[tune-within.json]" in out[2]  # within the margin of the new pick
    assert out[3].split()[0] == "AUC" and "[tune-reported.json] (reported)  -learner.clip_low=0.4" in out[3]
    other_seeds = tuned("other", 0.380, [], seed=110)  # the reported setting alone on other seeds: still the pick
    assert main(["--tuning", other_seeds, "--smooth", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("pick: the reported one")


def test_tuning_draws_each_strategys_settings_by_area_with_the_pick_and_the_reported_one(tmp_path, capsys):
    """``--tuning --png``: one strip per strategy and tuning set, as the list orders them, holding
    every setting's area, the rule's pick and the reported setting (none where it was not tried)."""
    from benchmarks.learning_settings import ADOPT_MARGIN, MU, PICKS
    from benchmarks.learning_stored import tried_settings, tuning_strips

    def tuned(file, name, auc, items):
        return stored(tmp_path / file, 100, {name: [[auc] * 3, [auc] * 3]}, task=None, set=[*PICKS[name], f"{MU}=2", *items])

    files = [tuned("reported.json", "full", 0.380, []), tuned("beyond.json", "full", 0.380 + 2 * ADOPT_MARGIN,
                                                                   ["learner.clip_low=0.3"]),
             tuned("flat.json", "priority_flat", 0.360, ["learner.clip_low=0.3"])]
    strips = tuning_strips(tried_settings(files, 1))
    assert [strip["label"] for strip in strips] == ["full, pool [20,100,100,100], seeds 100-101, 2 tried",
                                                       "priority_flat, pool [20,100,100,100], seeds 100-101, 1 tried"]
    assert strips[0]["areas"] == pytest.approx([0.380 + 2 * ADOPT_MARGIN, 0.380])
    assert strips[0]["pick"] == pytest.approx(0.380 + 2 * ADOPT_MARGIN) and strips[0]["reported"] == pytest.approx(0.380)
    assert strips[1]["pick"] == pytest.approx(0.360) and strips[1]["reported"] is None  # its reported setting not tried
    longer = stored(tmp_path / "long.json", 100, {"full": [[0.380] * 3] * 2}, task=None, budget=24_000,
                    set=[*PICKS["full"], f"{MU}=2"])
    assert tuning_strips(tried_settings([longer], 1))[0]["reported"] is None  # reported at 12,000 rollouts, not this
    png = tmp_path / "tuning.png"
    assert main(["--tuning", *files, "--smooth", "1", "--png", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"areas: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_reported_row_is_the_tuning_rules_pick_on_the_stored_tuning_runs():
    """PICKS and the stored tuning files agree: on the tuning seeds of the reported pool, each
    reported row's setting is what the rule picks (``--tuning``), so a tuning run that beats a pick
    past the margin fails here until the row moves; the shuffled control alone runs at another
    row's pick (the group prior's), as a control must."""
    from benchmarks.learning_settings import BUILTIN_POOL, PICKS
    from benchmarks.learning_stored import pool_key, reported_setting, rule_pick, tried_settings, tuned_setting

    root = Path(__file__).resolve().parents[2]
    tried = tried_settings(sorted(str(path) for path in (root / "benchmarks/results").glob("tune-*.json")), 3)
    checked = set()
    for (name, task, pool, *_, seeds), rows in tried.items():
        if name in PICKS and (task, pool, seeds) == ("built-in", pool_key(BUILTIN_POOL), "100-109"):
            checked.add(name)
            if name != "priority_shuffled":
                assert tuned_setting(rows[rule_pick(rows, reported_setting(name))]) == reported_setting(name), name
    assert checked == set(PICKS)


def reported_files() -> list[tuple[Path, list[str] | None]]:
    """The stored runs README's standing command pools (--from-json's files, with any :STRATEGY)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    block = text[text.index("**Where it stands**"):]
    block = block[block.index("--from-json"):block.index("--reference")]
    items = [word for word in block.split() if word.startswith("benchmarks/results/")]
    assert len(items) >= 5  # the command pools several files (and the rows check below covers every strategy)
    return [(root / item.partition(":")[0], item.partition(":")[2].split(",") if ":" in item else None) for item in items]


def test_the_picks_are_the_settings_every_reported_row_was_trained_at(tmp_path, monkeypatch):
    """`--picks` launches each reported row at the rate, steps and --set items its stored thirty
    seeds record (so its runs pool with them), and those are README's rows, every one."""
    import benchmarks.learning as learning

    launched, ran = untrained_runs(monkeypatch), {}
    monkeypatch.setattr(learning, "report", lambda args, results, *rest: ran.update(results))
    assert main(["--picks", "--seeds", "1", "--png", str(tmp_path / "c.png")]) == 0
    assert list(ran) == list(settings.PICKS)
    rows = set()
    for path, only in reported_files():
        for name, runs in json.loads(path.read_text())["runs"].items():
            if only and name not in only:
                continue
            rows.add(name)
            for run in runs:
                trained = (run["lr"], run["updates"], effective_overrides(run["set"]))  # as it pools
                assert trained == (ran[name][0]["lr"], ran[name][0]["updates"], ran[name][0]["set"]), (path.name, name)
            assert f"learner.lr={run['lr']}" in launched[name] and "learner.updates_per_batch=2" in launched[name]
    assert rows == set(settings.PICKS)


def test_picks_on_another_mode_or_for_a_strategy_without_a_reported_row_fail_with_one_line(capsys):
    for argv, reason in ((["--picks", "--mode", "large-pool"], "drop --task and --mode"),
                         (["--picks", "--strategies", "replay_alone"], "no reported row for replay_alone")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err


def test_tuning_beside_from_json_a_training_flag_or_a_report_flag_fails_with_one_line(tmp_path, capsys):
    a = stored(tmp_path / "a.json", 100, {"uniform": [[0.1, 0.2]]})
    for argv, reason in ((["--tuning", a, "--from-json", a], "give one of them"),
                         (["--tuning", a, "--seeds", "3"], "--tuning trains nothing, so --seeds cannot apply"),
                         (["--tuning", a, "--targets", "0.4", "--png", "c.png", "--json", "t.json"],
                          "--tuning ranks the settings by area and prints them, so --targets --json cannot apply"),
                         (["--tuning", a, "--strategies", "uniform", "full"], "--strategies full: not in the tuning "
                          "files (uniform)")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err


KILLED_PARENT = """
import os, sys, threading
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
from benchmarks.learning import start_worker

def block(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    threading.Event().wait()  # a run that would go on for minutes

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker,
                               initargs=(1, os.getpid()))
    pool.submit(block, sys.argv[1]).result()
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_a_killed_benchmark_takes_its_workers_with_it(tmp_path):
    """kill -9 of `prl bench learning` stops its spawned workers too; before, each ran on to the
    end of its run, taking the cores from whatever ran next."""
    from tests.support.servers import wait_until

    def alive(pid: int) -> bool:  # a zombie left for a parent that is gone counts as stopped
        status = Path(f"/proc/{pid}/status")
        try:
            return "\tZ" not in next(ln for ln in status.read_text().splitlines() if ln.startswith("State:"))
        except (FileNotFoundError, ProcessLookupError):
            return False

    (tmp_path / "parent.py").write_text(KILLED_PARENT)
    pid_file = tmp_path / "worker.pid"
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(pid_file)], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})
    try:
        wait_until(pid_file.exists, 120, "the worker to start its run")
        worker = int(pid_file.read_text())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        wait_until(lambda: not alive(worker), 30, "the worker to stop with the benchmark")
    finally:
        parent.kill()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_run_records_how_often_the_gradient_norm_clip_rescaled_its_batches(tmp_path, capsys):
    from benchmarks.learning import summarize_run

    rows = [{"service": "learner", "rollouts_generated": 0, "learner/eval/accuracy": 0.3},
            *({"service": "learner", "learner/loss": 0.1, "learner/replay_share": 0.0, "learner/grad_norm": g}
              for g in (0.5, 2.0, 3.0)),
            {"service": "scheduler", "scheduler/signal_share": 0.5}]
    run = summarize_run(rows, {"rollouts_generated": 512, "seconds": 1.0, "steps": 3}, grad_clip=1.0)
    assert run["grad_clip_share"] == 2 / 3 and run["grad_norm_median"] == 2.0
    assert summarize_run(rows, {"rollouts_generated": 512, "seconds": 1.0, "steps": 3})["grad_clip_share"] is None

    path = stored(tmp_path / "a.json", 0, {"uniform": [[0.1, 0.2, 0.3]], "priority_flat": [[0.1, 0.4, 0.4]]})
    data = json.loads((tmp_path / "a.json").read_text())
    data["runs"]["priority_flat"][0].update(grad_clip_share=0.98, grad_norm_median=1.49)
    (tmp_path / "a.json").write_text(json.dumps(data))
    assert main(["--from-json", path, "--smooth", "1", "--png", str(tmp_path / "c.png")]) == 0
    assert "gradient-norm clip: share of batches it rescaled (median norm before it): priority_flat 0.98 (1.49)" in capsys.readouterr().out


def test_a_runs_peak_memory_is_recorded_and_printed_where_runs_have_it(tmp_path, capsys):
    """Runs record their process's peak resident memory (a real-task run was killed for memory);
    the table prints the largest per strategy, and nothing for stored runs from before it."""
    from benchmarks.learning import peak_rss_gb

    assert 0 < peak_rss_gb() < 1024
    path = tmp_path / "a.json"
    stored(path, 0, {"uniform": [[0.1, 0.2, 0.3]] * 2, "priority_flat": [[0.1, 0.4, 0.4]]})
    data = json.loads(path.read_text())
    data["runs"]["uniform"][0]["peak_rss_gb"], data["runs"]["uniform"][1]["peak_rss_gb"] = 7.25, 9.5  # seeds 0 and 1
    path.write_text(json.dumps(data))
    assert main(["--from-json", str(path), "--png", str(tmp_path / "c.png")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("peak resident memory"))
    assert line.endswith("uniform 9.5") and "priority_flat" not in line
