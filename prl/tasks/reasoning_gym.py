"""`prl data reasoning-gym`: problems from reasoning-gym's procedural generators as
verl-style Parquet, with train and test sets that never share a problem.

reasoning-gym (PyPI) has about a hundred generators (arithmetic, algorithms, logic, games),
each with its own answer checker. One row per problem::

    data_source   "reasoning_gym/<task>"
    prompt        [{"role": "system", ...}, {"role": "user", "content": <question>}]
    ability       "reasoning"
    reward_model  {"style": "rule", "ground_truth": <JSON: answer, task, settings, entry>}
    extra_info    {"index": "<task>-<n>", "split": "train" | "test", "answer": <answer text>}
    difficulty    the generator's difficulty settings for this problem (the group column)

``ground_truth`` carries what the checker needs (the generator's entry with its metadata,
and the settings it was made with), so ``prl.rewards:reasoning_gym`` scores a
completion with the generator's own ``score_answer``. ``extra_info.answer`` is the plain
answer, for people.

Train and test are split by an *unordered* key: a question with its numbers sorted, so
"gcd of 12, 18" and "gcd of 18, 12" (or "3 + 5" and "5 + 3") always land on the same side.
Exact repeats are dropped. Every row is checked once: its own answer must score 1.0.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

SYSTEM_PROMPT = "Answer with only the final answer."
ATTEMPTS_PER_ROW = 20  # generator draws per requested problem before giving up (small problem spaces)


class DataError(ValueError):
    """The data cannot be made as asked; the message says what to change."""


@dataclass(frozen=True)
class DataSummary:
    out_dir: str
    task: str
    train: int
    test: int
    groups: dict[str, int]
    drawn: int
    duplicates: int
    seconds: float


def unordered_key(question: str) -> str:
    """The question with its numbers taken out and listed sorted: problems that differ only
    in the order of their numbers share a key (and so a side of the split)."""
    numbers = sorted(re.findall(r"\d+", question), key=lambda n: (len(n), n))
    return re.sub(r"\d+", "#", question) + "|" + ",".join(numbers)


def goes_to_test(key: str, test_share: float) -> bool:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < test_share


def difficulty_label(metadata: dict) -> str | None:
    """The generator's difficulty settings for one problem: a setting the problem records a
    value for (``num_terms=3``), else the configured range (``value=1-1000``)."""
    settings = metadata.get("difficulty")
    if not isinstance(settings, dict) or not settings:
        return None
    parts = []
    for name, rng in sorted(settings.items()):
        if name in metadata and isinstance(metadata[name], (int, float, str)):
            parts.append(f"{name}={metadata[name]}")
        elif isinstance(rng, (list, tuple)) and len(rng) == 2:
            parts.append(f"{name}={rng[0]}-{rng[1]}")
        else:
            parts.append(f"{name}={rng}")
    return ",".join(parts)


def make_generator(task: str, seed: int, size: int, settings: dict):
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        close = [n for n in sorted(DATASETS) if task.replace("-", "_") in n or n in task]
        hint = f" (did you mean {', '.join(close[:5])}?)" if close else f"; known: {len(DATASETS)} tasks, e.g. gcd, chain_sum"
        raise DataError(f"unknown reasoning-gym task {task!r}{hint}")
    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **settings)
    except (TypeError, ValueError, AssertionError) as exc:
        raise DataError(f"{task}: settings {settings} rejected by the generator: {exc}") from None


def make_rows(task: str, train: int, test: int, seed: int, settings: dict, system_prompt: str = SYSTEM_PROMPT):
    """(train rows, test rows, problems drawn, duplicates skipped)."""
    if train < 1 or test < 0:
        raise DataError(f"--train must be >= 1 and --test >= 0 (got {train}, {test})")
    budget = ATTEMPTS_PER_ROW * (train + test)
    gen = make_generator(task, seed, budget, settings)
    share = test / (train + test)
    sides: dict[str, list[dict]] = {"train": [], "test": []}
    want = {"train": train, "test": test}
    seen: set[str] = set()
    drawn = duplicates = 0
    for idx in range(budget):
        if all(len(sides[s]) >= want[s] for s in sides):
            break
        entry = gen[idx]
        drawn += 1
        if entry["question"] in seen:
            duplicates += 1
            continue
        seen.add(entry["question"])
        side = "test" if goes_to_test(unordered_key(entry["question"]), share) else "train"
        if len(sides[side]) < want[side]:
            sides[side].append(_row(task, settings, entry, side, len(sides[side]), system_prompt))
    for side in sides:
        if len(sides[side]) < want[side]:
            raise DataError(f"{task}: only {len(sides[side])} distinct {side} problems in {drawn} draws (asked for "
                            f"{want[side]}); ask for fewer or widen the generator's settings with --set")
    return sides["train"], sides["test"], drawn, duplicates


def _row(task: str, settings: dict, entry: dict, split: str, n: int, system_prompt: str) -> dict:
    from prl.rewards import reasoning_gym as reward

    metadata = json.loads(json.dumps(entry.get("metadata", {}), default=str))
    truth = json.dumps({"answer": entry["answer"], "task": task, "settings": settings,
                        "entry": {"question": entry["question"], "answer": entry["answer"], "metadata": metadata}})
    if reward(str(entry["answer"]), truth) != 1.0:  # the checker must accept its own answer after the round trip
        raise DataError(f"{task}: the checker does not accept the generator's own answer for {entry['question'][:80]!r}")
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": entry["question"]}]
    return {
        "data_source": f"reasoning_gym/{task}",
        "prompt": messages,
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": f"{task}-{split}-{n}", "split": split, "answer": str(entry["answer"])},
        "difficulty": difficulty_label(metadata),
    }


def write_dataset(task: str, train: int, test: int, seed: int, out_dir: str | Path, settings: dict | None = None,
                  system_prompt: str = SYSTEM_PROMPT) -> DataSummary:
    """Write ``train.parquet``, ``test.parquet`` and ``dataset.json`` (how they were made)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    settings = dict(settings or {})
    train_rows, test_rows, drawn, duplicates = make_rows(task, train, test, seed, settings, system_prompt)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train_rows), ("test", test_rows)):
        pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")
    groups: dict[str, int] = {}
    for r in train_rows:
        groups[str(r["difficulty"])] = groups.get(str(r["difficulty"]), 0) + 1
    summary = DataSummary(str(out), task, len(train_rows), len(test_rows), groups, drawn, duplicates,
                          round(time.perf_counter() - t0, 2))
    meta = {**summary.__dict__, "seed": seed, "settings": settings, "system_prompt": system_prompt,
            "reward": "prl.rewards:reasoning_gym", "split": "by unordered question (numbers sorted)",
            "reasoning_gym_version": _version("reasoning-gym")}
    (out / "dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
    return summary


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"
