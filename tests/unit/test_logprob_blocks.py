"""The learner's log-probs through the output layer a block at a time (learner/train.py) are
those of the model's whole logits, in value and in gradient, for every model type allowed to."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import prl.learner.train as train
from prl.schemas import TrainRollout

VOCAB = 97


def tiny_model(model_type: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, **extra)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def batch(temperature: float = 0.7):
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, (p, c) in enumerate([(5, 9), (3, 12), (6, 4)]):  # prompts of different lengths: left padding
        ids = torch.randint(3, VOCAB, (p + c,), generator=g).tolist()
        rows.append(TrainRollout(f"r{i}", "p", 0, False, 1.0, 0.0, temperature, ids[:p], ids[p:], [-1.0] * c))
    return train.pack(rows)


def whole_logits(model, b) -> torch.Tensor:
    """The reference: every completion position's whole logits, log-softmax at the targets."""
    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
    C = b.targets.shape[1]
    logp = torch.log_softmax(logits[:, -(C + 1) : -1].float() / b.temperature, -1)
    return logp.gather(-1, b.targets.unsqueeze(-1)).squeeze(-1)


def value_and_grads(fn, model, b):
    model.zero_grad(set_to_none=True)
    logp = fn(model, b)
    (logp * b.mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", sorted(train.HEAD_IS_LOGITS))
def test_blocks_give_the_whole_logits_log_probs_and_gradients(model_type, monkeypatch):
    model, b = tiny_model(model_type), batch()
    expected, expected_grads = value_and_grads(whole_logits, model, b)
    monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)  # 5 positions a block: 36 positions, 8 blocks
    got, grads = value_and_grads(train.token_logprobs, model, b)
    assert torch.allclose(got * b.mask, expected * b.mask, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        assert torch.allclose(grads[name], grad, atol=1e-5), name


def test_one_block_when_the_logits_fit_and_the_head_is_itself_afterwards(monkeypatch):
    model, b = tiny_model("llama"), batch(temperature=1.0)
    head = model.get_output_embeddings()
    calls = []
    monkeypatch.setattr(train, "checkpoint", lambda *a, **k: calls.append(1))
    got = train.token_logprobs(model, b)
    assert calls == [] and torch.allclose(got * b.mask, whole_logits(model, b).detach() * b.mask, atol=1e-5)
    assert "forward" not in head.__dict__ and model(input_ids=b.input_ids).logits.shape[-1] == VOCAB


def test_the_head_is_itself_again_when_the_forward_fails():
    model, b = tiny_model("llama"), batch()
    with pytest.raises(IndexError):
        train.token_logprobs(model, train.PackedBatch(**{**b.__dict__, "input_ids": b.input_ids + VOCAB}))
    assert "forward" not in model.get_output_embeddings().__dict__


def test_a_model_that_transforms_its_logits_takes_them_whole(monkeypatch):
    """Gemma 2 soft-caps the output layer's logits: a head returning log-probs would be capped."""
    model, b = tiny_model("gemma2", final_logit_softcapping=3.0), batch()
    assert "gemma2" not in train.HEAD_IS_LOGITS
    monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)
    with torch.no_grad():
        assert torch.allclose(train.token_logprobs(model, b) * b.mask, whole_logits(model, b) * b.mask, atol=1e-5)
        monkeypatch.setattr(train, "HEAD_IS_LOGITS", frozenset({"gemma2"}))
        assert not torch.allclose(train.token_logprobs(model, b) * b.mask, whole_logits(model, b) * b.mask, atol=1e-3)


def test_a_lora_adapted_model_gets_the_same_adapter_gradients(monkeypatch):
    from peft import get_peft_model

    from prl.models import lora_config

    model, b = get_peft_model(tiny_model("llama"), lora_config(4)), batch()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # a trained adapter: lora_B starts at zero
    expected, expected_grads = value_and_grads(whole_logits, model, b)
    monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)
    got, grads = value_and_grads(train.token_logprobs, model, b)
    assert torch.allclose(got * b.mask, expected * b.mask, atol=1e-5) and expected_grads
    assert all(torch.allclose(grads[n], g, atol=1e-5) for n, g in expected_grads.items())


def test_blocks_under_fsdp_give_the_unsharded_gradients(tmp_path, monkeypatch):
    """FSDP2 (one CPU rank, gloo) hooks the model's forward: the output layer's blocks, run and
    recomputed inside it, see its gathered weights, and the gradients are the unsharded model's."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, b = tiny_model("llama"), batch()
    expected, expected_grads = value_and_grads(whole_logits, model, b)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        sharded, mesh = copy.deepcopy(model), init_device_mesh("cpu", (1,))
        for layer in sharded.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)
        for _ in range(2):  # and again, after FSDP has resharded
            got, grads = value_and_grads(train.token_logprobs, sharded, b)
            assert torch.allclose(got * b.mask, expected * b.mask, atol=1e-5)
            assert all(torch.allclose(grads[n].full_tensor(), g, atol=1e-5) for n, g in expected_grads.items())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("block", [5 * VOCAB, train.LOGIT_BLOCK], ids=["blocks", "one block"])
def test_the_entropy_at_each_position_is_the_sampling_distributions(block, monkeypatch):
    """The policy's entropy at the sampling temperature (a diagnostic, so it carries no gradient),
    both ways and on a model that takes its logits whole."""
    monkeypatch.setattr(train, "LOGIT_BLOCK", block)
    for model in (tiny_model("qwen2"), tiny_model("gemma2", final_logit_softcapping=3.0)):
        b = batch(temperature=0.7)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits
        logp_all = torch.log_softmax(logits[:, -(b.targets.shape[1] + 1) : -1].float() / 0.7, -1)
        expected = -(logp_all.exp() * logp_all).sum(-1)
        logp, entropy = train.token_scores(model, b)
        assert not entropy.requires_grad and logp.requires_grad
        assert torch.allclose(entropy * b.mask, expected.detach() * b.mask, atol=1e-5)


def test_backward_recomputes_a_blocks_log_probs_and_not_its_entropy(monkeypatch):
    """The entropy is a diagnostic without a gradient: computed once per block in the forward.
    Backward's recompute of a block stops once it has what backward saved (torch's checkpoint
    stops early), before the entropy, which comes last in ``scored``."""
    monkeypatch.setattr(train, "LOGIT_BLOCK", 5 * VOCAB)  # 8 blocks
    calls = []
    real = train.entropy
    monkeypatch.setattr(train, "entropy", lambda logits: calls.append(len(logits)) or real(logits))
    model, b = tiny_model("llama"), batch()
    expected, expected_grads = value_and_grads(whole_logits, model, b)
    got, grads = value_and_grads(train.token_logprobs, model, b)
    assert len(calls) == 8 and sum(calls) == b.targets.numel()
    assert torch.allclose(got * b.mask, expected * b.mask, atol=1e-5)
    assert all(torch.allclose(grads[n], g, atol=1e-5) for n, g in expected_grads.items())
