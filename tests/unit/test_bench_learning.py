"""The arithmetic behind `prl bench learning`'s figures (the runs themselves are the benchmark)."""

from benchmarks.learning import censored_median, crossing, smoothed, training_seconds


def test_a_seed_that_never_reaches_the_target_counts_as_beyond_the_budget():
    assert censored_median([3_000, None, 1_000]) == 3_000  # not 2,000: the miss is the largest value
    assert censored_median([None, None, 1_000]) is None  # the median itself was not reached
    assert censored_median([2_000, 4_000]) == 3_000


def test_crossing_uses_the_smoothed_curve_and_training_time():
    run = {"curve": [(0, 0.30), (100, 0.41), (200, 0.33), (300, 0.40)], "times": [0.0, 1.0, 2.0, 3.0]}
    run["smoothed"] = smoothed([a for _, a in run["curve"]], 2)
    assert run["smoothed"] == [0.30, 0.355, 0.37, 0.365]
    assert crossing(run, 0.36) == (200, 2.0)  # the lone spike at 100 does not count
    assert crossing(run, 0.40) == (None, None)


def test_training_seconds_leave_out_evaluation():
    evals = [{"time": 10.0, "learner/eval/eval_seconds": 5.0},  # written after the first evaluation
             {"time": 14.0, "learner/eval/eval_seconds": 1.0},
             {"time": 20.0, "learner/eval/eval_seconds": 2.0}]
    assert training_seconds(evals) == [0.0, 3.0, 7.0]
