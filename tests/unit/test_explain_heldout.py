"""`prl explain` of a held-out problem: it was said to be no training problem, with ids it
might have meant; it is the fleet's evaluation answers of it, version by version."""

import json
import os

from prl.cli.explain import heldout_history
from prl.scheduler.evaluation import answers_uri


def write_evaluation(run_dir: str, version: int, rewards: dict[str, float]) -> None:
    path = answers_uri(run_dir, version)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for pid, reward in rewards.items():
            f.write(json.dumps({"problem_id": pid, "difficulty": 1, "answer": "7", "reward": reward,
                                "text": f"the answer is\n {reward}"}) + "\n")


def test_a_held_out_problem_shows_its_answers_at_each_evaluated_version(tmp_path):
    run = str(tmp_path)
    for v in range(0, 150, 10):  # 15 evaluations, graded rewards
        write_evaluation(run, v, {"q1": 0.5, "q2": min(1.0, v / 100)})
    lines = heldout_history(run, "q2", threshold=0.75, shown=12)
    assert lines[0] == "q2 is a held-out problem: evaluated greedily by the fleet, never trained"
    assert lines[1] == "  answer '7'; solved at 7 of 15 evaluated versions; the last 12:"  # 80, 90, ..., 140
    assert lines[2] == "    v30: reward 0.3: the answer is 0.3" and lines[-1] == "    v140: reward 1: the answer is 1.0"
    assert len(lines) == 2 + 12


def test_before_any_evaluation_it_says_so(tmp_path):
    assert heldout_history(str(tmp_path), "q1", threshold=1.0)[1] == "  no evaluation written yet (<run_dir>/evaluations/)"
