"""The GRPO objective as short pure functions, named after the papers' terms.

Shapes: every per-token tensor is [B, T] with a 0/1 ``mask`` marking completion tokens;
``advantage`` is per sequence, [B]. The loss is the PPO clipped surrogate with separate
low/high clip, a dual clip for negative advantages, and token-mean aggregation.

Three policies meet in an asynchronous run: the behaviour policy that sampled a rollout
(a producer's engine at an older version), the proximal policy (the learner's weights at the
step's start) and pi_theta. ``correction`` says how the gap between the first two is handled:

- ``none``: the surrogate's ratio is taken against the behaviour log-probs, and the PPO clip
  handles engine mismatch and staleness together (bypass mode);
- the others take the ratio against the proximal policy and multiply each token's surrogate
  by a weight w_t of rho_t = pi_prox / pi_behaviour (decoupled PPO, arXiv 2505.24298):
  ``sequence_mask`` rho_t where the sequence's geometric-mean rho lies in [0.99, 1.01], else 0
  (SkyRL's fully asynchronous setting); ``icepop`` rho_t within [0.5, 5], else 0 (IcePop);
  ``decoupled`` rho_t up to 5, else 0 (AReaL's behaviour-weight cap). Token-level truncated IS
  (min(rho_t, 2)) lost to ``none`` on the real task and was removed (benchmarks/RESULTS.md).

With one optimizer step per batch, pi_theta equals pi_prox wherever the loss is evaluated, so
the decoupled forms' clip never binds: staleness and mismatch go through w_t alone.
"""

from __future__ import annotations

import math

import torch


CORRECTIONS = ("none", "sequence_mask", "icepop", "decoupled")
GEOMETRIC_BOUNDS = (0.99, 1.01)
ICEPOP_BOUNDS = (0.5, 5.0)
DECOUPLED_CAP = 5.0


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


def is_clipped(ratio: torch.Tensor, advantage: torch.Tensor, clip_low: float, clip_high: float,
               dual_clip: float) -> torch.Tensor:
    """Where a clip takes the gradient away: r < 1-low with A < 0, r > 1+high with A > 0, or
    r > c with A < 0 (the dual clip)."""
    return ((ratio < 1 - clip_low) & (advantage < 0)) | ((ratio > 1 + clip_high) & (advantage > 0)) | \
        ((ratio > dual_clip) & (advantage < 0))


def behaviour_weight(log_rho: torch.Tensor, mask: torch.Tensor, correction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_t, where w_t was masked to 0) for log rho_t = log pi_prox - log pi_behaviour, per
    ``correction`` (module docstring); detached."""
    rho = torch.exp(log_rho.detach())
    if correction == "sequence_mask":
        log_geo = (log_rho.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        lo, hi = GEOMETRIC_BOUNDS
        out = ((log_geo < math.log(lo)) | (log_geo > math.log(hi))).unsqueeze(-1).expand_as(rho)
    elif correction == "icepop":
        out = (rho < ICEPOP_BOUNDS[0]) | (rho > ICEPOP_BOUNDS[1])
    elif correction == "decoupled":
        out = rho > DECOUPLED_CAP
    else:
        raise ValueError(f"unknown correction {correction!r}: one of {', '.join(CORRECTIONS)}")
    return torch.where(out, torch.zeros_like(rho), rho), out


def approx_kl(ratio: torch.Tensor, logratio: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(behaviour || policy) per token: (r - 1) - log r."""
    return (ratio - 1) - logratio


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def surrogate_terms(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, correction: str):
    """(r_t, w_t, masked): the surrogate's ratio and each token's weight per ``correction``
    (module docstring), and where the weight was masked."""
    if correction == "none":
        return policy_ratio(logp, behaviour_logp), torch.ones_like(logp), torch.zeros_like(mask, dtype=torch.bool)
    weight, masked = behaviour_weight(logp.detach() - behaviour_logp, mask, correction)
    return policy_ratio(logp, logp.detach()), weight, masked  # r against the proximal policy: 1, with a gradient


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str = "none",
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float = 10.0,
    total_tokens: float | None = None,
    sample_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = (1/T) sum_{b,t} mask_bt * s_b * w_bt * clipped_surrogate(r_bt, A_b): the token-mean
    clipped surrogate, T = ``total_tokens`` (default: the tokens under ``mask``; a micro-batch
    passes the whole batch's count, so the micro-batch losses add up to the batch's). r and w
    per ``correction``; s_b = ``sample_weight`` (default 1: a replayed rollout's importance
    weight). Diagnostics are token means over ``mask``: clip fraction (of r), the masked fraction
    (of w), and against the behaviour log-probs the approx KL, ratio mean and max."""
    adv = advantage.unsqueeze(-1).expand_as(logp)
    ratio, weight, masked = surrogate_terms(logp, behaviour_logp, mask, correction)
    if sample_weight is not None:
        weight = weight * sample_weight.unsqueeze(-1)
    per_token = weight * clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)
    loss = (per_token * mask).sum() / (mask.sum().clamp(min=1) if total_tokens is None else total_tokens)
    with torch.no_grad():
        log_rho = (logp - behaviour_logp).detach()
        rho = torch.exp(log_rho)
        stats = {
            "clip_fraction": token_mean(is_clipped(ratio.detach(), adv, clip_low, clip_high, dual_clip).float(), mask),
            "masked": token_mean(masked.float(), mask),
            "approx_kl": token_mean(approx_kl(rho, log_rho), mask),
            "ratio_mean": token_mean(rho, mask),
            "ratio_max": (rho * mask).max(),
        }
    return loss, stats
