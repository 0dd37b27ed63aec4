"""Held-out accuracy: greedy completions scored with the task's reward, per difficulty."""

from __future__ import annotations

from collections import defaultdict

from prl.generation import Backend, Request
from prl.schemas import Sampling


def encode_heldout(backend: Backend, problems, max_tokens: int) -> list[list[int]]:
    """Every held-out prompt's token ids, checked once: a prompt the model cannot take (a
    chat prompt without a chat template, or too long for its context) raises ValueError
    naming the problem, before any training."""
    out = []
    sampling = Sampling(max_tokens=max_tokens)
    for p in problems:
        try:
            ids = backend.encode(p.prompt, chat=p.chat)
            backend.check(ids, sampling)
        except ValueError as exc:
            raise ValueError(f"held-out problem {p.id}: {exc}") from None
        out.append(ids)
    return out


def heldout_accuracy(backend: Backend, problems, prompt_ids: list[list[int]], reward_fn, max_tokens: int,
                     chunk: int = 512) -> dict[str, float]:
    """``{"accuracy": ..., "accuracy_d1": ..., ...}`` over ``problems`` (prompts already
    encoded by :func:`encode_heldout`), greedy decoding.

    ``accuracy`` is the mean of the per-difficulty accuracies, so every difficulty counts
    the same however many held-out problems it has (1-digit addition has only 100)."""
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=max_tokens)
    hits: dict[int, list[float]] = defaultdict(list)
    for lo in range(0, len(problems), chunk):
        part = problems[lo : lo + chunk]
        reqs = [Request(ids, 1, sampling) for ids in prompt_ids[lo : lo + chunk]]
        for p, (c,) in zip(part, backend.generate(reqs, greedy=True)):
            hits[p.difficulty].append(reward_fn(backend.decode(c.token_ids), p.answer))
    out = {f"accuracy_d{d}": sum(v) / len(v) for d, v in sorted(hits.items())}
    return {"accuracy": sum(out.values()) / max(1, len(out)), **out}
