"""Episodes: a dispatch's G runs of its environment, token in and token out.

An episode's context is its prompt's tokens and every token after them: the model's turns as
they were sampled and the environment's turns as the chat template renders them
(``Backend.encode_turn``). Each round, one engine call samples the next turn of every live
episode with the version the producer serves, so the tokens trained are exactly the tokens
sampled: no turn is decoded and encoded again. An episode ends when its environment says so,
after its ``max_turns`` model turns, when the next turn would not fit the model's context, or
at a fault of its environment (reward 0, the reason counted). It becomes one Rollout: every
token after the prompt, the model's marked 1 in ``model_mask`` with their behaviour log-probs,
the environment's 0 with log-prob 0; the reward is the sum of its steps'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from prl.environments import Environment, EpisodeFault, Guard, checked_messages, checked_step, max_turns
from prl.generation import Backend, Completion, Request
from prl.schemas import Rollout, Sampling

ENV_TURN_TOKENS = 1024  # an environment turn longer than this ends the episode (env_too_long)


@dataclass
class Episode:
    env: Environment
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    finish: str = ""  # "" while it runs; "stop", "length", or the fault that ended it
    fault: str = ""  # what that fault was

    def add(self, ids: list[int], logprobs: list[float], model: int) -> None:
        self.tokens += ids
        self.logprobs += logprobs
        self.mask += [model] * len(ids)

    def rollout(self, backend: Backend) -> Rollout:
        mask = self.mask if 0 in self.mask else []  # a one-turn episode: every token the model's
        return Rollout(self.tokens, self.logprobs, self.reward, self.finish, backend.decode(self.tokens), mask)


def model_turns(model_mask) -> int:
    """How many turns the model took in a rollout: the runs of 1s in its mask (1 when empty)."""
    mask = list(model_mask)
    return sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])) if mask else 1


def start_episodes(backend: Backend, guard: Guard, make_env, n: int) -> list[Episode]:
    """``n`` episodes of one problem, each environment made by ``make_env()`` and reset. Their
    first messages must agree (a group shares its prompt); EpisodeFault if an environment
    cannot start, a prompt error (too long, no chat template) as the backend raises it."""
    envs = guard.all([(make_env, ())] * n)
    firsts = [checked_messages(m) for m in guard.all([(env.reset, ()) for env in envs])]
    if any(f != firsts[0] for f in firsts):
        raise EpisodeFault("env_resets_differ", "the environments of one problem began with different messages")
    prompt_ids = backend.encode(json.dumps(firsts[0]), chat=True)
    return [Episode(env, prompt_ids) for env in envs]


def close_episodes(episodes: list[Episode], guard: Guard) -> None:
    guard.many([(e.env.close, ()) for e in episodes if hasattr(e.env, "close")])  # its faults pass: the env's business


def run_episodes(backend: Backend, episodes: list[Episode], sampling: Sampling, guard: Guard,
                 greedy: bool = False) -> list[Episode]:
    """Run every episode to its end: each round, one engine call for the next turn of every live
    episode, then their environments' answers, ``guard``'s workers at a time."""
    while live := [e for e in episodes if not e.finish]:
        completions = [c for (c,) in backend.generate([Request(e.prompt_ids + e.tokens, 1, sampling) for e in live],
                                                      greedy=greedy)]
        steps = guard.many([(e.env.step, (backend.decode(c.token_ids),)) for e, c in zip(live, completions)])
        for e, c, step in zip(live, completions, steps):
            take_turn(e, c, step, backend, sampling)
    return episodes


def take_turn(e: Episode, c: Completion, step, backend: Backend, sampling: Sampling) -> None:
    """The model's turn ``c`` into episode ``e``, then what its environment answered (``step``,
    or the fault that ends the episode)."""
    e.add(c.token_ids, c.logprobs, 1)
    e.turns += 1
    try:
        if isinstance(step, EpisodeFault):
            raise step
        step = checked_step(step)
    except EpisodeFault as fault:
        e.reward, e.finish, e.fault = 0.0, fault.reason, str(fault)
        return
    e.reward += step.reward
    if step.done or e.turns >= max_turns(e.env):
        e.finish = "stop" if step.done else "length"
        return
    try:
        ids = backend.encode_turn(step.messages, ended=c.finish_reason == "stop")
    except Exception as exc:  # a template that cannot render what the environment said
        e.reward, e.finish, e.fault = 0.0, "env_unrenderable", f"{type(exc).__name__}: {exc}"[:400]
        return
    if len(ids) > ENV_TURN_TOKENS:
        e.reward, e.finish, e.fault = 0.0, "env_too_long", f"a turn of {len(ids)} tokens, over {ENV_TURN_TOKENS}"
    elif len(e.prompt_ids) + len(e.tokens) + len(ids) + sampling.max_tokens > backend.max_model_len:
        e.finish = "length"
    else:
        e.add(ids, [0.0] * len(ids), 0)
