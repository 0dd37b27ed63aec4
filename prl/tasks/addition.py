"""The built-in verifiable task: integer addition with graded difficulty.

A problem adds two operands of the same number of digits (1 to ``max_digits``); its
difficulty is that digit count. Answers are written with their digits reversed
(12 + 39 = 51 is written ``15``): least significant digit first lets a small model
propagate carries left to right, which makes 2- and 3-digit addition learnable
(measured on a prototype: 2-digit held-out accuracy 0.81 reversed against 0.15 written
normally, after the same warm-up).

Train and held-out problems are split by a stable hash of the problem's unordered form
(a+b and b+a together), so the two never share a problem nor a swapped twin, whatever sizes
are asked for.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

HELDOUT_SHARE = 5  # one problem in HELDOUT_SHARE belongs to the held-out side


@dataclass(frozen=True)
class Problem:
    """One verifiable problem. ``difficulty`` splits the held-out accuracy in reports; ``group``
    is the label of ``task.group_field`` ("" without one), which keys the shared prior;
    ``chat`` marks a prompt that is a JSON list of chat messages (for chat templates);
    ``env_args`` are its environment's arguments, a JSON object (``task.environment``)."""

    id: str
    prompt: str
    answer: str
    difficulty: int
    group: str = ""
    chat: bool = False
    env_args: str = ""


def problem_id(a: int, b: int, digits: int) -> str:
    return f"add{digits}:{a}+{b}"


def format_answer(total: int) -> str:
    """The expected completion text: the sum's digits, least significant first."""
    return str(total)[::-1]


def make_problem(a: int, b: int, digits: int, labelled: bool = False) -> Problem:
    return Problem(problem_id(a, b, digits), f"{a}+{b}=", format_answer(a + b), digits, str(digits) if labelled else "")


def unordered(pid: str) -> str:
    """``add2:39+12`` -> ``add2:12+39``: a problem and its swapped twin share this key."""
    head, _, terms = pid.partition(":")
    a, b = sorted(terms.split("+"), key=int)
    return f"{head}:{a}+{b}"


def is_heldout(pid: str) -> bool:
    """Which side of the split a problem is on, by its unordered key: a+b and b+a are always
    on the same side, so no held-out problem has its twin in training."""
    digest = hashlib.blake2b(unordered(pid).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % HELDOUT_SHARE == 0


def operand_range(digits: int) -> tuple[int, int]:
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def sample_problems(digits: int, count: int, *, heldout: bool, seed: int = 0, labelled: bool = False) -> list[Problem]:
    """Up to ``count`` distinct problems of one difficulty from one side of the split."""
    lo, hi = operand_range(digits)
    space = (hi - lo + 1) ** 2
    rng = random.Random(f"{seed}:{digits}:{heldout}")
    if space <= 4 * count:  # small space: enumerate it, then shuffle
        pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
        rng.shuffle(pairs)
    else:
        pairs = ((rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(50 * count))
    out: dict[str, Problem] = {}
    for a, b in pairs:
        p = make_problem(a, b, digits, labelled)
        if is_heldout(p.id) == heldout and p.id not in out:
            out[p.id] = p
            if len(out) == count:
                break
    return list(out.values())


def train_pool(per_digit, seed: int = 0, labelled: bool = False) -> list[Problem]:
    """The training pool: ``per_digit[d-1]`` problems of d digits, none held out; ``labelled``:
    each problem's group is its digit count (``task.group_field = "difficulty"``)."""
    return [p for d, n in enumerate(per_digit, 1) for p in sample_problems(d, n, heldout=False, seed=seed, labelled=labelled)]


def heldout_set(per_digit: int, max_digits: int, seed: int = 0) -> list[Problem]:
    """The evaluation set: up to ``per_digit`` held-out problems per difficulty."""
    return [p for d in range(1, max_digits + 1) for p in sample_problems(d, per_digit, heldout=True, seed=seed)]


def exact_match(completion: str, answer: str) -> float:
    """Reward 1.0 when the completion (stripped of spaces) is the answer, else 0.0."""
    return 1.0 if completion.strip() == answer else 0.0
