"""Reward functions, chosen by config as ``module:function(completion, answer) -> float``."""

from __future__ import annotations

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


def safe_reward(fn: RewardFn, completion: str, answer: str) -> tuple[float, bool]:
    """(reward, ok): a reward that raises or is not a finite number counts as 0.0, not ok."""
    try:
        value = float(fn(completion, answer))
    except Exception:
        return 0.0, False
    return (value, True) if math.isfinite(value) else (0.0, False)
