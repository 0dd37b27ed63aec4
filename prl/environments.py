"""Environments: a problem as an episode of turns (multi-turn and tool-using tasks).

``task.environment`` names the environment class (``module:Class``, or ``skyrl:<id>`` for a
skyrl-gym environment, run as it is); a producer makes one per episode with the problem's
prompt, answer, the run's reward function and the row's ``env_args`` (a JSON object: a seed,
settings). ``reset()`` gives the first messages, ``step(text)`` takes the model's turn and gives
the environment's next messages, a reward and whether the episode is done; either may be a
coroutine function. An episode's reward is the sum of its steps'. A single-turn task is the
one-turn case of the same interface: ``SingleTurn`` is the reward function alone.

Environments are code from outside the producer: ``Guard`` runs their calls on a worker thread
with a time limit and checks what comes back, and an environment that raises, hangs or answers
something that is not messages ends its episode with reward 0 and a counted reason
(``EpisodeFault``); the producer goes on.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Callable

from prl.errors import raised_at
from prl.timed import TimedCalls, past_limit

ENV_TIMEOUT_S = 10.0  # one reset or step call, at most
Messages = list[dict]


@dataclass(frozen=True)
class Step:
    messages: Messages  # what the environment says next ({role, content}), appended as context
    reward: float
    done: bool


class Environment:
    """The interface, and the one-turn default: the prompt as the first message."""

    max_turns = 8  # the producer ends an episode after this many model turns

    def __init__(self, prompt: str, answer: str, reward: Callable[[str, str], float], chat: bool = False, **args):
        self.prompt, self.answer, self.reward, self.chat, self.args = prompt, answer, reward, chat, args

    def reset(self) -> Messages:
        return json.loads(self.prompt) if self.chat else [{"role": "user", "content": self.prompt}]

    def step(self, text: str) -> Step:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SingleTurn(Environment):
    """Today's tasks: one model turn, scored by the reward function."""

    max_turns = 1

    def step(self, text: str) -> Step:
        return Step([], float(self.reward(text, self.answer)), True)


CALC = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg, ast.UAdd: operator.pos}


def arithmetic(expression: str) -> float:
    """The value of +, -, *, / and parentheses over numbers; ValueError for anything else."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    if len(expression) > 200:
        raise ValueError("expression too long")
    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(str(exc)) from None


class Calculator(Environment):
    """A calculator tool: a turn that writes ``<calc>expression</calc>`` gets
    ``<result>value</result>`` back; a turn without one is the answer, scored by the reward
    function. At most ``max_turns`` turns (args: ``max_turns``). The first messages are the
    tool's instructions, one worked exchange that uses it, phrased as reasoning-gym's arithmetic
    (a small model copies an example far better than it follows a description; a subclass sets
    its own ``EXAMPLE``), then the problem."""

    SYSTEM = ("You have a calculator. To use it, reply with only <calc>expression</calc>, for example "
              "<calc>123 + 456</calc>, and the result comes back as <result>579</result>. Then reply with only "
              "the final answer.")
    EXAMPLE = [{"role": "user", "content": "State the final answer to the following arithmetic problem: 318 + 475 ="},
               {"role": "assistant", "content": "<calc>318 + 475</calc>"},
               {"role": "user", "content": "<result>793</result>"},
               {"role": "assistant", "content": "793"}]

    def __init__(self, prompt, answer, reward, chat=False, max_turns: int = 4, **args):
        super().__init__(prompt, answer, reward, chat, **args)
        self.max_turns = int(max_turns)
        self.turns = 0

    def reset(self) -> Messages:
        """How to use the calculator (before the prompt's own system message, if any), the
        worked example, then the prompt's messages."""
        messages = super().reset()
        system = self.SYSTEM
        if messages and messages[0]["role"] == "system":
            system, messages = f"{self.SYSTEM} {messages[0]['content']}", messages[1:]
        return [{"role": "system", "content": system}, *self.EXAMPLE, *messages]

    def step(self, text: str) -> Step:
        self.turns += 1
        calls = CALC.findall(text)
        if not calls or self.turns >= self.max_turns:
            return Step([], float(self.reward(text, self.answer)), True)
        try:
            result = arithmetic(calls[-1])
            shown = str(int(result)) if float(result).is_integer() else f"{result:.6g}"
        except (ValueError, OverflowError) as exc:
            shown = f"error: {exc}"
        return Step([{"role": "user", "content": f"<result>{shown}</result>"}], 0.0, False)


class GuessNumber(Environment):
    """A guessing game: the answer is a whole number from ``low`` to ``high`` (args); each turn's
    guess is the first number in the range it writes, answered "Higher." or "Lower." (or how to
    guess, for a turn without one). Reward 1 for finding it within ``max_turns`` turns (args;
    default: enough for a binary search, plus one), else 0. Rows: ``prl data guess-number``."""

    def __init__(self, prompt, answer, reward, chat=False, low: int = 1, high: int = 100, max_turns: int | None = None,
                 **args):
        super().__init__(prompt, answer, reward, chat, **args)
        self.low, self.high, self.secret = int(low), int(high), int(answer)
        self.max_turns = int(max_turns) if max_turns else math.ceil(math.log2(self.high - self.low + 1)) + 1

    def step(self, text: str) -> Step:
        guess = next((n for n in map(int, NUMBER.findall(text)) if self.low <= n <= self.high), None)
        if guess == self.secret:
            return Step([], 1.0, True)
        if guess is None:
            say = f"Answer with one whole number from {self.low} to {self.high}."
        else:
            say = "Higher." if guess < self.secret else "Lower."
        return Step([{"role": "user", "content": say}], 0.0, False)


NUMBER = re.compile(r"-?\d+")


class SkyRL(Environment):
    """A skyrl-gym environment as it is (``task.environment = "skyrl:<id>"``, e.g.
    ``skyrl:gsm8k_multi_turn``): made with ``skyrl_gym.make(id, env_config, extras)``, where
    extras hold the answer as ``reward_spec.ground_truth`` and the row's ``env_args``;
    ``init`` gives the first messages, ``step`` the rest. Its own reward, not the run's."""

    def __init__(self, prompt, answer, reward, chat=False, env_id: str = "", env_config: dict | None = None, **args):
        import skyrl_gym

        super().__init__(prompt, answer, reward, chat, **args)
        extras = {"reward_spec": {"ground_truth": answer}, "extra_info": args.pop("extra_info", {}), **args}
        self.env = skyrl_gym.make(env_id, env_config=env_config or {}, extras=extras)
        self.max_turns = int(getattr(self.env, "max_turns", Environment.max_turns))

    def reset(self) -> Messages:
        messages, _ = self.env.init(super().reset())
        return messages

    def step(self, text: str) -> Step:
        out = self.env.step(text)
        return Step(out["observations"], out["reward"], out["done"])

    def close(self) -> None:
        self.env.close()


def environment_class(spec: str):
    """(the class ``task.environment`` names, constructor arguments it adds). It needs ``reset``
    and ``step``; ``close`` and ``max_turns`` are optional (Environment's are the defaults)."""
    if spec.startswith("skyrl:"):
        return SkyRL, {"env_id": spec.removeprefix("skyrl:")}
    from prl.plugins import PluginError, load

    cls = load(spec, "task.environment")
    missing = [name for name in ("reset", "step") if not callable(getattr(cls, name, None))] if isinstance(cls, type) else []
    if missing:  # (a factory function is taken as it is)
        raise PluginError(f"task.environment {spec!r}: it has no {' or '.join(missing)} method; an environment has "
                          "reset() -> messages and step(text) -> (messages, reward, done) (prl/environments.py)")
    return cls, {}


def max_turns(env) -> int:
    return getattr(env, "max_turns", Environment.max_turns)


class EpisodeFault(Exception):
    """An environment call that raised, hung or answered garbage: ``reason`` is counted."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


def checked_messages(value) -> Messages:
    if not isinstance(value, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        raise EpisodeFault("env_garbage", f"messages must be a list of {{role, content}} strings, got {str(value)[:80]}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def checked_step(value) -> Step:
    if isinstance(value, tuple) and len(value) == 3:
        value = Step(*value)
    if not isinstance(value, Step) or not isinstance(value.done, bool) or isinstance(value.reward, bool) \
            or not isinstance(value.reward, (int, float)) or not math.isfinite(value.reward):
        raise EpisodeFault("env_garbage", f"step must give Step(messages, finite reward, done), got {str(value)[:80]}")
    return Step(checked_messages(value.messages), float(value.reward), value.done)


class Guard:
    """Environment calls on ``workers`` threads at once, each within ``timeout_s``
    (prl/timed.py); coroutines are run to their end there. A call that raises or hangs ends in
    an EpisodeFault (a hung thread is left behind)."""

    def __init__(self, timeout_s: float = ENV_TIMEOUT_S, workers: int = 4):
        self.timeout_s = timeout_s
        self.calls = TimedCalls(workers, "environment")

    def many(self, calls: list[tuple[Callable, tuple]]) -> list:
        """Each (function, arguments) of ``calls`` run: its value, or the EpisodeFault that ended it."""
        finished = self.calls.run([(run_to_end, (fn, *args)) for fn, args in calls], self.timeout_s)
        return [self.outcome(future, fn) for future, (fn, _) in zip(finished, calls)]

    def all(self, calls: list[tuple[Callable, tuple]]) -> list:
        """Each call's value; the first EpisodeFault among them raised."""
        values = self.many(calls)
        if fault := next((v for v in values if isinstance(v, EpisodeFault)), None):
            raise fault
        return values

    def call(self, fn, *args):
        return self.all([(fn, args)])[0]

    def outcome(self, future, fn):
        if future is None:
            return EpisodeFault("env_timeout", f"{getattr(fn, '__qualname__', fn)} {past_limit(self.timeout_s)}")
        try:
            return future.result()
        except EpisodeFault as fault:
            return fault
        except Exception as exc:
            return EpisodeFault("env_error", f"{type(exc).__name__}: {exc} (at {raised_at(exc)})")

    def close(self) -> None:
        self.calls.close()


def run_to_end(fn, *args):
    value = fn(*args)
    return asyncio.run(value) if inspect.iscoroutine(value) else value
