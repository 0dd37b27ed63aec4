"""One GRPO optimizer step on a TrainBatch: pack, score, loss, backward, clip, step.

The seed paper's optimizer settings are constants here (one epoch per batch, no KL): AdamW
with weight decay 0.01, global grad-norm clip 1.0, dual clip c = 10; the learning rate and the
PPO clip range are settings (``learner.lr``, ``learner.clip_low``, ``learner.clip_high``)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from prl.devices import autocast, module_device
from prl.learner.grpo import approx_kl, grpo_loss, is_clipped, policy_ratio
from prl.schemas import TrainRollout

WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
DUAL_CLIP = 10.0
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


@dataclass
class PackedBatch:
    """Rows laid out ``[pad][prompt][completion][pad]`` with every prompt ending in the same
    column, so the completions share columns ``P .. P+C-1`` and only those go through the
    output layer (``logits_to_keep``): on a 49k-token vocabulary the output layer and its
    log-softmax are most of a step otherwise. Per-token tensors are [B, C] over completion
    positions."""

    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    position_ids: torch.Tensor  # [B, P + C], counted from each row's first real token
    targets: torch.Tensor  # [B, C] completion token ids (pad where a row is shorter)
    mask: torch.Tensor  # [B, C], 1 where the target is a completion token the model sampled (not an environment's)
    behaviour_logp: torch.Tensor  # [B, C]
    advantage: torch.Tensor  # [B]
    sample_weight: torch.Tensor  # [B] a replayed rollout's importance weight (1 for fresh ones)
    is_replay: torch.Tensor  # [B] bool
    policy_version: torch.Tensor  # [B] the version that sampled each row
    temperature: float
    left_padded: bool = True  # some prompt is shorter than P: attention needs the padding mask

    def to(self, device) -> "PackedBatch":
        """The same batch on ``device`` (packed on the host, trained where the model lives)."""
        moved = {name: getattr(self, name).to(device, non_blocking=True) for name in TENSORS}
        return PackedBatch(**moved, temperature=self.temperature, left_padded=self.left_padded)


TENSORS = ("input_ids", "attention_mask", "position_ids", "targets", "mask", "behaviour_logp", "advantage", "sample_weight",
           "is_replay", "policy_version")


def padded_shape(rollouts: list[TrainRollout]) -> tuple[int, int]:
    """(longest prompt, longest completion): a packed batch is rows x their sum wide."""
    return max(len(r.prompt_ids) for r in rollouts), max(len(r.completion_ids) for r in rollouts)


def pack(rollouts: list[TrainRollout], pad_id: int = 0) -> PackedBatch:
    temps = {r.temperature for r in rollouts}
    if len(temps) != 1:
        raise ValueError(f"one temperature per batch expected, got {sorted(temps)}")
    P, C = padded_shape(rollouts)
    B = len(rollouts)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    mask = torch.zeros((B, C))
    old = torch.zeros((B, C))
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids[i, P - p : P] = torch.from_numpy(r.prompt_ids.astype(np.int64))
        ids[i, P : P + c] = torch.from_numpy(r.completion_ids.astype(np.int64))
        attn[i, P - p : P + c] = 1
        mask[i, :c] = torch.from_numpy(r.model_mask.astype(np.float32)) if len(r.model_mask) else 1  # the model's tokens
        old[i, :c] = torch.from_numpy(r.logprobs.astype(np.float32))
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    return PackedBatch(
        ids, attn, positions, ids[:, P:], mask, old,
        torch.tensor([r.advantage for r in rollouts]),
        torch.tensor([r.sample_weight for r in rollouts], dtype=torch.float32),
        torch.tensor([r.is_replay for r in rollouts]),
        torch.tensor([r.policy_version for r in rollouts], dtype=torch.long),
        temps.pop(),
        left_padded=any(len(r.prompt_ids) < P for r in rollouts),
    )


# The output layer turns each completion position into logits over the vocabulary: [B, C, V]
# float32 tensors, several alive at once in a step, were most of a long micro-batch's memory
# (`prl bench memory --learner`). So it computes log-probs itself, LOGIT_BLOCK logits at a time,
# each block's logits recomputed in backward instead of kept.
LOGIT_BLOCK = 1 << 27  # 134M logits, 512 MiB in float32: 883 positions of a 152k-token vocabulary
# Model types whose causal-LM forward returns its output layer's logits as they are (no
# soft-cap or scale after it: Gemma and Cohere have one), so that layer may return log-probs
# instead; other models take their whole logits (tests/unit/test_logprob_blocks.py checks each).
HEAD_IS_LOGITS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def token_logprobs(model, batch: PackedBatch) -> torch.Tensor:
    """log pi_theta of every completion token at the sampling temperature, [B, C]."""
    return token_scores(model, batch)[0]


def token_scores(model, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi_theta of every completion token at the sampling temperature, the entropy of
    pi_theta at each of those positions, detached), [B, C] each.

    Only the C positions before completion tokens go through the output layer (each predicts
    the token after it), a block at a time (LOGIT_BLOCK) where the model allows it."""
    C = batch.targets.shape[1]
    if getattr(model.config, "model_type", None) not in HEAD_IS_LOGITS:
        scores = scored(forward(model, batch, C + 1).logits[:, :-1], batch.targets, batch.temperature)
    else:
        with head_returns_scores(model.get_output_embeddings(), batch.targets, batch.temperature):
            scores = forward(model, batch, C + 1).logits
    return scores[..., 0], scores[..., 1].detach()


def forward(model, batch: PackedBatch, keep: int):
    """The model on the batch, through the output layer at the last ``keep`` positions only."""
    if not batch.left_padded:  # the causal mask alone is exact (right padding comes after every real token),
        return model(input_ids=batch.input_ids, logits_to_keep=keep)  # and attention takes its fused kernels
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                 logits_to_keep=keep)


def scored(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., 2]: log softmax(logits / temperature) at ``targets``, as logit - logsumexp(logits) in
    float32 (no log-softmax over the vocabulary kept), and that distribution's entropy, detached
    (a diagnostic: a policy whose entropy collapses stops exploring)."""
    logits = logits.float()
    logits = logits / temperature if temperature != 1.0 else logits
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return torch.stack([logp, entropy(logits)], -1)


@torch.no_grad()
def entropy(logits: torch.Tensor, rows: int = 256) -> torch.Tensor:
    """-sum p log p of softmax(logits) over the last dimension, ``rows`` positions at a time (one
    [rows, V] temporary, not another copy of the logits)."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [torch.special.entr(torch.softmax(block, -1)).sum(-1) for block in flat.split(rows)]
    return torch.cat(parts).view(logits.shape[:-1]) if parts else logits.new_zeros(logits.shape[:-1])


@contextlib.contextmanager
def head_returns_scores(head, targets: torch.Tensor, temperature: float):
    """Within it, the output layer ``head`` maps its input [B, C + 1, H] to ``scored`` log-probs
    and entropies of ``targets``, [B, C, 2], in blocks; the model's forward (and FSDP's hooks on
    it) run unchanged."""
    own = head.__dict__.get("forward")  # an instance's own forward (accelerate sets one), or None
    linear = head.forward
    head.forward = lambda hidden: blocked_scores(linear, hidden[:, :-1], targets, temperature, head.weight.shape[0])
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def blocked_scores(linear, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, vocab: int) -> torch.Tensor:
    """``scored(linear(hidden), targets, temperature)``, LOGIT_BLOCK logits at a time: with more
    than one block, each is checkpointed, so backward recomputes its logits."""
    positions = max(1, LOGIT_BLOCK // vocab)
    if targets.numel() <= positions:
        return scored(linear(hidden), targets, temperature)
    flat, wanted = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    blocks = [checkpoint(lambda h, t: scored(linear(h), t, temperature), flat[i : i + positions],
                         wanted[i : i + positions], use_reentrant=False, preserve_rng_state=False)
              for i in range(0, len(flat), positions)]
    return torch.cat(blocks).view(*targets.shape, 2).clone()  # not a view: FSDP hooks the model's output, and warns of views


def plan_micro_batches(rollouts: list[TrainRollout], max_tokens: int, world: int = 1) -> list[list[list[TrainRollout]]]:
    """Micro-batches per rank, by token budget (padding-aware: rows sorted by length, so a
    micro-batch's padded size, rows x (longest prompt + longest completion), stays within
    ``max_tokens``). Every rank gets the same number of micro-batches (FSDP needs lockstep
    forwards); missing ones are []."""
    mbs: list[list[TrainRollout]] = []
    current: list[TrainRollout] = []
    P = C = 0  # the current micro-batch's longest prompt and completion
    for r in sorted(rollouts, key=lambda r: (r.num_tokens, len(r.prompt_ids)), reverse=True):
        p, c = max(P, len(r.prompt_ids)), max(C, len(r.completion_ids))
        if current and (p + c) * (len(current) + 1) > max_tokens:
            mbs.append(current)
            current, p, c = [], len(r.prompt_ids), len(r.completion_ids)
        current.append(r)
        P, C = p, c
    if current:
        mbs.append(current)
    per_rank = [mbs[i::world] for i in range(world)]
    n = max(len(p) for p in per_rank)
    return [p + [[]] * (n - len(p)) for p in per_rank]


# Every completion token; fresh rollouts' and replayed ones'; fresh ones sampled by the weights
# the step starts from (age 0: their ratio is the engine-trainer mismatch alone) and older ones.
PARTS = ("all", "fresh", "replay", "age0", "stale")
SUMMED = ("tokens", "clipped", "approx_kl", "ratio", "entropy")
# The age-0 tokens' log-ratios, counted in bins of 0.001 over [-0.5, 0.5] plus one below and one
# above (summed over micro-batches and ranks like the rest): the mismatch's quantiles, to 0.1%.
LOG_RATIO_EDGES = torch.linspace(-0.5, 0.5, 1001, dtype=torch.float64)
# Every trained token by its rollout's age (fresh and replayed alike), 0 to AGE_BINS - 2 and older
# in the last bin: how far off-policy older rollouts are (clipped tokens, k3 KL), for scheduler.tau_max.
AGE_BINS = 12
AGE_SUMMED = ("tokens", "clipped", "approx_kl")
STAT_NAMES = ("loss", *(f"{part}/{name}" for part in PARTS for name in SUMMED),
              *(f"age0/log_ratio_bin/{i}" for i in range(len(LOG_RATIO_EDGES) + 1)),
              *(f"age/{i}/{name}" for i in range(AGE_BINS) for name in AGE_SUMMED))
MISMATCH_QUANTILES = (0.001, 0.01, 0.5, 0.99, 0.999)


def part_rows(batch: PackedBatch, version: int) -> list[torch.Tensor]:
    """The rows of each of PARTS, as [B] bool tensors (``version``: the weights the step starts from)."""
    fresh = ~batch.is_replay
    return [torch.ones_like(fresh), fresh, batch.is_replay, fresh & (batch.policy_version == version),
            fresh & (batch.policy_version < version)]


def micro_batch_sums(model, batch: PackedBatch, total_tokens: int, cfg, version: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(this micro-batch's share of the batch loss, detached sums of STAT_NAMES, the age-0
    log-ratios' [max, -min]). The loss is ``grpo_loss`` normalised by the batch's ``total_tokens``,
    so micro-batch losses add up to the batch's; the diagnostics come from the same function
    per part."""
    logp, entropies = token_scores(model, batch)
    options = dict(clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=DUAL_CLIP)
    loss, _ = grpo_loss(logp, batch.behaviour_logp, batch.advantage, batch.mask, total_tokens=total_tokens,
                        sample_weight=batch.sample_weight, **options)
    sums = [loss.detach() * total_tokens]
    with torch.no_grad():
        parts = part_rows(batch, version)
        for rows in parts:
            mask = batch.mask * rows.unsqueeze(-1)
            _, stats = grpo_loss(logp.detach(), batch.behaviour_logp, batch.advantage, mask, **options)
            n = mask.sum()
            sums += [n, *(stats[name] * n for name in ("clip_fraction", "approx_kl", "ratio_mean")), (entropies * mask).sum()]
        age0 = (batch.mask * parts[PARTS.index("age0")].unsqueeze(-1)) > 0
        log_ratio = (logp.detach() - batch.behaviour_logp)[age0].double()
        bins = torch.bucketize(log_ratio, LOG_RATIO_EDGES.to(log_ratio.device))
        counts = torch.bincount(bins, minlength=len(LOG_RATIO_EDGES) + 1)
        extremes = torch.stack([log_ratio.max(), -log_ratio.min()]) if len(log_ratio) else \
            torch.full((2,), -math.inf, dtype=torch.float64, device=logp.device)
    return loss, torch.cat([torch.stack([torch.as_tensor(x, dtype=torch.float64, device=logp.device) for x in sums]),
                            counts.double(), age_sums(logp.detach(), batch, version, cfg)]), extremes


def age_sums(logp: torch.Tensor, batch: PackedBatch, version: int, cfg) -> torch.Tensor:
    """AGE_SUMMED per age bin, flat: the tokens, those a clip takes the gradient from, and their k3 KL."""
    mask = batch.mask > 0
    age = (version - batch.policy_version).clamp(0, AGE_BINS - 1)
    bins = age.unsqueeze(-1).expand_as(logp)[mask]
    log_rho = (logp - batch.behaviour_logp)[mask].double()
    clipped = is_clipped(policy_ratio(logp, batch.behaviour_logp)[mask], batch.advantage.unsqueeze(-1).expand_as(logp)[mask],
                         cfg.clip_low, cfg.clip_high, DUAL_CLIP)
    per_bin = [torch.bincount(bins, weights=w, minlength=AGE_BINS)
               for w in (torch.ones_like(log_rho), clipped.double(), approx_kl(torch.exp(log_rho), log_rho))]
    return torch.stack(per_bin, dim=1).flatten()


def train_step(model, optimizer, rollouts: list[TrainRollout], cfg, pad_id: int = 0, dist=None, device=None,
               version: int | None = None) -> dict[str, float]:
    """One optimizer step on a batch, over micro-batches of at most ``cfg.micro_batch_tokens``
    padded tokens with gradient accumulation, so the loss and gradients equal the whole-batch
    token-mean; under FSDP every rank takes its share of the micro-batches. Then grad-norm clip
    and AdamW step, none where the gradient's norm is not finite (``skipped`` 1); returns the
    batch's metrics (global). Micro-batches are packed on the host and moved to ``device``
    (default: where the model's parameters are). ``version``: the policy version of the weights
    the step starts from (default: the newest that sampled a rollout of the batch), against
    which rollouts are age 0 or stale.

    The token mean divides by the fresh rollouts' completion tokens (by all tokens when a batch
    has no fresh ones): replayed tokens add to the fresh gradient instead of diluting it, so
    ``scheduler.replay.ratio`` does not scale the fresh gradient down."""
    world, rank = (dist.world, dist.rank) if dist is not None else (1, 0)
    version = max(r.policy_version for r in rollouts) if version is None else version
    device = device if device is not None else module_device(model)
    total_tokens = token_mean_denominator(rollouts)
    plan = plan_micro_batches(rollouts, cfg.micro_batch_tokens, world)[rank]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums, extremes = accumulate_gradients(model, plan, total_tokens, cfg, pad_id, world, device, version)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)  # every rank's
    if math.isfinite(grad_norm):
        optimizer.step()
    else:  # an overflow: stepping would make every weight NaN; the weights and AdamW's moments stay
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return {
        **step_metrics(dict(zip(STAT_NAMES, sums.tolist())), total_tokens, extremes.tolist()),
        "grad_norm": grad_norm, "skipped": float(not math.isfinite(grad_norm)),
        "rollouts": len(rollouts),
        "replay_share": sum(r.is_replay for r in rollouts) / len(rollouts),
        "micro_batches": len(plan),
    }


def token_mean_denominator(rollouts: list[TrainRollout]) -> int:
    """The trained tokens of the batch's fresh rollouts (of all, if none is fresh)."""
    fresh = sum(r.model_tokens for r in rollouts if not r.is_replay)
    return fresh or sum(r.model_tokens for r in rollouts)


def accumulate_gradients(model, plan: list[list[TrainRollout]], total_tokens: int, cfg, pad_id: int, world: int, device,
                         version: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward every micro-batch of this rank's plan on ``device``; return the
    summed statistics and the age-0 log-ratios' [max, -min] over all ranks (read back to the
    host once, by the caller)."""
    sums = torch.zeros(len(STAT_NAMES), dtype=torch.float64, device=device)
    extremes = torch.full((2,), -math.inf, dtype=torch.float64, device=device)
    for mb in plan:
        with autocast(device, cfg.bf16_autocast):
            if mb:
                loss, mb_sums, mb_extremes = micro_batch_sums(model, pack(mb, pad_id).to(device), total_tokens, cfg, version)
                sums += mb_sums
                extremes = torch.maximum(extremes, mb_extremes)
            else:  # an empty slot: a zero-loss forward keeps this rank in step with the others
                loss = model(input_ids=torch.tensor([[pad_id]], device=device)).logits.sum() * 0.0
        (loss * world).backward()  # FSDP averages gradients over ranks; the loss is already global
    if world > 1:
        import torch.distributed as tdist

        tdist.all_reduce(sums)
        tdist.all_reduce(extremes, op=tdist.ReduceOp.MAX)
    return sums, extremes


def step_metrics(s: dict[str, float], total_tokens: int,
                 extremes: tuple[float, float] = (-math.inf, -math.inf)) -> dict[str, float]:
    """Token means of the summed statistics: overall, per part (fresh, replayed, age 0, stale)
    and per age; for age 0, the engine-trainer mismatch: its k3 KL and ratio mean, quantiles, min
    and max."""
    n = max(1, s["all/tokens"])
    metrics = {"loss": s["loss"] / max(1, total_tokens), "tokens": int(s["all/tokens"]),
               "clip_fraction": s["all/clipped"] / n, "approx_kl": s["all/approx_kl"] / n, "ratio_mean": s["all/ratio"] / n,
               "entropy": s["all/entropy"] / n}
    for part in PARTS[1:]:
        n = s[f"{part}/tokens"]
        if n > 0:
            metrics.update({f"{part}/ratio_mean": s[f"{part}/ratio"] / n, f"{part}/clip_fraction": s[f"{part}/clipped"] / n,
                            f"{part}/approx_kl": s[f"{part}/approx_kl"] / n, f"{part}/entropy": s[f"{part}/entropy"] / n,
                            f"{part}/tokens": int(n)})
    for i in range(AGE_BINS):
        if n := s[f"age/{i}/tokens"]:
            label = str(i) if i < AGE_BINS - 1 else f"{i}+"
            metrics.update({f"age/{label}/tokens": int(n), f"age/{label}/clip_fraction": s[f"age/{i}/clipped"] / n,
                            f"age/{label}/approx_kl": s[f"age/{i}/approx_kl"] / n})
    counts = np.array([s[f"age0/log_ratio_bin/{i}"] for i in range(len(LOG_RATIO_EDGES) + 1)])
    if counts.sum() > 0:
        lo, hi = math.exp(-extremes[1]), math.exp(extremes[0])  # a bin's outer edge can lie past every ratio seen
        metrics.update({"mismatch/kl": metrics["age0/approx_kl"], "mismatch/ratio_mean": metrics["age0/ratio_mean"],
                        "mismatch/ratio_min": lo, "mismatch/ratio_max": hi,
                        **{f"mismatch/ratio_q{q:g}": min(max(math.exp(log_ratio_quantile(counts, q)), lo), hi)
                           for q in MISMATCH_QUANTILES}})
    return metrics


def log_ratio_quantile(counts: np.ndarray, q: float) -> float:
    """The ``q`` quantile of log-ratios counted in LOG_RATIO_EDGES' bins (bin i holds
    (edge i-1, edge i]; bin 0 and the last hold what lies beyond the edges): the outer edge of
    the bin it falls in, lower below the median and upper above it (the quantile is at least
    that far out)."""
    edges = LOG_RATIO_EDGES.numpy()
    i = int(np.searchsorted(np.cumsum(counts), q * counts.sum()))
    return float(edges[max(i - 1, 0)] if q < 0.5 else edges[min(i, len(edges) - 1)])


def make_optimizer(model, cfg) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all the parameters, not a loop of kernels per tensor) where
    the parameters' device has one."""
    fused = module_device(model).type in FUSED_ADAMW_DEVICES
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=WEIGHT_DECAY, fused=fused or None)
