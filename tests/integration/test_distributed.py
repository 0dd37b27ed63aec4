"""The learner under torchrun with 2 CPU ranks (gloo, FSDP2) against one process, on the
same batches: losses and updated weights agree, and a 2-rank checkpoint resumes on 1 rank."""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from prl.learner.sources import write_batches
from prl.schemas import TrainBatch
from tests.unit.test_grpo import random_rollouts

pytestmark = pytest.mark.slow
TOL = 2e-5  # float32, different reduction order across ranks


def make_batches(path):
    batches = [TrainBatch(f"b{i}", i, 0, 0, random_rollouts(12, seed=100 + i)) for i in range(3)]
    write_batches(str(path), batches)


def run_learner(tmp_path, run_dir, world, max_steps):
    config = tmp_path / "learner.toml"
    config.write_text(f"""
[run]
run_dir = "{run_dir}"
log_format = "json"
threads = 1
[scheduler]
tau_max = 100
[learner]
lr = 1e-3
eval_every = 0
checkpoint_every = 1
micro_batch_tokens = 64
max_steps = {max_steps}
""")
    args = ["-m", "prl.cli", "learner", "--config", str(config), "--batches-from", str(tmp_path / "batches.arrow")]
    if world == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}", "--standalone", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stderr


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics-learner.jsonl").read_text().splitlines()]
    return {r["step"]: r["learner/loss"] for r in rows if "learner/loss" in r}


def weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def assert_close(a, b):
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < TOL, worst


def test_two_ranks_match_one_process_and_resume_on_one(tmp_path):
    make_batches(tmp_path / "batches.arrow")
    single, double, resumed = tmp_path / "single", tmp_path / "double", tmp_path / "resumed"
    run_learner(tmp_path, single, 1, 3)
    log = run_learner(tmp_path, double, 2, 3)
    assert '"world": 2' in log  # the memory report of a sharded rank
    a, b = losses(single), losses(double)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-7)
    assert_close(weights(single, 3), weights(double, 3))
    shards = sorted(p.name for p in (double / "checkpoints" / "step-00000003").glob("optimizer-*"))
    assert shards == ["optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"]

    # 2 ranks train steps 1-2, then one process resumes and trains step 3.
    run_learner(tmp_path, resumed, 2, 2)
    run_learner(tmp_path, resumed, 1, 3)
    assert losses(resumed)[3] == pytest.approx(a[3], rel=1e-5, abs=1e-7)
    assert_close(weights(single, 3), weights(resumed, 3))
