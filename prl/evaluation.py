"""Held-out accuracy: greedy completions scored with the task's reward, per difficulty.

Producers answer held-out problems with ``greedy_rewards`` (an EvalRequest names the version
that must answer); the scheduler's evaluator sums their rewards with ``accuracy``.
``heldout_accuracy`` does both in one process, on one backend: the reference the fleet's
figures are checked against, and what the benchmarks use on a checkpoint.
"""

from __future__ import annotations

from collections import defaultdict

from prl.generation import Backend, Request
from prl.schemas import Sampling


def encode_heldout(backend: Backend, problems, max_tokens: int) -> list[list[int]]:
    """Every held-out prompt's token ids, checked once: a prompt the model cannot take (a
    chat prompt without a chat template, or too long for its context) raises ValueError
    naming the problem."""
    out = []
    sampling = Sampling(max_tokens=max_tokens)
    for p in problems:
        try:
            ids = backend.encode(p.prompt, chat=p.chat)
            backend.check(ids, sampling)
        except ValueError as exc:
            raise ValueError(f"held-out problem {p.id if hasattr(p, 'id') else p.problem_id}: {exc}") from None
        out.append(ids)
    return out


def greedy_rewards(backend: Backend, prompt_ids: list[list[int]], answers: list[str], reward_fn, max_tokens: int,
                   chunk: int = 512) -> tuple[list[float], list[str]]:
    """(reward, completion text) of one greedy completion per prompt, in order. ``reward_fn``:
    (completion, answer) -> float, or a RewardRunner (prl/rewards.py), which scores a chunk's
    completions on its worker threads."""
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=max_tokens)
    rewards, texts = [], []
    for lo in range(0, len(prompt_ids), chunk):
        reqs = [Request(ids, 1, sampling) for ids in prompt_ids[lo : lo + chunk]]
        chunk_texts = [backend.decode(c.token_ids) for (c,) in backend.generate(reqs, greedy=True)]
        chunk_answers = answers[lo : lo + chunk]
        if hasattr(reward_fn, "many"):
            rewards += reward_fn.many(chunk_texts, chunk_answers)
        else:
            rewards += [float(reward_fn(t, a)) for t, a in zip(chunk_texts, chunk_answers)]
        texts += chunk_texts
    return rewards, texts


def accuracy(difficulties: list[int], rewards: list[float]) -> dict[str, float]:
    """``{"accuracy": ..., "accuracy_d1": ..., ...}``: ``accuracy`` is the mean of the
    per-difficulty accuracies, so every difficulty counts the same however many held-out
    problems it has (1-digit addition has only 100)."""
    hits: dict[int, list[float]] = defaultdict(list)
    for d, r in zip(difficulties, rewards):
        hits[d].append(r)
    out = {f"accuracy_d{d}": sum(v) / len(v) for d, v in sorted(hits.items())}
    return {"accuracy": sum(out.values()) / max(1, len(out)), **out}


def heldout_accuracy(backend: Backend, problems, prompt_ids: list[list[int]], reward_fn, max_tokens: int) -> dict[str, float]:
    """Accuracy over ``problems`` (prompts encoded by :func:`encode_heldout`), greedy, in one process."""
    rewards, _ = greedy_rewards(backend, prompt_ids, [p.answer for p in problems], reward_fn, max_tokens)
    return accuracy([p.difficulty for p in problems], rewards)
