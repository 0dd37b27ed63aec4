"""A finished evaluation's answers in the run directory (scheduler/evaluation.py): one JSON line
per held-out problem, in order; a write that fails is logged and costs the run nothing."""

import json
from types import SimpleNamespace

import structlog

from prl.scheduler import evaluation
from prl.scheduler.evaluation import Evaluator, answers_uri
from prl.schemas import EvalResult

PROBLEMS = [SimpleNamespace(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1), difficulty=1 + i % 2, chat=False,
                            env_args="") for i in range(5)]


def evaluator(run_dir: str, emitted: list) -> tuple[Evaluator, list]:
    cfg = SimpleNamespace(run=SimpleNamespace(run_dir=run_dir), learner=SimpleNamespace(eval_every=10, max_steps=100),
                          sampling=SimpleNamespace(max_tokens=4))
    sent = []
    return Evaluator(PROBLEMS, cfg, sent.append, lambda values, **_: emitted.append(values),
                     structlog.get_logger("test")), sent


def answer_all(ev: Evaluator, sent: list) -> None:
    for request in sent:
        ids = [p.problem_id for p in request.problems]
        ev.accept(EvalResult(request.request_id, request.version, "p0", ids, [float(int(i[1:]) % 2) for i in ids],
                             [f"answer to {i}" for i in ids]))


def test_the_answers_of_a_finished_evaluation_are_written_in_heldout_order(tmp_path):
    emitted = []
    ev, sent = evaluator(str(tmp_path / "run"), emitted)
    ev.start(20, rollouts_generated=0)
    answer_all(ev, list(reversed(sent)))
    lines = [json.loads(line) for line in open(answers_uri(str(tmp_path / "run"), 20))]
    assert lines == [{"problem_id": p.id, "difficulty": p.difficulty, "answer": p.answer, "reward": float(i % 2),
                      "text": f"answer to {p.id}"} for i, p in enumerate(PROBLEMS)]
    assert ev.evaluations[20].texts == {}  # not kept once written


def test_a_failed_write_is_logged_and_the_figures_still_go_out(tmp_path, monkeypatch):
    def refuse(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluation, "replace_file", refuse)
    emitted = []
    ev, sent = evaluator(str(tmp_path / "run"), emitted)
    ev.start(0, rollouts_generated=0)
    with structlog.testing.capture_logs() as logs:
        answer_all(ev, sent)
    assert ev.evaluations[0].outcome == "done" and "accuracy" in emitted[0]
    warning = next(e for e in logs if e["event"] == "evaluation_answers_not_written")
    assert "No space left on device" in warning["error"] and warning["uri"].endswith("step-00000000.jsonl")
