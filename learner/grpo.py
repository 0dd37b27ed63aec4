"""The GRPO objective as short pure functions, named after the papers' terms.

Shapes: every per-token tensor is [B, T] with a 0/1 ``mask`` marking completion tokens;
``advantage`` is per sequence, [B]. The loss is the PPO clipped surrogate against the
cached behaviour log-probs, with separate low/high clip, a dual clip for negative
advantages, and token-mean aggregation over every completion token of the batch.
"""

from __future__ import annotations

import torch


def policy_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """r_t = pi_theta(a_t) / pi_behaviour(a_t)."""
    return torch.exp(logp - behaviour_logp)


def clipped_surrogate(
    ratio: torch.Tensor, advantage: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float
) -> torch.Tensor:
    """Per-token loss: max(-A r, -A clip(r, 1-low, 1+high)), bounded by -A c when A < 0."""
    pg_loss1 = -advantage * ratio
    pg_loss2 = -advantage * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    pg_loss3 = -advantage * dual_clip
    return torch.where(advantage < 0, torch.minimum(pg_loss, pg_loss3), pg_loss)


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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped surrogate and its diagnostics (clip fraction, approx KL, ratio)."""
    adv = advantage.unsqueeze(-1).expand_as(logp)
    ratio = policy_ratio(logp, behaviour_logp)
    loss = token_mean(clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip), mask)
    with torch.no_grad():
        logratio = logp - behaviour_logp
        clipped = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        stats = {
            "clip_fraction": token_mean(clipped.float(), mask),
            "approx_kl": token_mean((ratio - 1) - logratio, mask),  # k3 estimator
            "ratio_mean": token_mean(ratio, mask),
            "ratio_max": (ratio * mask).max(),
        }
    return loss, stats
