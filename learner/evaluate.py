"""Held-out accuracy: greedy completions scored with the task's reward, per difficulty."""

from __future__ import annotations

from collections import defaultdict

from producers.backends import Backend, Request
from schemas import Sampling


def heldout_accuracy(backend: Backend, problems, reward_fn, max_tokens: int, chunk: int = 512) -> dict[str, float]:
    """``{"accuracy": ..., "accuracy_d1": ..., ...}`` over ``problems``, greedy decoding.

    ``accuracy`` is the mean of the per-difficulty accuracies, so every difficulty counts
    the same however many held-out problems it has (1-digit addition has only 100)."""
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=max_tokens)
    hits: dict[int, list[float]] = defaultdict(list)
    for lo in range(0, len(problems), chunk):
        part = problems[lo : lo + chunk]
        reqs = [Request(backend.encode(p.prompt, chat=p.chat), 1, sampling) for p in part]
        for p, (c,) in zip(part, backend.generate(reqs, greedy=True)):
            hits[p.difficulty].append(reward_fn(backend.decode(c.token_ids), p.answer))
    out = {f"accuracy_d{d}": sum(v) / len(v) for d, v in sorted(hits.items())}
    return {"accuracy": sum(out.values()) / max(1, len(out)), **out}
