"""`prl data guess-number`: rows of the guessing game (prl.environments:GuessNumber).

Each problem is a range [low, high] and a number in it; train and test never share a problem.
One row per problem: ``id``, ``prompt`` (chat: the rules, then the range), ``answer`` (the
number) and ``env_args`` ({"low", "high"}), ``difficulty`` the range's width in powers of two.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

SYSTEM = "You are playing a guessing game. Answer each time with one whole number only."
WIDTHS = (8, 16, 32)  # ranges of these sizes: 4, 5 or 6 guesses find the number by halving


def rows(n: int, rng: np.random.Generator, taken: set) -> list[dict]:
    out = []
    while len(out) < n:
        width = int(rng.choice(WIDTHS))
        low = int(rng.integers(1, 100))
        high = low + width - 1
        secret = int(rng.integers(low, high + 1))
        if (low, high, secret) in taken:
            continue
        taken.add((low, high, secret))
        out.append({"id": f"guess-{low}-{high}-{secret}", "answer": str(secret),
                    "prompt": [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": f"I am thinking of a whole number from {low} to {high}. Guess it. "
                                                           "After each guess I will say higher or lower."}],
                    "env_args": json.dumps({"low": low, "high": high}), "difficulty": int(math.log2(width))})
    return out


def write_dataset(train: int, test: int, seed: int, out_dir: str) -> tuple[int, int]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; (train, test) rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, taken = np.random.default_rng(seed), set()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("test", test), ("train", train)):
        pq.write_table(pa.Table.from_pylist(rows(n, rng, taken)), out / f"{name}.parquet")
    return train, test
