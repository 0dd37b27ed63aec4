"""Every `prl bench` entry runs at a small size and stores its figures, so the command behind a
README or RESULTS figure cannot break unseen. Sizes are chosen for seconds, not for figures."""

import json

import pytest

from prl.cli import main
from benchmarks.real import KINDS
from prl.cli.parser import BENCHMARKS

pytestmark = pytest.mark.slow

SMALL = {
    "scheduler": ["--problems", "2000", "--rounds", "5", "--naive-rounds", "2", "--batch", "16"],
    "replay": ["--capacity", "2000", "--fresh", "200", "--steps", "5", "--naive-steps", "1"],
    "producer": pytest.param(["--prompts", "4", "--group-size", "2", "--max-tokens", "4", "--calls", "1"],
                             marks=pytest.mark.vllm),
    "learner": ["--steps", "2", "--rollouts", "8", "--micro", "512"],
    "system": pytest.param(["--groups", "10", "--tokens", "100", "--messages", "200", "--repeats", "1", "--params-m", "1",
                            "--steps", "3", "--warmup", "1", "--latency", "0.05"], marks=pytest.mark.kafka),
    "scale": pytest.param(["--producers", "1", "--seconds", "3", "--tokens", "50", "--max-in-flight", "64",
                           "--groups-per-batch", "4", "--modes", "copy", "claim_check"], marks=pytest.mark.kafka),
    "weights": ["--steps", "2", "--lr", "1e-5"],
    "snapshots": ["--buffer", "400", "--tokens", "50", "--fresh", "32", "--problems", "100", "--steps", "2"],
    "rewards": ["--groups", "2", "--group-size", "4", "--latency-ms", "5", "--calls", "1"],
    "faults": pytest.param(["--runs", "1", "--fault-seconds", "6"], marks=pytest.mark.kafka),
    "real": pytest.param(["--seeds", "1", "--minutes", "0.5", "--long-tokens", "0", "--set", 'producer.backend="transformers"'],
                         marks=pytest.mark.real),
}
ELSEWHERE = {  # entries whose small-size test lives beside their other tests
    "learning": "tests/unit/test_bench_args.py", "memory": "tests/unit/test_bench_args.py",
    "archive": "tests/unit/test_bench_args.py", "gpu": "tests/unit/test_bench_gpu.py",
    "checkpoint": "below: test_the_checkpoint_benchmark_runs_the_learner_both_ways_on_both_stores",
}


def test_every_benchmark_has_a_small_size_test():
    assert set(SMALL) | set(ELSEWHERE) == set(BENCHMARKS)


@pytest.mark.parametrize("args", list(SMALL.values()), ids=list(SMALL))
def test_a_benchmark_runs_at_a_small_size_and_stores_its_figures(request, tmp_path, capsys, args):
    name = request.node.callspec.id
    if name == "real":  # an instruct model of the test suite's own, with a chat template
        from tests.support.chat_model import make_chat_model

        args = [*args, "--model-dir", str(make_chat_model(tmp_path / "model")), "--png", str(tmp_path / "curve.png")]
    out = tmp_path / f"{name}.json"
    assert main(["bench", name, *args, "--json", str(out)]) == 0
    stored = json.loads(out.read_text())
    assert stored["code"]["commit"] and stored["machine"]["cores"] >= 1
    assert capsys.readouterr().out.strip()  # it printed its figures
    if name == "real":  # where it learned, from the evaluations' answers: every held-out problem has its kind
        by_kind = stored["runs"][0]["by_kind"]
        assert by_kind and sum(k["heldout"] for k in by_kind.values()) == 200 and set(by_kind) < {*KINDS, "other"}
        assert "run_finished" in (tmp_path / "bench-real.log").read_text()  # the runs' details, beside the curves


@pytest.mark.real
def test_the_real_benchmark_runs_the_tool_using_task(tmp_path, capsys):
    """`prl bench real --task calculator`: episodes with the calculator, at a small size (a
    context of 1,024 characters: the calculator's instructions and a turn or two fit)."""
    from tests.support.chat_model import make_chat_model

    out = tmp_path / "calculator.json"
    assert main(["bench", "real", "--task", "calculator", "--seeds", "1", "--minutes", "0.5", "--set",
                 'producer.backend="transformers"', "--model-dir", str(make_chat_model(tmp_path / "model", max_len=1024)),
                 "--png", str(tmp_path / "curve.png"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["runs"][0]["steps"] >= 0
    assert "calculator" in capsys.readouterr().out


def test_the_checkpoint_benchmark_runs_the_learner_both_ways_on_both_stores(tmp_path, capsys):
    """`prl bench checkpoint`: the learner with its checkpoints written in the background and in
    the step, on local disk and an S3 server, each in its own process, every checkpoint counted."""
    assert main(["bench", "checkpoint", "--steps", "1", "--checkpoint-every", "1", "--json", str(tmp_path / "c.json")]) == 0
    assert "in the step" in capsys.readouterr().out
    stored = json.loads((tmp_path / "c.json").read_text())
    for way in ("local/background", "local/in_step", "s3/background", "s3/in_step"):
        assert stored[way]["checkpoints"] == 1 and stored[way]["background"] == way.endswith("background")
    assert len(stored["s3/background"]["written_s"]) == 1
