"""Difficulty groups without a label: the model's own probability of each reference answer.

One teacher-forced forward pass per problem scores log P(answer, end of text | prompt) under a
model (at the sampling temperature). Cut into quantile bins, the scores group the problems for
the scheduler's group prior (``scheduler.priority.groups_path``), which learns each bin's real
success rate from its problems' first visits (empirical Bayes): the score only has to *rank*
problems, not be calibrated. On a task whose completion is the bare answer (the built-in one)
exp(score) is the probability that one sampled completion is exactly the answer; where the
model writes more than the answer (reasoning, tags) it is a proxy, weaker the more it writes.

The cost is one forward pass over prompt + answer per problem, less than generating one
completion; `prl bench learning` charges it as one rollout per problem scored.

The groups file (Parquet or JSONL) has a row per problem: ``id``, ``answer_logprob`` and
``group`` (the bin, 0 = least likely).
"""

from __future__ import annotations

import math

import numpy as np

from prl.tasks.datasets import DatasetError, read_rows


def answer_token_ids(tokenizer, problem) -> tuple[list[int], list[int]]:
    """(prompt ids as the producer encodes them, answer ids + end of text); the answer as a
    completion would write it (``prl.rewards.answer_text``)."""
    from prl.generation import encode_prompt
    from prl.rewards import answer_text

    answer = list(tokenizer(answer_text(problem.answer), add_special_tokens=False)["input_ids"])
    return encode_prompt(tokenizer, problem.prompt, problem.chat), answer + [tokenizer.eos_token_id]


def answer_logprobs(model, tokenizer, problems, temperature: float = 1.0, batch_size: int = 64, progress=None) -> np.ndarray:
    """log P(answer, end of text | prompt) of every problem, summed over the answer's tokens,
    with the logits divided by ``temperature`` as the producer samples. Rows are padded on the
    left with positions counted from each row's first token, as ``generate`` pads them, so every
    answer ends at the last position and only the last (longest answer + 1) positions need
    logits. ``progress(n)`` is called after each batch with the problems scored so far."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = np.zeros(len(problems))
    model.eval()
    for start in range(0, len(problems), batch_size):
        pairs = [answer_token_ids(tokenizer, p) for p in problems[start : start + batch_size]]
        width = max(len(q) + len(a) for q, a in pairs)
        keep = max(len(a) for _, a in pairs) + 1
        ids = torch.tensor([[pad] * (width - len(q) - len(a)) + q + a for q, a in pairs])
        mask = torch.tensor([[0] * (width - len(q) - len(a)) + [1] * (len(q) + len(a)) for q, a in pairs])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                           logits_to_keep=keep).logits[:, -keep:-1].float() / temperature
        token_logp = torch.log_softmax(logits, -1).gather(-1, ids[:, width - keep + 1 :, None])[..., 0]
        for row, (_, a) in enumerate(pairs):
            out[start + row] = float(token_logp[row, keep - 1 - len(a) :].sum())
        if progress is not None:
            progress(min(start + batch_size, len(problems)))
    return out


def quantile_bins(scores: np.ndarray, bins: int) -> np.ndarray:
    """Bin index (0 .. bins-1, 0 the lowest scores) of each score: ``bins`` groups of about equal
    size by rank; equal scores share a bin, so there may be fewer distinct bins."""
    scores = np.asarray(scores, dtype=float)
    if not len(scores):
        return np.zeros(0, dtype=np.int64)
    edges = np.quantile(scores, np.linspace(0, 1, bins + 1)[1:-1], method="inverted_cdf")
    return np.searchsorted(edges, scores, side="left").astype(np.int64)


def write_groups(uri: str, ids: list[str], scores: np.ndarray, groups: np.ndarray) -> None:
    """The groups file: one row per problem (id, answer_logprob, group), Parquet or JSONL by
    the name's ending."""
    import json

    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"id": list(ids), "answer_logprob": [float(s) for s in scores], "group": [int(g) for g in groups]}
    if uri.endswith(".parquet"):
        with fsspec.open(uri, "wb") as f:
            pq.write_table(pa.table(rows), f)
    elif uri.endswith(".jsonl"):
        with fsspec.open(uri, "wt") as f:
            f.writelines(json.dumps(dict(zip(rows, r))) + "\n" for r in zip(*rows.values()))
    else:
        raise DatasetError(f"{uri}: unknown format (name it .parquet or .jsonl)")


def score_into_groups(problems, model_path: str, out: str, bins: int, dtype: str = "float32", temperature: float = 1.0,
                      progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Score ``problems`` with the model at ``model_path``, bin the scores and write the groups
    file ``out``: (scores, bins)."""
    from prl.models import load_model, load_tokenizer

    if not out.endswith((".parquet", ".jsonl")):  # before the work, not after it
        raise DatasetError(f"{out}: unknown format (name it .parquet or .jsonl)")
    scores = answer_logprobs(load_model(model_path, dtype), load_tokenizer(model_path), problems, temperature,
                             progress=progress)
    groups = quantile_bins(scores, bins)
    write_groups(out, [p.id for p in problems], scores, groups)
    return scores, groups


def read_groups(uri: str, ids: list[str]) -> tuple[list[str], np.ndarray | None]:
    """(the group of each problem ``ids`` names, its answer_logprob or None when the file has no
    such column), from a groups file; a file without a group for one of them (made for another
    task or pool) fails with a DatasetError naming it."""
    groups: dict[str, str] = {}
    scores: dict[str, float] = {}
    for n, row in enumerate(read_rows(uri, "scheduler.priority.groups_path; `prl data likelihood` makes one")):
        if row.get("id") is None or row.get("group") is None:
            raise DatasetError(f"{uri}: row {n + 1}: missing column 'id' or 'group' (a groups file has id, group)")
        groups[str(row["id"])] = str(row["group"])
        if row.get("answer_logprob") is not None:
            score = row["answer_logprob"]
            if not isinstance(score, (int, float)) or not -math.inf < score <= 1e-6:
                raise DatasetError(f"{uri}: row {n + 1}: answer_logprob {score!r} is not a log-probability (a finite "
                                   f"number <= 0); make the file again with `prl data likelihood --out {uri}`")
            scores[str(row["id"])] = float(score)
    missing = [i for i in ids if i not in groups]
    if missing:
        raise DatasetError(f"{uri}: no group for {len(missing)} of the {len(ids)} training problems (first: "
                           f"{missing[0]!r}); make it for this task with `prl data likelihood --out {uri}`")
    has_scores = all(i in scores for i in ids)
    return [groups[i] for i in ids], np.asarray([scores[i] for i in ids]) if has_scores else None


def expected_success(answer_logprobs: np.ndarray, labels: np.ndarray, num_groups: int) -> np.ndarray:
    """Each group's mean exp(answer_logprob): the model's own chance of sampling the reference
    answer, averaged over the group's problems: its success rate when a completion is the bare
    answer (the built-in task), an underestimate when the model writes working before it."""
    return np.bincount(labels, np.exp(answer_logprobs), num_groups) / np.maximum(np.bincount(labels, None, num_groups), 1)
