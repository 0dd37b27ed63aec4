"""One GRPO optimizer step on a TrainBatch: pack, score, loss, backward, clip, step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.grpo import grpo_loss
from schemas import TrainRollout


@dataclass
class PackedBatch:
    """Right-padded token rows; per-token tensors are aligned with ``targets`` = ids[:, 1:]."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    targets: torch.Tensor  # [B, L-1]
    mask: torch.Tensor  # [B, L-1], 1 where the target is a completion token
    behaviour_logp: torch.Tensor  # [B, L-1]
    advantage: torch.Tensor  # [B]
    is_replay: torch.Tensor  # [B] bool
    temperature: float


def pack(rollouts: list[TrainRollout], pad_id: int = 0) -> PackedBatch:
    width = max(r.num_tokens for r in rollouts)
    B = len(rollouts)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width - 1))
    old = torch.zeros((B, width - 1))
    for i, r in enumerate(rollouts):
        seq = r.prompt_ids + r.completion_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start = len(r.prompt_ids) - 1  # logits at position t predict token t+1
        mask[i, start : start + len(r.completion_ids)] = 1
        old[i, start : start + len(r.completion_ids)] = torch.tensor(r.logprobs)
    temps = {r.temperature for r in rollouts}
    if len(temps) != 1:
        raise ValueError(f"one temperature per batch expected, got {sorted(temps)}")
    return PackedBatch(
        ids, attn, ids[:, 1:], mask, old,
        torch.tensor([r.advantage for r in rollouts]),
        torch.tensor([r.is_replay for r in rollouts]),
        temps.pop(),
    )


def token_logprobs(model, batch: PackedBatch) -> torch.Tensor:
    """log pi_theta of every target token at the sampling temperature, [B, L-1]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logits = logits / batch.temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)


def train_step(model, optimizer, rollouts: list[TrainRollout], cfg, pad_id: int = 0) -> dict[str, float]:
    """Forward, token-mean clipped loss, backward, grad-norm clip, AdamW step; return metrics."""
    batch = pack(rollouts, pad_id)
    model.train()
    logp = token_logprobs(model, batch)
    loss, stats = grpo_loss(
        logp, batch.behaviour_logp, batch.advantage, batch.mask,
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    model.eval()
    metrics = {"loss": loss.item(), "grad_norm": grad_norm.item(), **{k: v.item() for k, v in stats.items()}}
    metrics.update(split_stats(logp.detach(), batch, cfg))
    metrics["tokens"] = int(batch.mask.sum().item())
    metrics["rollouts"] = len(rollouts)
    metrics["replay_share"] = float(batch.is_replay.float().mean().item())
    return metrics


def split_stats(logp: torch.Tensor, batch: PackedBatch, cfg) -> dict[str, float]:
    """Ratio statistics of fresh and replayed rollouts separately (``fresh/...``, ``replay/...``)."""
    from learner.grpo import token_mean

    out = {}
    ratio = torch.exp(logp - batch.behaviour_logp)
    adv = batch.advantage.unsqueeze(-1).expand_as(ratio)
    clipped = ((ratio < 1 - cfg.clip_low) & (adv < 0)) | ((ratio > 1 + cfg.clip_high) & (adv > 0))
    for name, rows in (("fresh", ~batch.is_replay), ("replay", batch.is_replay)):
        mask = batch.mask * rows.unsqueeze(-1)
        if mask.sum() > 0:
            out[f"{name}/ratio_mean"] = token_mean(ratio, mask).item()
            out[f"{name}/clip_fraction"] = token_mean(clipped.float(), mask).item()
            out[f"{name}/approx_kl"] = token_mean((ratio - 1) - (logp - batch.behaviour_logp), mask).item()
    return out


def make_optimizer(model, cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
