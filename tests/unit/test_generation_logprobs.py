"""The transformers backend's behaviour log-probs: the learner's own log-probs of the same
tokens (so a fresh rollout's ratio starts at 1), computed one decoding step at a time."""

import numpy as np
import pytest
import torch

from prl.learner.train import pack, token_logprobs
from prl.generation import Request, TransformersBackend, chosen_logprobs
from prl.models import load_model, load_tokenizer
from prl.schemas import Sampling, TrainRollout


def test_chosen_logprobs_equal_the_log_softmax_of_the_stacked_steps():
    g = torch.Generator().manual_seed(0)
    B, T, V = 5, 7, 33
    steps = tuple(torch.randn(B, V, generator=g) * 3 for _ in range(T))
    tokens = torch.randint(0, V, (B, T), generator=g)
    reference = torch.log_softmax(torch.stack(steps, dim=1) / 0.7, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(chosen_logprobs(steps, tokens, 0.7), reference)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_logprobs_are_the_learners_logprobs_of_those_tokens(temperature):
    torch.manual_seed(0)
    backend = TransformersBackend(load_model("builtin:tiny-adder"), load_tokenizer("builtin:tiny-adder"))
    prompts = [backend.encode(f"{a}+{b}=") for a, b in [(3, 4), (12, 9), (250, 31)]]
    groups = backend.generate([Request(p, 4, Sampling(temperature=temperature, max_tokens=6)) for p in prompts])
    rollouts = [TrainRollout(f"r{i}{j}", "p", 0, False, 1.0, 0.0, temperature, np.array(p), np.array(c.token_ids),
                             np.array(c.logprobs, dtype=np.float32))
                for i, (p, group) in enumerate(zip(prompts, groups)) for j, c in enumerate(group)]
    assert all(len(r.completion_ids) == len(r.logprobs) > 0 for r in rollouts)
    batch = pack(rollouts, backend.pad_id)
    with torch.no_grad():
        learner = token_logprobs(backend.model, batch)
    mask = batch.mask.bool()
    assert torch.allclose(learner[mask], batch.behaviour_logp[mask], atol=1e-4)


def test_a_seeded_backend_samples_its_own_stream_and_leaves_the_global_one_alone():
    model, tokenizer = load_model("builtin:tiny-adder"), load_tokenizer("builtin:tiny-adder")

    def two_calls(seed):
        backend = TransformersBackend(model, tokenizer, seed=seed)
        requests = [Request(backend.encode(f"{a}+{b}="), 4, Sampling(temperature=1.0, max_tokens=6)) for a, b in [(3, 4), (12, 9)]]
        return [[c.token_ids for group in backend.generate(requests) for c in group] for _ in range(2)]

    torch.manual_seed(123)
    before = torch.get_rng_state()
    first, again, other = two_calls(1), two_calls(1), two_calls(2)
    assert first == again  # one seed, one stream
    assert first != other  # another seed, another stream
    assert first[0] != first[1]  # the stream goes on between calls instead of restarting
    assert torch.equal(torch.get_rng_state(), before)  # a learner beside it draws what it would have
