"""Reward functions, chosen by config as ``module:function(completion, answer) -> float``.

Built in: ``prl.tasks.addition:exact_match`` (the built-in task), ``prl.rewards:math_verify``
(free-form math answers, boxed or final-answer, checked for equivalence with math-verify) and
``prl.rewards:reasoning_gym`` (problems made by ``prl data reasoning-gym``, scored by the
generator's own checker). A reward that raises, returns a non-number or runs past
``REWARD_TIMEOUT_S`` counts as 0.0 and is counted, and the producer warns (``reward_failed``,
with the error and where it was raised, at the 1st, 10th, 100th, ... time); it goes on (a reward
that needs longer, such as running code, enforces its own limit). A reward that fails the same way
on each of its first ``BROKEN_AFTER`` calls and never scores is broken (prl/plugins.py): the
producer stops, saying why (``RewardBroken``), instead of scoring every completion 0 for ever.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import re
from typing import Callable

import structlog

from prl.errors import raised_at
from prl.logs import Recurring
from prl.plugins import FailingFromTheStart, PluginError, load
from prl.timed import TimedCalls, past_limit

RewardFn = Callable[[str, str], float]
REWARD_TIMEOUT_S = 10.0


class RewardBroken(PluginError):
    """``producer.reward`` failed the same way on each of its first BROKEN_AFTER calls."""


def load_reward(spec: str) -> RewardFn:
    return load(spec, "producer.reward", called_with=("completion", "answer"))


def math_verify(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer (a \\boxed{} or the last expression) equals
    ``answer`` mathematically (1/2 == 0.5 == \\frac{1}{2}), else 0.0. math-verify's own time
    limits use ``signal.alarm``, which works on the main thread alone: they are off, and the
    producer's RewardRunner, which calls this on its worker thread, enforces the limit."""
    from math_verify import parse, verify

    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=None)
    return 1.0 if verify(gold, parse(completion, parsing_timeout=None), timeout_seconds=None) else 0.0


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def final_answers(completion: str) -> list[str]:
    """What a completion may mean as its final answer, tried in order: the last
    ``<answer>...</answer>`` if there is one, else the whole text (stripped); then the last
    number in it (GSM8K-style, for models that explain before answering)."""
    tagged = _ANSWER_TAG.findall(completion)
    out = [tagged[-1].strip() if tagged else completion.strip()]
    numbers = _NUMBER.findall(completion)
    if numbers and numbers[-1] not in out:
        out.append(numbers[-1])
    return out


@functools.lru_cache(maxsize=64)
def _reasoning_gym_checker(task: str, settings: str):
    """The generator, made with the settings the problem was made with (some checkers
    depend on them), as its own checker."""
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=1, seed=0, **json.loads(settings))


def reasoning_gym(completion: str, answer: str) -> float:
    """1.0 when the generator's own checker (``score_answer``) gives full marks to one of
    the completion's :func:`final_answers`, else 0.0 (partial credit counts as wrong: the
    scheduler's success rates and p(1-p) are defined on solved / not solved).

    ``answer`` is the row's ground truth as ``prl data reasoning-gym`` writes it, a JSON
    object with what the checker needs: ``{"answer", "task", "settings", "entry"}``."""
    spec = json.loads(answer)
    check = _reasoning_gym_checker(spec["task"], json.dumps(spec.get("settings", {}), sort_keys=True)).score_answer
    entry = spec["entry"]
    return 1.0 if any(check(a, entry) >= 1.0 for a in final_answers(completion)) else 0.0


class RewardRunner:
    """Scores completions on ``workers`` threads, each call within ``timeout_s``: a generation
    call's completions ``workers`` at a time (prl/timed.py), so a reward that waits on something
    (a judge model's API, a sandbox) goes that many times faster."""

    def __init__(self, fn: RewardFn, timeout_s: float = REWARD_TIMEOUT_S, log=None, workers: int = 1):
        self.fn, self.timeout_s = fn, timeout_s
        self.calls = TimedCalls(workers, "reward")
        self.errors = self.timeouts = 0
        self.health = FailingFromTheStart()
        self.name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
        self.failed = Recurring(log or structlog.get_logger("prl.rewards"), "reward_failed")

    def __call__(self, completion: str, answer: str) -> float:
        return self.many([completion], [answer])[0]

    def many(self, completions: list[str], answers: list[str]) -> list[float]:
        """The reward of each completion against its answer, in order."""
        finished = self.calls.run([(self.fn, pair) for pair in zip(completions, answers)], self.timeout_s)
        rewards = [self.timed_out() if f is None else self.value(f) for f in finished]
        if self.health.broken():
            raise RewardBroken(f"producer.reward {self.name} failed on each of its first {self.health.same} calls and never "
                               f"scored: {self.health.first}; a reward is module:function(completion, answer) -> float, "
                               "returning 0.0 for a wrong answer")
        return rewards

    def value(self, future: concurrent.futures.Future) -> float:
        """A finished call's reward; 0.0 for one that raised or is not a finite number (warned of)."""
        try:
            result = future.result()
        except Exception as exc:
            return self.failed_as("error", f"{type(exc).__name__}: {exc}"[:400], at=raised_at(exc))
        try:
            value = float(result)
        except (TypeError, ValueError):  # the function's fault, not this line's: no `at`
            return self.failed_as("not_a_number", f"returned {repr(result)[:100]}; scored 0")
        if not math.isfinite(value):
            return self.failed_as("not_finite", f"returned {value}; scored 0")
        self.health.succeeded()
        return value

    def failed_as(self, kind: str, error: str, **where) -> float:
        """Count and warn of a failed call (scored 0); ``health`` follows it."""
        self.health.failed(error.removesuffix("; scored 0") + (f" (at {where['at']})" if where.get("at") else ""))
        self.errors += 1
        self.failed(kind, reward=self.name, error=error, **where)
        return 0.0

    def timed_out(self) -> float:
        self.timeouts += 1
        self.failed("timeout", reward=self.name, error=f"{past_limit(self.timeout_s)}; scored 0")
        return 0.0

    def close(self) -> None:
        self.calls.close()
