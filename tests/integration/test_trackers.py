"""Metrics and a sample of rollouts reach TensorBoard and Weights & Biases (offline)."""

import json

import pytest

pytest.importorskip("tensorboard", reason="pip install -e '.[track]'")
pytest.importorskip("wandb", reason="pip install -e '.[track]'")


def test_prl_run_writes_tensorboard_and_offline_wandb_files(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from prl.cli import main

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "3", "--no-progress", "--set", "learner.eval_every=3",
                 "--set", 'run.trackers=["tensorboard", "wandb"]']) == 0  # a table at batch 0
    events = EventAccumulator(str(run_dir / "tensorboard" / "run"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert {"learner/loss", "eval/accuracy", "scheduler/signal_share"} <= set(events.Tags()["scalars"])
    assert len(events.Scalars("learner/loss")) == 3
    assert "scheduler/rollouts/text_summary" in events.Tags()["tensors"]  # the rollout sample table
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))
    tables = list(offline.glob("files/media/table/scheduler/rollouts_*.table.json"))
    assert tables and json.loads(tables[0].read_text())["columns"][:3] == ["problem", "policy_version", "completion"]
