"""On a CUDA GPU: the learner's step gives the CPU's loss, its log-probs in blocks give the
whole logits', FSDP2 runs under torchrun, the transformers producer's behaviour log-probs match
the learner's, and `prl run` learns.

Collected everywhere, skipped where torch sees no GPU (tests/conftest.py); tools/gpu_check.sh
runs them on a GPU machine. Figures worth reading (the log-prob gap, the held-out gain) are
recorded as junit properties: `pytest -m gpu --junitxml=...` keeps them."""

import json
import subprocess
import sys

import pytest
import torch

from prl.learner.sources import write_batches
from prl.schemas import TrainBatch
from prl.schemas.config import LearnerConfig
from tests.unit.test_grpo import random_rollouts

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def one_step(device, bf16: bool, seed: int = 3):
    """(loss, updated weights on the host) of one learner step of the tiny model on ``device``."""
    from prl.learner.train import make_optimizer, train_step
    from prl.models import load_model

    cfg = LearnerConfig(lr=1e-3, bf16_autocast=bf16, micro_batch_tokens=64)
    model = load_model("builtin:tiny-adder").to(device)
    optimizer = make_optimizer(model, cfg)
    metrics = train_step(model, optimizer, random_rollouts(12, seed=seed), cfg)
    assert all(s["exp_avg"].device == device for s in optimizer.state.values())  # AdamW state lives beside the weights
    return metrics["loss"], {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_a_learner_step_on_the_gpu_gives_the_cpus_loss(record_property):
    cpu_loss, cpu_weights = one_step(torch.device("cpu"), bf16=False)
    fp32_loss, fp32_weights = one_step(CUDA, bf16=False)
    bf16_loss, _ = one_step(CUDA, bf16=True)
    record_property("loss_cpu_fp32", cpu_loss)
    record_property("loss_gpu_fp32", fp32_loss)
    record_property("loss_gpu_bf16", bf16_loss)
    assert fp32_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)
    assert bf16_loss == pytest.approx(cpu_loss, rel=2e-2, abs=2e-3)  # bf16 keeps 8 bits of mantissa
    worst = max((fp32_weights[k] - cpu_weights[k]).abs().max().item() for k in cpu_weights)
    record_property("weights_gpu_fp32_max_abs_diff", worst)
    assert worst < 1e-4


def run_learner(tmp_path, run_dir, torchrun: bool) -> dict[int, float]:
    """The learner service on the GPU from a batch file, plainly or under torchrun (one rank:
    FSDP2 over one GPU, NCCL); its losses by step."""
    config = tmp_path / f"{run_dir.name}.toml"
    config.write_text(f'[run]\nrun_dir = "{run_dir}"\ndevice = "cuda"\n[scheduler]\ntau_max = 100\n'
                      "[learner]\nlr = 1e-3\neval_every = 0\ncheckpoint_every = 2\nmicro_batch_tokens = 64\nmax_steps = 3\n")
    args = ["-m", "prl.cli", "learner", "--config", str(config), "--batches-from", str(tmp_path / "batches.arrow")]
    launcher = ["-m", "prl.learner.torchrun", "--standalone", "--nproc_per_node=1"] if torchrun else []
    out = subprocess.run([sys.executable, *launcher, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics-learner.jsonl").read_text().splitlines()]
    return {r["step"]: r["learner/loss"] for r in rows if "learner/loss" in r}


def test_the_learner_knows_how_much_memory_its_gpu_has():
    from prl.devices import memory_bytes

    assert memory_bytes(CUDA) == torch.cuda.mem_get_info(CUDA)[1] > 0


def test_log_probs_in_blocks_on_the_gpu_give_the_whole_logits(monkeypatch, record_property):
    """Under bf16 autocast, as the GPU learner computes: checkpointed blocks of the output layer
    against its whole logits, in value and in gradient."""
    import prl.learner.train as train
    from tests.unit.test_logprob_blocks import VOCAB, batch, tiny_model, value_and_grads, whole_logits

    model, b = tiny_model("qwen3").to(CUDA), batch().to(CUDA)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected, expected_grads = value_and_grads(whole_logits, model, b)
        monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)
        got, grads = value_and_grads(train.token_logprobs, model, b)
    gap = ((got - expected) * b.mask).abs().max().item()
    record_property("blocks_logprob_max_abs_gap", gap)
    assert gap < 1e-5
    # the output layer's weight gradient is a bf16 product per block, summed in float32: within
    # a bf16 rounding or two (2^-8 each) of the whole product's
    assert all((grads[n] - g).abs().max() <= 1e-2 * g.abs().max() for n, g in expected_grads.items())


def test_fsdp2_under_torchrun_on_one_gpu_trains_as_one_process(tmp_path):
    write_batches(str(tmp_path / "batches.arrow"), [TrainBatch(f"b{i}", i, 0, 0, random_rollouts(12, seed=100 + i))
                                                    for i in range(3)])
    plain = run_learner(tmp_path, tmp_path / "plain", torchrun=False)
    sharded = run_learner(tmp_path, tmp_path / "fsdp2", torchrun=True)
    assert sorted(plain) == sorted(sharded) == [1, 2, 3]
    for step in plain:
        assert sharded[step] == pytest.approx(plain[step], rel=1e-4, abs=1e-5)
    for run_dir in (tmp_path / "plain", tmp_path / "fsdp2"):  # checkpoints written in the background, as on every GPU
        assert json.loads((run_dir / "checkpoints" / "latest").read_text())["name"] == "step-00000003"
        rows = [json.loads(line) for line in (run_dir / "metrics-learner.jsonl").read_text().splitlines()]
        assert sorted(r["step"] for r in rows if "learner/checkpoint_write_seconds" in r) == [2, 3]


def test_generation_on_the_gpu_matches_the_learners_log_probs(record_property):
    """The transformers producer samples on the GPU in bf16; the learner scores the same tokens
    with float32 master weights of the same (bf16-rounded) values, under bf16 autocast as on a GPU
    it trains. The gap is the engine-trainer mismatch a version carries; it is reported."""
    from prl.generation import Request, TransformersBackend
    from prl.learner.train import pack, token_logprobs
    from prl.models import load_model
    from prl.schemas import Sampling, TrainRollout
    from prl.tasks.addition import heldout_set

    backend = TransformersBackend.from_path("builtin:tiny-adder", "bfloat16", CUDA)
    assert backend.device == CUDA and next(backend.model.parameters()).dtype == torch.bfloat16
    prompts = [backend.encode(p.prompt) for p in heldout_set(8, 4)]
    groups = backend.generate([Request(p, 4, Sampling(1.0, 1.0, 8, ())) for p in prompts])
    rollouts = [TrainRollout(f"{i}/{j}", "p", 0, False, 1.0, 0.0, 1.0, p, c.token_ids, c.logprobs)
                for i, (p, group) in enumerate(zip(prompts, groups)) for j, c in enumerate(group) if c.token_ids]
    learner = load_model("builtin:tiny-adder").to(CUDA)
    with torch.no_grad():
        for p in learner.parameters():
            p.copy_(p.to(torch.bfloat16))  # the weights a bf16 version carries, held in float32
    batch = pack(rollouts).to(CUDA)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        learner_logp = token_logprobs(learner, batch)
    gap = ((learner_logp - batch.behaviour_logp).abs() * batch.mask)
    mean_gap, max_gap = (gap.sum() / batch.mask.sum()).item(), gap.max().item()
    record_property("logprob_gap_mean", mean_gap)
    record_property("logprob_gap_max", max_gap)
    assert mean_gap < 0.05 and max_gap < 0.5


def test_prl_run_on_one_gpu_learns_the_built_in_task(tmp_path, record_property):
    """The main job on a one-GPU machine is the same command: learner and producer share the GPU."""
    from prl.cli import main

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--no-progress", "--set", 'run.device="cuda"']) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    start, end = summary["accuracy_start"], summary["accuracy_end"]
    record_property("heldout_start", start)
    record_property("heldout_end", end)
    record_property("steps", summary["steps"])
    record_property("seconds", summary["seconds"])
    assert end - start >= 0.05
