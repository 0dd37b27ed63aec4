"""Reward functions, chosen by config as ``module:function(completion, answer) -> float``.

Built in: ``prl.tasks.addition:exact_match`` (the built-in task) and
``producers.rewards:math_verify`` (math answers, boxed or final-answer, checked for
equivalence with math-verify). A reward that raises, returns a non-number or runs past
``producer.reward_timeout_s`` counts as 0.0 and is counted; the producer goes on.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import math
from typing import Callable

RewardFn = Callable[[str, str], float]


def load_reward(spec: str) -> RewardFn:
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"reward {spec!r}: expected module:function")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {name} is not a function of {module}")
    return fn


def math_verify(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer (a \\boxed{} or the last expression) equals
    ``answer`` mathematically (1/2 == 0.5 == \\frac{1}{2}), else 0.0."""
    from math_verify import parse, verify

    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$")
    return 1.0 if verify(gold, parse(completion)) else 0.0


class RewardRunner:
    """Scores completions with a time limit per call, on one worker thread."""

    def __init__(self, fn: RewardFn, timeout_s: float):
        self.fn, self.timeout_s = fn, timeout_s
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
        self.errors = self.timeouts = 0

    def __call__(self, completion: str, answer: str) -> float:
        future = self.pool.submit(self.fn, completion, answer)
        try:
            value = float(future.result(timeout=self.timeout_s))
        except concurrent.futures.TimeoutError:
            # The stuck call keeps its thread; later calls get a fresh one.
            self.timeouts += 1
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
            return 0.0
        except Exception:
            self.errors += 1
            return 0.0
        if not math.isfinite(value):
            self.errors += 1
            return 0.0
        return value

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
