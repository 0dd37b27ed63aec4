"""The walking skeleton over a real Kafka-protocol broker: scheduler, producer and
learner as separate `prl` processes, a few GRPO steps on the tiny model; all three finish
when the learner has taken its last step, and `prl inspect report` draws their metrics."""

import json
import sys
import time

import fsspec
import pytest

from prl.learner import checkpoint
from prl.transport.kafka import KafkaTransport
from prl.schemas import EvalResult, RolloutGroup, decode
from prl.schemas.config import KafkaConfig
from prl.schemas.topics import ROLLOUTS, topic_name
from tests.support.servers import Process, wait_until, write_kafka_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def write_config(path, broker, run_name, run_dir, max_steps, checkpoint_every=1):
    return write_kafka_config(path, broker.bootstrap, run_name, run_dir, scheduler={"strategy": "uniform"},
                              learner={"max_steps": max_steps, "eval_every": 2, "checkpoint_every": checkpoint_every})


def start(service, config, log_dir):
    return Process([sys.executable, "-m", "prl.cli", service, "--config", str(config)],
                   log_path=log_dir / f"{service}.log")


def test_services_over_kafka(kafka_broker, run_name, tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "config.toml"
    # checkpoints at steps 2, 4 and 5, as deployments checkpoint every few steps (versions 1 and 3
    # are announced without weights; announced with the last checkpoint's, they were refused)
    write_config(config, kafka_broker, run_name, f"file://{run_dir}", max_steps=5, checkpoint_every=2)
    procs = {name: start(name, config, tmp_path) for name in ("scheduler", "producer", "learner")}
    try:  # the learner stops after 5 steps; scheduler and producer see it and finish too
        wait_until(lambda: all(p.proc.poll() is not None for p in procs.values()), 240, "every service to finish", 0.5)
    finally:
        for p in procs.values():
            p.stop()
    for name, p in procs.items():
        assert p.proc.returncode == 0, f"{name} exited {p.proc.returncode}"
    assert_checkpoints(run_dir, last_step=5)
    assert_rollouts_carry_policy_versions(kafka_broker, run_name)
    assert_no_error_logged(procs)
    assert not [n for n, p in procs.items() if "dead_lettered" in p.log_path.read_text()]  # a clean run refuses nothing
    files = sorted(p.name for p in run_dir.glob("metrics*.jsonl"))  # every service writes its own
    assert len(files) == 3 and files[0] == "metrics-learner.jsonl" and files[2] == "metrics-scheduler.jsonl"
    assert files[1].startswith("metrics-producer-") and '"producer/tokens_per_s"' in (run_dir / files[1]).read_text()
    from prl.cli.inspect import report

    pngs, ages = report(f"file://{run_dir}")  # every service's metrics, one page; the learning curve
    assert [p.rsplit("/", 1)[1] for p in pngs] == ["learning_curve.png", "run_report.png"]
    for png in pngs:
        assert fsspec.open(png, "rb").open().read(8) == b"\x89PNG\r\n\x1a\n"
    assert ages and sum(tokens for _, tokens, _, _ in ages) > 0  # the trained tokens by rollout age
    assert_started_again_they_finish_at_once(config, tmp_path / "again")


def assert_started_again_they_finish_at_once(config, log_dir):
    """A service started on a run its scheduler declared finished (a pod rescheduled, a producer
    scaled up at the end) loads nothing and finishes at its first step, saying so."""
    log_dir.mkdir()
    procs = {name: start(name, config, log_dir) for name in ("scheduler", "producer", "learner")}
    try:
        wait_until(lambda: all(p.proc.poll() is not None for p in procs.values()), 60, "every service to finish again", 0.5)
    finally:
        for p in procs.values():
            p.stop()
    for name, p in procs.items():
        text = p.log_path.read_text()
        events = [json.loads(line)["event"] for line in text.splitlines() if line.startswith("{")]
        assert p.proc.returncode == 0 and events == ["run_already_finished"], f"{name}:\n{text[-2000:]}"


def assert_checkpoints(run_dir, last_step: int) -> None:
    """At least two checkpoints, readable through fsspec, and a latest pointer at the last."""
    names = checkpoint.list_checkpoints(f"file://{run_dir}")
    assert len(names) >= 2
    for name in names:
        with fsspec.open(f"file://{run_dir}/checkpoints/{name}/model.safetensors", "rb") as f:
            assert len(f.read()) > 1000
    assert checkpoint.read_latest(f"file://{run_dir}")["step"] == last_step


def assert_rollouts_carry_policy_versions(kafka_broker, run_name) -> None:
    """Every rollout on the topic carries the policy version (field and header), some > 0
    (the topic also carries the fleet's evaluation results, which are not rollouts)."""
    transport = KafkaTransport(KafkaConfig(bootstrap_servers=kafka_broker.bootstrap))
    sub = transport.subscriber([topic_name(run_name, ROLLOUTS)], group=None)
    msgs, deadline = [], time.monotonic() + 20
    while time.monotonic() < deadline:
        batch = sub.poll(1.0)
        if not batch and msgs:
            break
        msgs += batch
    sub.close()
    records = [(m, decode(m.value)) for m in msgs]
    pairs = [(m, g) for m, g in records if isinstance(g, RolloutGroup)]
    assert pairs and any(isinstance(g, EvalResult) for _, g in records)
    groups = [g for _, g in pairs]
    for m, g in pairs:
        assert int(m.header("policy_version")) == g.policy_version >= 0
        assert all(len(r.logprobs) == len(r.completion_ids) > 0 for r in g.rollouts)
    assert max(g.policy_version for g in groups) > 0


def assert_no_error_logged(procs) -> None:
    for name, p in procs.items():
        text = p.log_path.read_text()
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
        for line in text.splitlines():
            if line.startswith("{"):
                assert json.loads(line).get("level") not in ("error", "critical"), f"{name}: {line}"
