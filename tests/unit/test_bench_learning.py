"""The arithmetic behind `prl bench learning`'s figures (the runs themselves are the benchmark)."""

import pytest

from benchmarks.learning import area_under_curve, censored_median, crossing, curves_path, goals, main, pool_rows, smoothed


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
    assert "priority_flat / uniform rollouts 0.60 (goal <= 0.7)" in lines[0]
    assert "full / dapo_filter rollouts - (goal <= 0.6)" in lines[2]
    assert lines[-1] == "final accuracy, full - dapo_filter (medians): +4.0 points (goal >= +3)"


@pytest.mark.parametrize("pool", ["abc", "0", "2001", "[20, 100]"])
def test_a_real_task_pool_that_is_not_a_problem_count_fails_before_any_import(pool, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--task", "chain_sum", "--pool", pool])
    assert exit_.value.code == 2
    assert f"--pool {pool}: with --task, a number of training problems from 1 to 2000" in capsys.readouterr().err


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
