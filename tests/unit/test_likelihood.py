"""Difficulty groups without a label (prl/tasks/likelihood.py, `prl data likelihood`,
scheduler.priority.groups_path)."""

import json
import math

import numpy as np
import pytest

from prl.cli import main
from prl.generation import Request, TransformersBackend
from prl.tasks import addition
from prl.tasks.addition import Problem
from prl.tasks.datasets import DatasetError
from prl.tasks.likelihood import answer_logprobs, quantile_bins, read_groups, write_groups
from prl.schemas import Sampling
from prl.schemas.config import ConfigError, load_config
from tests.support.chat_model import make_chat_model


@pytest.fixture(scope="module")
def tiny():
    backend = TransformersBackend.from_path("builtin:tiny-adder")
    return backend


def sampled_answers(backend, prompts, chat, temperature, n=6):
    """Problems whose answer is a completion the backend sampled and ended itself, with the
    log-probability the backend reported for it."""
    sampling = Sampling(temperature, 1.0, 8, [])
    out = backend.generate([Request(backend.encode(p, chat), n, sampling) for p in prompts])
    problems, logps = [], []
    for prompt, group in zip(prompts, out):
        for c in group:
            text = backend.decode(c.token_ids)
            if c.finish_reason == "stop" and text and backend.tokenizer(text, add_special_tokens=False)["input_ids"] == c.token_ids[:-1]:
                problems.append(Problem(f"p{len(problems)}", prompt, text, 1, chat=chat))
                logps.append(sum(c.logprobs))
    return problems, np.asarray(logps)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_score_is_the_producers_own_probability_of_writing_the_answer(tiny, temperature):
    prompts = [p.prompt for p in addition.train_pool([10, 10, 10, 0], seed=3)]
    problems, logps = sampled_answers(tiny, prompts, False, temperature)
    assert len(problems) > 40
    scores = answer_logprobs(tiny.model, tiny.tokenizer, problems, temperature, batch_size=7)  # ragged batches, padded
    np.testing.assert_allclose(scores, logps, atol=2e-4)


def test_chat_prompts_are_scored_after_the_chat_template(tmp_path):
    backend = TransformersBackend.from_path(str(make_chat_model(tmp_path / "chat")))
    prompts = [json.dumps([{"role": "user", "content": f"What is {a}+{a}?"}]) for a in range(6)]
    problems, logps = sampled_answers(backend, prompts, True, 1.0, n=64)  # random weights: few stop
    assert len(problems) >= 5
    np.testing.assert_allclose(answer_logprobs(backend.model, backend.tokenizer, problems), logps, atol=2e-4)


def test_on_the_builtin_task_the_score_ranks_problems_as_sampling_does(tiny):
    """exp(score) is the chance one sampled completion is the answer: it follows the sampled
    success rate, without a difficulty label."""
    pool = addition.train_pool([10, 20, 10, 0], seed=5)
    scores = answer_logprobs(tiny.model, tiny.tokenizer, pool)
    out = tiny.generate([Request(tiny.encode(p.prompt), 64, Sampling(1.0, 1.0, 8, [])) for p in pool])
    rate = np.asarray([np.mean([addition.exact_match(tiny.decode(c.token_ids), p.answer) for c in g]) for p, g in zip(pool, out)])
    assert np.corrcoef(np.exp(scores), rate)[0, 1] > 0.9
    assert np.all(np.exp(scores[[p.difficulty == 3 for p in pool]]) < 0.01)  # never solved at the start, never likely


def test_quantile_bins_are_equal_sized_in_score_order_and_keep_ties_together():
    scores = np.random.default_rng(0).normal(size=1000)
    bins = quantile_bins(scores, 8)
    assert sorted(np.bincount(bins)) == [125] * 8
    order = np.argsort(scores)
    assert np.all(np.diff(bins[order]) >= 0)  # a higher score is never in a lower bin
    tied = quantile_bins(np.asarray([0.0] * 6 + [1.0, 2.0]), 4)
    assert len(set(tied[:6])) == 1 and tied[7] >= tied[6] > tied[0]


@pytest.mark.parametrize("name", ["g.parquet", "g.jsonl"])
def test_groups_file_round_trip_and_refuses_a_file_for_other_problems(tmp_path, name):
    uri = str(tmp_path / name)
    write_groups(uri, ["a", "b", "c"], np.asarray([-1.0, -2.0, -3.0]), np.asarray([2, 1, 0]))
    assert read_groups(uri, ["c", "a"])[0] == ["0", "2"]
    np.testing.assert_allclose(read_groups(uri, ["c", "a"])[1], [-3.0, -1.0])
    with pytest.raises(DatasetError, match=r"no group for 1 of the 2 training problems \(first: 'z'\); make it for this "
                                           r"task with `prl data likelihood"):
        read_groups(uri, ["a", "z"])
    with pytest.raises(DatasetError, match="no such file .*scheduler.priority.groups_path"):
        read_groups(str(tmp_path / "none.parquet"), ["a"])
    bad = str(tmp_path / ("bad" + name[1:]))
    write_groups(bad, ["a", "b"], np.asarray([-1.0, float("nan")]), np.asarray([1, 0]))
    with pytest.raises(DatasetError, match=r"row 2: answer_logprob nan is not a log-probability"):
        read_groups(bad, ["a", "b"])


def test_expected_success_is_each_groups_mean_chance_of_the_answer():
    from prl.tasks.likelihood import expected_success

    start = expected_success(np.log([0.5, 0.1, 0.3, 1e-9]), np.asarray([1, 0, 1, 0]), 3)
    np.testing.assert_allclose(start, [0.05, 0.4, 0.0], atol=1e-8)  # group 2 has no problem: 0


def test_groups_path_needs_the_group_prior():
    with pytest.raises(ConfigError, match="groups_path needs scheduler.priority.prior = 'group'"):
        load_config(overrides=["scheduler.priority.groups_path='g.parquet'", "scheduler.priority.prior='flat'"])


def test_cli_writes_groups_the_scheduler_uses(tmp_path, capsys):
    from prl.scheduler.service import problem_groups
    from prl.tasks import train_problems

    out = str(tmp_path / "groups.jsonl")
    assert main(["data", "likelihood", "--out", out, "--bins", "4", "--set", "task.train_per_digit=[10, 20, 20]"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 50 problems scored" in printed and f"groups_path='{out}'" in printed
    cfg = load_config(overrides=["task.train_per_digit=[10, 20, 20]", f"scheduler.priority.groups_path='{out}'"])
    problems = train_problems(cfg.task)
    names, labels, start = problem_groups(cfg, problems)
    assert names == ["0", "1", "2", "3"] and set(np.bincount(labels)) <= {12, 13}
    by_digits = {d: {names[g] for g, p in zip(labels, problems) if p.difficulty == d} for d in (1, 2, 3)}
    assert by_digits[3] <= {"0", "1"} and "3" not in by_digits[3]  # the 3-digit sums are the least likely
    assert np.all(np.diff(start) >= 0) and start[0] < 0.01 < start[3]  # each bin starts at its expected success
    no_start = load_config(overrides=["task.train_per_digit=[10, 20, 20]", f"scheduler.priority.groups_path='{out}'",
                                      "scheduler.priority.score_start=false"])
    assert problem_groups(no_start, problems)[2] is None
    assert main(["data", "likelihood", "--out", out, "--model", str(tmp_path / "nomodel")]) == 2
    assert "nomodel" in capsys.readouterr().err
    assert main(["data", "likelihood", "--out", str(tmp_path / "groups.csv")]) == 2
    assert "groups.csv: unknown format (name it .parquet or .jsonl)" in capsys.readouterr().err


def test_the_benchmarks_rank_correlation_gives_ties_their_mean_rank():
    from benchmarks.likelihood import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([0, 0, 1, 2], [0, 0, 5, 9]) == pytest.approx(1.0)  # tied at the bottom on both sides
    assert math.isnan(spearman([1, 2, 3], [0, 0, 0]))


def test_a_reasoning_gym_ground_truth_is_scored_as_the_answer_a_completion_writes():
    from prl.rewards import answer_text

    truth = json.dumps({"answer": "85", "task": "chain_sum", "settings": {}, "entry": {"question": "69 + 16 =", "answer": "85"}})
    assert answer_text(truth) == "85"
    assert answer_text("15") == "15" and answer_text("{not json") == "{not json" and answer_text('{"x": 1}') == '{"x": 1}'
    tokenizer = TransformersBackend.from_path("builtin:tiny-adder").tokenizer
    from prl.tasks.likelihood import answer_token_ids

    _, ids = answer_token_ids(tokenizer, Problem("p", "69+16=", json.dumps({"answer": "58"}), 2))
    assert ids == tokenizer("58", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
