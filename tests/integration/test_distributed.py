"""The learner under torchrun with 2 CPU ranks (gloo, FSDP2) against one process, on the
same batches: losses and updated weights agree, with checkpoints written in the step or in the
background, and a 2-rank checkpoint resumes on 1 rank; with --http, rank 0 alone serves it;
stopped by SIGTERM, the ranks checkpoint the same last step."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from prl.learner.sources import write_batches
from prl.schemas import TrainBatch
from tests.support.servers import free_port, wait_until
from tests.unit.test_grpo import random_rollouts
from tests.unit.test_service_loop import get

pytestmark = pytest.mark.slow
TOL = 2e-5  # float32, different reduction order across ranks


def make_batches(path):
    batches = [TrainBatch(f"b{i}", i, 0, 0, random_rollouts(12, seed=100 + i)) for i in range(3)]
    write_batches(str(path), batches)


def learner_command(tmp_path, run_dir, world, max_steps, *extra, cli=("-m", "prl.cli"), checkpoint_every=1):
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
checkpoint_every = {checkpoint_every}
micro_batch_tokens = 64
max_steps = {max_steps}
""")
    args = [*cli, "learner", "--config", str(config), "--batches-from", str(tmp_path / "batches.arrow"), *extra]
    if world == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "prl.learner.torchrun", f"--nproc_per_node={world}", "--standalone",
            "--shutdown-timeout=120", *args]


def run_learner(tmp_path, run_dir, world, max_steps, background=False):
    cli = (support("background_learner.py"),) if background else ("-m", "prl.cli")
    out = subprocess.run(learner_command(tmp_path, run_dir, world, max_steps, cli=cli), capture_output=True, text=True,
                         timeout=300, env=own_temp_dir(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))  # torchrun's log directory went with it
    return out.stderr


def own_temp_dir(tmp_path) -> dict:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def support(script: str) -> str:
    return str(Path(__file__).parents[1] / "support" / script)


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
    """The 2 ranks write each checkpoint in the background (as on GPUs) and agree on its files
    before it becomes the latest; the resumed run's 2 ranks write theirs in the step (a CPU's way)."""
    make_batches(tmp_path / "batches.arrow")
    single, double, resumed = tmp_path / "single", tmp_path / "double", tmp_path / "resumed"
    run_learner(tmp_path, single, 1, 3)
    log = run_learner(tmp_path, double, 2, 10, background=True)  # ends at its batch file's end, the ranks together
    assert '"world": 2' in log and '"where": "background"' in log  # the memory report of a sharded rank
    a, b = losses(single), losses(double)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5, abs=1e-7)
    assert_close(weights(single, 3), weights(double, 3))
    shards = sorted(p.name for p in (double / "checkpoints" / "step-00000003").glob("optimizer-*"))
    assert shards == ["optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"]
    assert json.loads((double / "checkpoints" / "latest").read_text())["name"] == "step-00000003"
    rows = [json.loads(line) for line in (double / "metrics-learner.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if "learner/checkpoint_write_seconds" in r) == [1, 2, 3]

    # 2 ranks train steps 1-2, then one process resumes and trains step 3.
    assert '"where": "in the step"' in run_learner(tmp_path, resumed, 2, 2)
    run_learner(tmp_path, resumed, 1, 3)
    assert losses(resumed)[3] == pytest.approx(a[3], rel=1e-5, abs=1e-7)
    assert_close(weights(single, 3), weights(resumed, 3))


def test_two_ranks_in_one_pod_answer_health_on_one_port_and_checkpoint_when_stopped(tmp_path):
    """The ranks of a pod share its network: rank 0 alone serves --http (rank 1 binding the
    same port took the job down), and answers for the learner until it is stopped. SIGTERM to
    torchrun (a pod's end) three steps past the last checkpoint stops both ranks after the
    same step, they checkpoint it together, and prl.learner.torchrun exits 143 without a
    traceback; a step of rank 0 that failed on the transport meanwhile put them out of step in
    no way."""
    make_batches(tmp_path / "batches.arrow")
    port, run_dir = free_port(), tmp_path / "run"
    cmd = learner_command(tmp_path, run_dir, 2, 10, "--http", f"127.0.0.1:{port}", cli=(support("waiting_learner.py"),),
                          checkpoint_every=10)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=own_temp_dir(tmp_path))
    try:
        def trained_three():
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                healthy = json.loads(get(f"http://127.0.0.1:{port}/health")[1])["status"] == "ok"
            except OSError:
                return False
            return healthy and (run_dir / "metrics-learner.jsonl").exists() and 3 in losses(run_dir)
        wait_until(trained_three, 240, "the 2-rank learner to train 3 steps and answer /health")
        assert not (run_dir / "checkpoints" / "latest").exists()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 143 and "Traceback" not in output, output[-3000:]  # a stop, not a failure
        wait_until(lambda: not ranks_of(tmp_path) and not list((tmp_path / "tmp").glob("torchelastic_*")), 30,
                   "both ranks to exit and torchrun's log directory to go")
    finally:
        proc.kill()  # torchrun's workers are in sessions of their own: what is left of them goes by PID
        for pid in ranks_of(tmp_path):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert '"checkpointing_before_stop"' in output and '"injected: the broker is away' in output, output[-3000:]
    assert json.loads((run_dir / "checkpoints" / "latest").read_text())["name"] == "step-00000003"
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "step-00000003").glob("optimizer-*"))
    assert shards == ["optimizer-00000-of-00002.safetensors", "optimizer-00001-of-00002.safetensors"]


def ranks_of(tmp_path) -> list[int]:
    """The PIDs of the learner processes started with this test's config."""
    marker = str(tmp_path / "learner.toml").encode()
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes()
        except OSError:  # gone meanwhile
            continue
        if marker in args and b"prl.cli" in args:
            pids.append(int(cmdline.parent.name))
    return pids
