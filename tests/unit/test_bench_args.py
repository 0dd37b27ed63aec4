"""A benchmark given a wrong argument (a number, a --json path it could not write) stops with one
line naming it, before any work."""

import pytest

from prl.cli import main


@pytest.mark.parametrize("argv, line", [
    (["learning", "--seeds", "0"], "argument --seeds: '0' is not a whole number >= 1"),
    (["learning", "--rollouts", "-5"], "argument --rollouts: '-5' is not a whole number >= 1"),
    (["learning", "--target", "2"], "argument --target: '2' is not a number from 0 to 1"),
    (["learning", "--strategies", "full"], "argument --strategies: invalid choice: 'full'"),
    (["scheduler", "--problems", "many"], "argument --problems: 'many' is not a whole number >= 1"),
    (["scale", "--producers", "8", "0"], "argument --producers: '0' is not a whole number >= 1"),
    (["scale", "--call-s", "0"], "argument --call-s: '0' is not a number > 0"),
    (["scale", "--producer-processes", "0"], "argument --producer-processes: '0' is not a whole number >= 1"),
    (["replay", "--ratio", "1.5"], "argument --ratio: '1.5' is not a number from 0 to 1"),
    (["real", "--long-tokens", "-1"], "argument --long-tokens: '-1' is not a whole number >= 0"),
    (["real", "--first-seed", "-1"], "argument --first-seed: '-1' is not a whole number >= 0"),
    (["memory", "--prompts", "0"], "argument --prompts: '0' is not a whole number >= 1"),
    (["memory", "--learner", "--completion-tokens", "0"], "argument --completion-tokens: '0' is not a whole number >= 1"),
    (["archive", "--groups", "0"], "argument --groups: '0' is not a whole number >= 1"),
    (["checkpoint", "--checkpoint-every", "0"], "argument --checkpoint-every: '0' is not a whole number >= 1"),
    (["real", "--json", f"{__file__}/r.json"], f"argument --json: cannot write '{__file__}/r.json'"),  # before its runs
    (["learning", "--png", f"{__file__}/c.png"], f"argument --png: cannot write '{__file__}/c.png'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_wrong_benchmark_argument_is_one_line(capsys, argv, line):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"prl bench {argv[0]}: error: {line}" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_memory_benchmark_sets_both_ways_side_by_side_and_they_generate_the_same(tmp_path, capsys):
    """`prl bench memory`: each way in its own process, the same completion and log-probs both
    ways (the per-step log-probs change memory, not results), the figures in its --json."""
    import json

    assert main(["bench", "memory", "--prompts", "8", "--max-tokens", "4", "--sample", "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "per step (now)" in out and "stacked (before)" in out and "the same both ways: True" in out
    stored = json.loads((tmp_path / "m.json").read_text())
    assert stored["same_first_completion"] is True
    assert all(stored[way]["peak_mb"] >= stored[way]["model_loaded_mb"] > 0 for way in ("per_step", "stacked"))


@pytest.mark.slow
def test_the_memory_benchmark_of_a_learner_step_trains_the_same_both_ways(tmp_path, capsys):
    """`prl bench memory --learner`: the step in blocks and on the whole logits, each in its own
    process, with the same loss and gradient norm (blocks change memory, not the update)."""
    import json

    argv = ["bench", "memory", "--learner", "--rollouts", "3", "--completion-tokens", "20", "--json", str(tmp_path / "m.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "blocks (now)" in out and "whole (before)" in out and "the same both ways: True" in out
    stored = json.loads((tmp_path / "m.json").read_text())
    assert stored["same_loss_and_grad_norm"] is True
    assert all(stored[way]["peak_mb"] >= stored[way]["before_step_mb"] > 0 for way in ("blocks", "whole"))


def test_the_archive_benchmark_reads_the_same_outcomes_both_ways(tmp_path, capsys):
    """`prl bench archive`: statistics, one problem and the groups streamed a file at a time find
    what reading the archive whole finds, each way in its own process."""
    import json

    assert main(["bench", "archive", "--groups", "40", "--tokens", "16", "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "report, whatif (every outcome)" in out and "train, publish (every group)" in out and "both ways: True" in out
    stored = json.loads((tmp_path / "a.json").read_text())
    assert stored["same_results"] is True and stored["files"] == 3
    assert all(stored[way]["peak_mb"] >= stored[way]["imports_mb"] > 0 for way in ("outcomes", "problem_whole"))


def test_the_learning_benchmark_sets_each_strategy_beside_its_baselines(capsys, tmp_path):
    """One short run per strategy: the table of medians, and every strategy against uniform
    and DAPO in the same output, the runs in its --json."""
    import json

    out_json = tmp_path / "l.json"
    assert main(["bench", "learning", "--seeds", "1", "--strategies", "uniform", "dapo_filter", "default", "--rollouts", "600",
                 "--jobs", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "against uniform:" in out and "against dapo_filter:" in out
    stored = json.loads(out_json.read_text())
    assert {r["strategy"] for r in stored["runs"]} == {"uniform", "dapo_filter", "default"}
    assert all(r["rollouts"] >= 600 and r["curve"][0][0] == 0 for r in stored["runs"])


def test_compare_prints_stored_runs_side_by_side_and_draws_into_a_new_folder(tmp_path, capsys, monkeypatch):
    """`prl bench real --compare`: one row per stored run, read from its --json file, and the
    curves drawn where asked, its folder made; by default under runs/, never into the repo's docs."""
    from pathlib import Path

    stored = Path(__file__).parents[2] / "benchmarks/results/real-15min-none.json"
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "real", "--compare", str(stored)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("real-15min-none"))
    assert row.split()[3:6] == ["0.465", "0.475", "10.3"]  # end, best, at (minutes)
    # sqrt(0.465 x 0.535 / 200) = 3.5 points: what one evaluation can tell apart
    assert "200 problems at 0.465 has a standard error of 3.5 points; two runs' difference 5.0" in out
    assert (tmp_path / "runs/bench-real-curve.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("expression, kind", [("56 + 47", "sum"), ("59 - 35", "difference, no borrow"),
                                              ("83 - 29", "difference, borrow"), ("5 - 9", "difference < 0"),
                                              ("7 - 7", "difference, no borrow"), ("1 + 2 - 3", "other")])
def test_a_chain_sum_problem_is_classed_by_what_it_asks(expression, kind):
    from benchmarks.real import answer_kind

    assert answer_kind(expression) == kind


def test_where_it_learned_is_a_row_per_kind_averaged_over_the_runs():
    from benchmarks.real import kinds_table

    runs = [{"by_kind": {"sum": {"heldout": 97, "start": 0.2, "end": 0.7, "train_completions": 900, "train_solved": 0.4},
                         "difference < 0": {"heldout": 50, "start": 0.0, "end": 0.0, "train_completions": 400,
                                            "train_solved": 0.0}}},
            {"by_kind": {"sum": {"heldout": 97, "start": 0.2, "end": 0.8, "train_completions": 800, "train_solved": 0.5},
                         "difference < 0": {"heldout": 50, "start": 0.0, "end": 0.0, "train_completions": 0,
                                            "train_solved": None}}}]
    lines = kinds_table(runs).splitlines()
    assert lines[1].split() == ["sum", "97", "0.200", "0.750", "0.450"]
    assert lines[2].split() == ["difference", "<", "0", "50", "0.000", "0.000", "0.000"]
