"""The GRPO loss against a slow, obvious, per-token reference."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from prl.learner.grpo import grpo_loss
from prl.formulas import group_advantages, has_signal


def reference_loss(logp, old, adv, mask, low, high, c):
    total, count = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t] == 0:
                continue
            ratio = math.exp(float(logp[b, t]) - float(old[b, t]))
            a = adv[b]
            unclipped = -a * ratio
            clipped = -a * min(max(ratio, 1 - low), 1 + high)
            loss = max(unclipped, clipped)
            if a < 0:
                loss = min(loss, -a * c)
            total += loss
            count += 1
    return total / count


@pytest.mark.parametrize("seed", range(5))
def test_loss_matches_reference_including_dual_clip(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g) * 3
    logp = old + torch.randn(B, T, generator=g) * 1.5  # wide ratios: hits both clips and the dual clip
    adv = torch.randn(B, generator=g) * 2
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    loss, stats = grpo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    ref = reference_loss(logp, old, adv.tolist(), mask, 0.2, 0.28, 3.0)
    assert loss.item() == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert 0 <= stats["clip_fraction"].item() <= 1


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.tensor([[5.0]])  # ratio e^5 ~ 148
    old = torch.zeros(1, 1)
    loss, _ = grpo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=10.0)
    assert loss.item() == pytest.approx(10.0)


def test_on_policy_gradient_is_policy_gradient():
    """At ratio 1 the gradient is -A * grad logp / tokens."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([0.5]), torch.ones(1, 2))
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.25])


def test_group_advantages():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]
    assert not has_signal([0.0, 0.0]) and has_signal([0.0, 1.0])


def random_rollouts(n, seed, vocab=16):
    from prl.schemas import TrainRollout

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(2, 7, (1,), generator=g))
        c = int(torch.randint(1, 9, (1,), generator=g))
        ids = torch.randint(3, vocab, (p + c,), generator=g).tolist()
        out.append(TrainRollout(f"r{i}", "p", 0, i % 3 == 0, float(torch.randn(1, generator=g)), 0.0, 1.0,
                                [1] + ids[:p], ids[p:], (-torch.rand(c, generator=g) * 3).tolist()))
    return out


def test_a_token_the_sampler_found_all_but_impossible_leaves_the_weights_finite():
    """Behaviour log-probs at the contract's floor (LOGPROB_MIN) put r = pi/pi_behaviour past
    float32 (e^110): uncapped, inf * 0 made every gradient NaN and the step every weight NaN.
    Capped where every clip has zeroed the gradient, the step is the same as without that token."""
    from prl.learner.train import train_step
    from prl.models import load_model
    from prl.schemas import LOGPROB_MIN
    from prl.schemas.config import LearnerConfig

    rollouts = random_rollouts(8, seed=3)
    extreme = [dataclasses.replace(r, logprobs=np.minimum(r.logprobs, LOGPROB_MIN * (np.arange(len(r.logprobs)) == 0)))
               for r in rollouts]
    for advantage in (1.0, -1.0):
        model = load_model("builtin:tiny-adder")
        m = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                       [dataclasses.replace(r, advantage=advantage) for r in extreme], LearnerConfig())
        assert math.isfinite(m["grad_norm"]) and m["skipped"] == 0 and m["ratio_mean"] > 1e40
        assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_step_whose_gradient_is_not_finite_leaves_the_weights_as_they_were():
    """An overflow anywhere (here an advantage of 1e38, which no GRPO group gives) makes the
    gradient's norm inf: the optimizer does not step, and the step says so (``skipped``)."""
    from prl.learner.train import train_step
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder")
    before = [p.detach().clone() for p in model.parameters()]
    rollouts = [dataclasses.replace(r, advantage=1e38) for r in random_rollouts(8, seed=4)]
    m = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), rollouts, LearnerConfig())
    assert m["skipped"] == 1 and not math.isfinite(m["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_micro_batched_loss_and_gradients_equal_whole_batch():
    """Token-budget micro-batches with gradient accumulation give the whole-batch
    token-mean loss and the same gradients."""
    from prl.learner.train import plan_micro_batches, train_step
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    rollouts = random_rollouts(24, seed=0)
    grads, losses = [], []
    for budget in (10_000, 40, 16):
        model = load_model("builtin:tiny-adder")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: compare gradients, weights unchanged
        cfg = LearnerConfig(micro_batch_tokens=budget)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("prl.learner.train.GRAD_CLIP", 1e9)  # compare the gradients themselves
            m = train_step(model, opt, rollouts, cfg)
        losses.append(m["loss"])
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        if budget < 10_000:
            assert m["micro_batches"] > 1
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == pytest.approx(losses[0], rel=1e-5)
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], rtol=1e-4, atol=1e-7)
    plan = plan_micro_batches(rollouts, 40, world=2)
    assert len(plan[0]) == len(plan[1])
    assert sorted(r.rollout_id for rank in plan for mb in rank for r in mb) == sorted(r.rollout_id for r in rollouts)


def test_the_training_step_goes_through_the_tested_loss(monkeypatch):
    """train_step's loss is grpo_loss over the whole batch (micro-batched around it), divided by
    the fresh rollouts' tokens."""
    import prl.learner.train as train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    rollouts = random_rollouts(12, seed=1)
    calls = []
    monkeypatch.setattr(train, "grpo_loss", lambda *a, **k: calls.append(k) or grpo_loss(*a, **k))
    model = load_model("builtin:tiny-adder")
    total = sum(len(r.completion_ids) for r in rollouts if not r.is_replay)
    assert 0 < total < sum(len(r.completion_ids) for r in rollouts)
    with torch.no_grad():
        batch = train.pack(rollouts)
        expected, _ = grpo_loss(train.token_logprobs(model, batch), batch.behaviour_logp, batch.advantage, batch.mask,
                                total_tokens=total)
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollouts, LearnerConfig(micro_batch_tokens=40))
    assert m["micro_batches"] > 1 and [k["total_tokens"] for k in calls if "total_tokens" in k] == [total] * m["micro_batches"]
    assert m["loss"] == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("setting, native, autocast", [("auto", True, True), ("auto", False, False), (True, False, True),
                                                       (False, True, False)])
def test_bf16_autocast_auto_trains_in_bf16_only_where_the_device_has_it_natively(monkeypatch, setting, native, autocast):
    """learner.bf16_autocast = "auto": bf16 autocast where bf16 is native, fp32 where it would be
    emulated (a CPU with AVX2 alone, 16x slower); true and false are obeyed as set."""
    import prl.devices as devices
    import prl.learner.train as train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    enabled, real = [], torch.autocast
    monkeypatch.setattr(devices, "native_bf16", lambda device_type: native)
    monkeypatch.setattr(train.torch, "autocast", lambda *a, **k: enabled.append(k["enabled"]) or real(*a, **k))
    model = load_model("builtin:tiny-adder")
    train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), random_rollouts(4, seed=3),
                     LearnerConfig(bf16_autocast=setting))
    assert enabled == [autocast]


def test_a_cpu_model_on_a_machine_with_cuda_autocasts_on_the_cpu(monkeypatch):
    """The autocast follows the model's device, not what the machine has: a CPU model where CUDA
    is visible still gets CPU bf16 autocast, and its batches stay on the CPU."""
    import prl.learner.train as train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    kinds, real = [], torch.autocast
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(train.torch, "autocast", lambda device_type, **k: kinds.append(device_type) or real(device_type, **k))
    model = load_model("builtin:tiny-adder")
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), random_rollouts(4, seed=3),
                         LearnerConfig(bf16_autocast=True))
    assert kinds == ["cpu"] and m["tokens"] > 0


def test_a_packed_batch_moves_whole_to_a_device():
    """Every tensor of a packed batch goes to the device asked for; the temperature stays."""
    import prl.learner.train as train

    batch = train.pack(random_rollouts(3, seed=1))
    moved = batch.to(torch.device("meta"))
    assert {getattr(moved, name).device.type for name in train.TENSORS} == {"meta"}
    assert (moved.temperature, moved.left_padded) == (batch.temperature, batch.left_padded)
    assert {f.name for f in dataclasses.fields(train.PackedBatch)} == {*train.TENSORS, "temperature", "left_padded"}


def test_rows_without_left_padding_give_the_log_probs_of_the_padded_forward():
    """A micro-batch whose prompts all have the same length skips the padding mask (attention's
    fused causal kernels): its log-probs equal the masked forward's, right padding included."""
    import prl.learner.train as train
    from prl.models import load_model
    from prl.schemas import TrainRollout

    model = load_model("builtin:tiny-adder")
    rollouts = [TrainRollout(f"r{i}", "p", 0, False, 1.0, 0.0, 1.0, [1, 4, 5, 6], list(range(3, 3 + c)), [-0.5] * c)
                for i, c in enumerate([2, 5, 3])]
    batch = train.pack(rollouts)
    assert not batch.left_padded
    with torch.no_grad():
        fast = train.token_logprobs(model, batch)
        masked = train.token_logprobs(model, dataclasses.replace(batch, left_padded=True))
    assert torch.allclose(fast * batch.mask, masked * batch.mask, atol=1e-5)
    assert train.pack(rollouts + [TrainRollout("s", "p", 0, False, 1.0, 0.0, 1.0, [1, 4], [3], [-0.5])]).left_padded


def test_clip_fraction_is_where_the_gradient_is_zero_dual_clip_included():
    from prl.learner.grpo import clipped_surrogate, is_clipped

    ratios = torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5, 5.0, 12.0, 0.5, 1.0, 1.5, 12.0])
    adv = torch.tensor([-1.0] * 7 + [1.0] * 4)
    logr = ratios.log().requires_grad_()
    clipped_surrogate(logr.exp(), adv, 0.2, 0.28, 10.0).sum().backward()
    assert torch.equal(is_clipped(ratios, adv, 0.2, 0.28, 10.0), logr.grad == 0)
    assert is_clipped(ratios, adv, 0.2, 0.28, 10.0)[6]  # r = 12 > c = 10 with A < 0: the dual clip


def test_the_mismatch_is_measured_on_age_0_rollouts_alone():
    """Rollouts sampled by the weights the step starts from (age 0) whose behaviour log-probs are
    the learner's own, shifted by +0.02: the mismatch metrics see that shift and nothing else;
    stale rollouts, far off, count under stale/ and not in the mismatch."""
    from prl.learner import train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder", "float32")
    rollouts = random_rollouts(6, seed=5)
    with torch.no_grad():
        own = train.token_logprobs(model, train.pack(rollouts))
    fresh = [dataclasses.replace(r, policy_version=7, is_replay=False, logprobs=own[i, :len(r.completion_ids)].numpy() + 0.02)
             for i, r in enumerate(rollouts[:4])]
    stale = [dataclasses.replace(r, policy_version=2, is_replay=False) for r in rollouts[4:]]
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), fresh + stale, LearnerConfig(), version=7)
    assert m["mismatch/ratio_mean"] == pytest.approx(math.exp(-0.02), abs=1e-4)
    assert m["mismatch/kl"] == pytest.approx(math.exp(-0.02) - 1 + 0.02, rel=1e-2)
    assert math.exp(-0.021) <= m["mismatch/ratio_q0.001"] <= m["mismatch/ratio_q0.999"] <= math.exp(-0.019)
    assert m["mismatch/ratio_min"] == pytest.approx(math.exp(-0.02), abs=1e-4)
    assert m["mismatch/ratio_max"] == pytest.approx(math.exp(-0.02), abs=1e-4)
    assert m["age0/tokens"] == sum(len(r.completion_ids) for r in fresh) and m["stale/tokens"] > 0


def test_clipped_tokens_and_kl_are_reported_by_the_age_of_their_rollout():
    """Rollouts of ages 0, 3 and 15 (fresh or replayed alike) whose behaviour log-probs are the
    learner's own shifted by 0, -0.1 and +0.5: each age's bin sees its own shift alone (15 falls in
    the last, 11+); at -0.1 (ratio 1.105) no clip binds, at +0.5 (ratio 0.61) every token with A < 0 is clipped."""
    from prl.learner import train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder", "float32")
    rollouts = random_rollouts(6, seed=5)
    with torch.no_grad():
        own = train.token_logprobs(model, train.pack(rollouts))
    shifts, ages = (0.0, 0.0, -0.1, -0.1, 0.5, 0.5), (0, 0, 3, 3, 15, 15)
    aged = [dataclasses.replace(r, policy_version=20 - age, is_replay=i % 2 == 1, advantage=(-1.0, 1.0)[i % 2],
                                logprobs=own[i, :len(r.completion_ids)].numpy() + shift)
            for i, (r, shift, age) in enumerate(zip(rollouts, shifts, ages))]
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), aged, LearnerConfig(), version=20)
    tokens = [len(r.completion_ids) for r in rollouts]
    assert [m[f"age/{a}/tokens"] for a in ("0", "3", "11+")] == [tokens[0] + tokens[1], tokens[2] + tokens[3], tokens[4] + tokens[5]]
    assert not any(k.startswith(("age/1/", "age/2/", "age/10/")) for k in m)
    assert m["age/0/approx_kl"] == pytest.approx(0.0, abs=1e-6) and m["age/0/clip_fraction"] == 0.0
    assert m["age/3/approx_kl"] == pytest.approx(math.exp(0.1) - 1 - 0.1, rel=1e-3) and m["age/3/clip_fraction"] == 0.0
    assert m["age/11+/approx_kl"] == pytest.approx(math.exp(-0.5) - 1 + 0.5, rel=1e-3)
    assert m["age/11+/clip_fraction"] == pytest.approx(tokens[4] / (tokens[4] + tokens[5]))  # A < 0, r = 0.61 < 0.8


def test_the_mismatch_quantiles_lie_between_the_smallest_and_largest_ratio():
    """A mismatch far below the quantile bins' width (0.001 in log-ratio), as an fp32 engine's:
    the quantiles were the bins' outer edges, q0.01 = 0.999 below the min of 0.99997."""
    from prl.learner import train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder", "float32")
    rollouts = random_rollouts(4, seed=5)
    with torch.no_grad():
        own = train.token_logprobs(model, train.pack(rollouts))
    shift = np.linspace(0, 3e-5, 64)
    fresh = [dataclasses.replace(r, policy_version=7, is_replay=False,
                                 logprobs=own[i, :len(r.completion_ids)].numpy() + shift[:len(r.completion_ids)])
             for i, r in enumerate(rollouts)]
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), fresh, LearnerConfig(), version=7)
    quantiles = [m[f"mismatch/ratio_q{q:g}"] for q in train.MISMATCH_QUANTILES]
    assert m["mismatch/ratio_min"] <= quantiles[0] and quantiles == sorted(quantiles)
    assert quantiles[-1] <= m["mismatch/ratio_max"] <= 1 + 1e-6 and m["mismatch/ratio_min"] > math.exp(-4e-5)


def test_a_steps_entropy_is_the_token_mean_of_the_policys_entropy_per_part():
    from prl.learner import train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder", "float32")
    rollouts = [dataclasses.replace(r, is_replay=i >= 4) for i, r in enumerate(random_rollouts(6, seed=5))]
    batch = train.pack(rollouts)
    with torch.no_grad():
        _, entropy = train.token_scores(model, batch)
    m = train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollouts, LearnerConfig())
    for part, rows in (("fresh", slice(0, 4)), ("replay", slice(4, 6))):
        expected = (entropy[rows] * batch.mask[rows]).sum() / batch.mask[rows].sum()
        assert m[f"{part}/entropy"] == pytest.approx(float(expected), rel=1e-4)
    assert 0 < m["replay/entropy"] and m["entropy"] == pytest.approx(float((entropy * batch.mask).sum() / batch.mask.sum()), rel=1e-4)
    assert max(m["fresh/entropy"], m["replay/entropy"]) <= math.log(model.config.vocab_size)


LOG_RHO = torch.tensor([[0.0, 1.0, -1.0, 2.0], [0.005, 0.005, 0.005, 0.0], [0.05, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])


def test_the_clip_is_against_the_behaviour_log_probs():
    """The PPO clip is taken against the sampler's log-probs: a token whose ratio is past
    1 + clip_high with a positive advantage has no gradient; the others have -r A / T."""
    logp = torch.full((3, 4), -1.0, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach() - LOG_RHO, torch.tensor([1.0, -0.5, 2.0]), MASK)
    loss.backward()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 3] == 0  # r = e, e^2 > 1.28 with A > 0
    assert logp.grad[0, 2].item() == pytest.approx(-math.exp(-1) / MASK.sum().item())


def test_replay_adds_to_the_fresh_gradient_without_diluting_it():
    """The token mean divides by the fresh tokens: replayed rollouts of advantage 0 leave the
    step's gradient exactly as the fresh ones alone make it."""
    fresh = [dataclasses.replace(r, is_replay=False) for r in random_rollouts(8, seed=3)]
    replayed = [dataclasses.replace(r, rollout_id=f"x{i}", is_replay=True, advantage=0.0)
                for i, r in enumerate(random_rollouts(8, seed=4))]
    assert torch.allclose(step_gradient(fresh), step_gradient(fresh + replayed), atol=1e-6)


def step_gradient(rollouts) -> torch.Tensor:
    """The unclipped gradient of one train_step on ``rollouts`` from the tiny model."""
    from prl.learner.train import train_step
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    model = load_model("builtin:tiny-adder", "float32")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("prl.learner.train.GRAD_CLIP", 1e9)
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollouts, LearnerConfig())
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_a_replayed_rollouts_sample_weight_scales_its_gradient():
    """A replayed rollout of sample weight 0.5 moves the weights as it would with half its advantage."""
    rollouts = [dataclasses.replace(r, is_replay=i % 2 == 1) for i, r in enumerate(random_rollouts(8, seed=6))]
    weighted = [dataclasses.replace(r, sample_weight=0.5) if r.is_replay else r for r in rollouts]
    halved = [dataclasses.replace(r, advantage=r.advantage / 2) if r.is_replay else r for r in rollouts]
    assert torch.allclose(step_gradient(weighted), step_gradient(halved), atol=1e-6)


def test_the_learner_trains_the_models_tokens_alone():
    """In an episode the environment's tokens are context: they count in no token mean and
    move no weight, whatever log-probs they carry; the model's tokens train as usual."""
    from prl.learner import train
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    base = random_rollouts(6, seed=8)
    episodes = [dataclasses.replace(r, is_replay=False, model_mask=[1] + [0] * (len(r.completion_ids) - 1))
                for r in base if len(r.completion_ids) > 2]
    assert train.pack(episodes).mask.sum() == len(episodes)
    with torch.no_grad():  # the model's token sampled by these very weights: no clip takes its gradient
        own = train.token_logprobs(load_model("builtin:tiny-adder", "float32"), train.pack(episodes))[:, 0].tolist()
    grads, metrics = [], []
    for env_logprob in (-0.1, -7.0):
        rollouts = [dataclasses.replace(r, logprobs=[own[i]] + [env_logprob] * (len(r.completion_ids) - 1))
                    for i, r in enumerate(episodes)]
        model = load_model("builtin:tiny-adder", "float32")
        metrics.append(train.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rollouts, LearnerConfig()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.equal(grads[0], grads[1]) and grads[0].abs().sum() > 0
    assert metrics[0]["tokens"] == len(episodes) and metrics[0]["loss"] == metrics[1]["loss"]
