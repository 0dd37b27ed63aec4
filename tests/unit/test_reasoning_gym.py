"""`prl data reasoning-gym` and the reward that scores with the generator's own checker."""

import json
import re

import pyarrow.parquet as pq
import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed: pip install -e '.[real]'")

from prl.rewards import final_answers, reasoning_gym  # noqa: E402
from prl.tasks.datasets import load_problems  # noqa: E402
from prl.tasks.reasoning_gym import DataError, make_rows, unordered_key, write_dataset  # noqa: E402


def test_unordered_key_puts_swapped_twins_together():
    a = "Find the GCD of these numbers: 12, 30. Give only the GCD."
    b = "Find the GCD of these numbers: 30, 12. Give only the GCD."
    assert unordered_key(a) == unordered_key(b)
    assert unordered_key(a) != unordered_key(a.replace("12", "13"))


def test_train_and_test_share_no_problem_nor_swapped_twin(tmp_path):
    """gcd of numbers <= 30 is a small space (465 unordered pairs): repeats and swapped twins
    are common, and none may cross the split."""
    s = write_dataset("gcd", 200, 60, seed=3, out_dir=tmp_path, settings={"max_value": 30})
    assert (s.train, s.test) == (200, 60) and s.duplicates > 0
    train, test = (pq.read_table(tmp_path / f"{n}.parquet").to_pylist() for n in ("train", "test"))
    question = lambda r: r["prompt"][-1]["content"]  # noqa: E731
    assert not {unordered_key(question(r)) for r in train} & {unordered_key(question(r)) for r in test}
    assert len({question(r) for r in train + test}) == 260
    row = train[0]
    assert row["data_source"] == "reasoning_gym/gcd" and row["prompt"][0]["role"] == "system"
    assert row["difficulty"] == "num_terms=2,value=1-30"
    truth = json.loads(row["reward_model"]["ground_truth"])
    assert truth["answer"] == row["extra_info"]["answer"] and truth["settings"] == {"max_value": 30}
    meta = json.loads((tmp_path / "dataset.json").read_text())
    assert meta["seed"] == 3 and meta["reward"] == "prl.rewards:reasoning_gym"


def test_rows_load_as_chat_problems_grouped_by_difficulty(tmp_path):
    write_dataset("chain_sum", 40, 10, seed=0, out_dir=tmp_path,
                  settings={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1})
    problems = load_problems(str(tmp_path / "train.parquet"), group_field="difficulty")
    assert len(problems) == 40 and all(p.chat for p in problems)
    assert {p.group for p in problems} == {"num_digits=1,num_terms=2", "num_digits=1,num_terms=3"}
    assert json.loads(problems[0].prompt)[-1]["role"] == "user"


def test_same_seed_same_data(tmp_path):
    a = make_rows("gcd", 30, 10, seed=5, settings={})
    b = make_rows("gcd", 30, 10, seed=5, settings={})
    assert a == b


@pytest.mark.parametrize("task, train, settings, message", [
    ("gcdd", 3, {}, "unknown reasoning-gym task 'gcdd' (did you mean gcd?)"),
    ("gcd", 3, {"max_valu": 10}, "settings {'max_valu': 10} rejected by the generator"),
    ("gcd", 500, {"max_value": 5}, "ask for fewer or widen the generator's settings"),
])
def test_impossible_requests_say_what_to_change(task, train, settings, message):
    with pytest.raises(DataError, match=re.escape(message)):
        make_rows(task, train, 1, seed=0, settings=settings)


def test_reward_uses_the_checker_and_counts_only_full_marks():
    (row,), _, _, _ = make_rows("gcd", 1, 0, seed=1, settings={"max_value": 30})
    truth = row["reward_model"]["ground_truth"]
    answer = row["extra_info"]["answer"]
    assert reasoning_gym(answer, truth) == 1.0
    assert reasoning_gym(f" {answer}\n", truth) == 1.0
    assert reasoning_gym(f"The GCD is {answer}", truth) == 1.0  # the last number is the final answer
    assert reasoning_gym(f"<answer>{answer}</answer>", truth) == 1.0
    assert reasoning_gym(f"{answer} or maybe 999", truth) == 0.0
    assert reasoning_gym("", truth) == 0.0
    # reasoning-gym gives partial credit when the answer is inside a longer text; it counts as wrong.
    assert final_answers("x 1.") == ["x 1.", "1"]


def test_cli_makes_data_and_reports_errors_in_one_line(tmp_path, capsys):
    from prl.cli import main

    assert main(["data", "reasoning-gym", "gcd", "--train", "20", "--test", "5", "--out", str(tmp_path / "d"),
                 "--set", "max_value=50"]) == 0
    out = capsys.readouterr().out
    assert "train.parquet (20 problems)" in out and "prl.rewards:reasoning_gym" in out
    assert main(["data", "reasoning-gym", "nosuch", "--train", "2", "--test", "1", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown reasoning-gym task 'nosuch'" in err


def test_cli_without_a_test_set_suggests_a_run_without_evaluation(tmp_path, capsys):
    """--test 0: the suggested command names no held-out file (an empty one would stop the run)."""
    from prl.cli import main

    assert main(["data", "reasoning-gym", "gcd", "--train", "5", "--test", "0", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "task.train_path=" in out and "heldout_path" not in out
