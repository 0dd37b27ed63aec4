"""The GRPO objective as short pure functions, named after the papers' terms.

Shapes: every per-token tensor is [B, T] with a 0/1 ``mask`` marking completion tokens;
``advantage`` is per sequence, [B]. The loss is the PPO clipped surrogate with separate
low/high clip, a dual clip for negative advantages, and token-mean aggregation.

The ratio is taken against the behaviour log-probs: those of the producer's engine, at the
version that sampled the rollout (bypass mode, in verl's terms). With one optimizer step per batch
the learner's weights at the step's start are pi_theta itself, so the clip against the sampler is
the only trust region a stale or mismatched token meets; the decoupled corrections (token-level
truncated IS, IcePop's token mask, AReaL's decoupled weight, SkyRL's geometric sequence mask),
which take the ratio against the step's weights and weight each token by pi_learner / pi_sampler,
lost to it on the real task and were removed (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch

# Past r = e^20 every clip has already taken the gradient away (r > 1 + clip_high for A > 0,
# r > dual_clip for A < 0), so capping r there changes no gradient; uncapped, a token the sampler
# gave a tiny probability overflows r to inf, and inf * 0 in the backward pass is NaN in every weight.
LOG_RATIO_MAX = 20.0


def policy_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """r_t = pi_theta(a_t) / pi_behaviour(a_t), capped at e^LOG_RATIO_MAX."""
    return torch.exp(torch.clamp(logp - behaviour_logp, max=LOG_RATIO_MAX))


def clipped_surrogate(
    ratio: torch.Tensor, advantage: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float
) -> torch.Tensor:
    """Per-token loss: max(-A r, -A clip(r, 1-low, 1+high)), bounded by -A c when A < 0."""
    pg_loss1 = -advantage * ratio
    pg_loss2 = -advantage * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    pg_loss3 = -advantage * dual_clip
    return torch.where(advantage < 0, torch.minimum(pg_loss, pg_loss3), pg_loss)


def is_clipped(ratio: torch.Tensor, advantage: torch.Tensor, clip_low: float, clip_high: float,
               dual_clip: float) -> torch.Tensor:
    """Where a clip takes the gradient away: r < 1-low with A < 0, r > 1+high with A > 0, or
    r > c with A < 0 (the dual clip)."""
    return ((ratio < 1 - clip_low) & (advantage < 0)) | ((ratio > 1 + clip_high) & (advantage > 0)) | \
        ((ratio > dual_clip) & (advantage < 0))


def approx_kl(ratio: torch.Tensor, logratio: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(behaviour || policy) per token: (r - 1) - log r."""
    return (ratio - 1) - logratio


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float = 10.0,
    total_tokens: float | None = None,
    sample_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = (1/T) sum_{b,t} mask_bt * s_b * clipped_surrogate(r_bt, A_b): the token-mean clipped
    surrogate of r = pi_theta / pi_behaviour, T = ``total_tokens`` (default: the tokens under
    ``mask``; a micro-batch passes the whole batch's count, so the micro-batch losses add up to
    the batch's); s_b = ``sample_weight`` (default 1: a replayed rollout's importance weight).
    Diagnostics are token means over ``mask``: clip fraction, approx KL, ratio mean and max."""
    adv = advantage.unsqueeze(-1).expand_as(logp)
    ratio = policy_ratio(logp, behaviour_logp)
    per_token = clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)
    if sample_weight is not None:
        per_token = per_token * sample_weight.unsqueeze(-1)
    loss = (per_token * mask).sum() / (mask.sum().clamp(min=1) if total_tokens is None else total_tokens)
    with torch.no_grad():
        log_rho = (logp - behaviour_logp).detach().double()  # the true ratio, in a range that holds it
        rho = torch.exp(log_rho)
        stats = {
            "clip_fraction": token_mean(is_clipped(ratio.detach(), adv, clip_low, clip_high, dual_clip).float(), mask),
            "approx_kl": token_mean(approx_kl(rho, log_rho), mask),
            "ratio_mean": token_mean(rho, mask),
            "ratio_max": (rho * mask).max(),
        }
    return loss, stats
