"""Environments and episodes (prl/environments.py, prl/episodes.py) with a scripted engine."""

import asyncio
import json
import threading

import pytest

from prl.environments import CALC, Calculator, Environment, EpisodeFault, Guard, SingleTurn, Step, arithmetic
from prl.episodes import close_episodes, run_episodes, start_episodes
from prl.generation import Backend, Completion
from prl.schemas import Sampling

ENV_IDS = [90, 91]  # what the scripted engine renders any environment turn as


class Scripted(Backend):
    """An engine that answers each episode's turns from a script (by the episode's first
    prompt token) as tokens whose text is the script's; environment turns are two tokens."""

    max_model_len = 64

    def __init__(self, scripts: dict[int, list[str]]):
        self.scripts = scripts
        self.vocab: dict[str, int] = {}
        self.calls = 0

    def token(self, text: str) -> int:
        return self.vocab.setdefault(text, 100 + len(self.vocab))

    def generate(self, requests, *, greedy=False):
        self.calls += 1
        out = []
        for r in requests:
            turn = sum(1 for t in r.prompt_ids if t == ENV_IDS[0])  # environment turns so far
            out.append([Completion([self.token(self.scripts[r.prompt_ids[0]][turn])], [-0.5], "stop")])
        return out

    def encode(self, text, chat=False):
        return [int(json.loads(text)[-1]["content"].split()[0])] if chat else [1]

    def decode(self, ids):
        names = {v: k for k, v in self.vocab.items()}
        return " ".join(names.get(i, "<env>") for i in ids)

    def encode_turn(self, messages, ended):
        return list(ENV_IDS)

    def load_state(self, tensors, version):
        pass

    def load_adapter(self, tensors, version):
        pass


def exact(text, answer):
    return 1.0 if text.strip() == answer else 0.0


def episodes_of(backend, make_env, n=1):
    return start_episodes(backend, Guard(timeout_s=2.0), make_env, n)


def test_calculator_arithmetic_takes_numbers_and_operators_alone():
    assert arithmetic("12 + 35") == 47 and arithmetic("2*(3+4) - 1") == 13 and arithmetic("-7/2") == -3.5
    for bad in ("__import__('os')", "2**99999", "1/0", "x + 1", "1" * 300):
        with pytest.raises(ValueError):
            arithmetic(bad)


def test_a_tool_using_episode_trains_the_models_tokens_and_sums_its_rewards():
    """Two rounds: the model asks the calculator, the environment answers (two tokens, mask 0,
    log-prob 0), the model answers: one rollout whose mask marks the two model turns."""
    backend = Scripted({7: ["<calc>3+4</calc>", "7"]})
    [e] = episodes_of(backend, lambda: Calculator("7 what is 3+4?", "7", exact))
    run_episodes(backend, [e], Sampling(max_tokens=4), Guard())
    r = e.rollout(backend)
    assert backend.calls == 2 and e.finish == "stop" and r.reward == 1.0
    assert r.completion_ids.tolist() == [backend.token("<calc>3+4</calc>"), *ENV_IDS, backend.token("7")]
    assert r.model_mask.tolist() == [1, 0, 0, 1] and r.logprobs.tolist() == [-0.5, 0.0, 0.0, -0.5]


def test_the_calculator_shows_a_worked_example_before_the_problem():
    chat = json.dumps([{"role": "system", "content": "Answer with only the final answer."},
                       {"role": "user", "content": "What is 2 + 2?"}])
    messages = Calculator(chat, "4", exact, chat=True).reset()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"].endswith("Answer with only the final answer.")
    assert CALC.fullmatch(messages[2]["content"]) and messages[-1]["content"] == "What is 2 + 2?"
    assert Calculator("What is 2 + 2?", "4", exact).reset()[1:] == messages[1:]


def test_a_single_turn_episode_is_todays_rollout():
    backend = Scripted({5: ["9"]})
    [e] = episodes_of(backend, lambda: SingleTurn("5 what is 4+5?", "9", exact))
    run_episodes(backend, [e], Sampling(max_tokens=4), Guard())
    r = e.rollout(backend)
    assert r.reward == 1.0 and len(r.model_mask) == 0 and r.completion_ids.tolist() == [backend.token("9")]


def test_an_episode_ends_at_its_turn_limit_and_before_the_context_is_full():
    backend = Scripted({3: ["<calc>1+1</calc>"] * 10})
    [limited] = episodes_of(backend, lambda: Calculator("3 loop", "2", exact, max_turns=3))
    run_episodes(backend, [limited], Sampling(max_tokens=4), Guard())
    assert limited.turns == 3 and limited.rollout(backend).model_mask.tolist() == [1, 0, 0, 1, 0, 0, 1]
    backend.max_model_len = 12  # a prompt of 1, rounds of 1 + 2, a turn's budget of 4: two rounds fit, not a third
    [full] = episodes_of(backend, lambda: Calculator("3 loop", "2", exact, max_turns=10))
    run_episodes(backend, [full], Sampling(max_tokens=4), Guard())
    assert full.finish == "length" and full.turns == 3 and len(full.tokens) == 7


class Plain:
    """An environment of reset and step alone, not derived from Environment."""

    def __init__(self, prompt, answer, reward, chat=False):
        self.prompt = prompt

    def reset(self):
        return [{"role": "user", "content": self.prompt}]

    def step(self, text):
        return [], 0.0, False  # never done: the turn limit ends it


class NoStep:
    def reset(self):
        return []


def test_an_environment_of_reset_and_step_alone_runs_to_the_default_turn_limit_and_closes():
    """close and max_turns are optional (a producer crashed on them); reset and step are not:
    a class without one stops the start in one line."""
    from prl.environments import environment_class
    from prl.plugins import PluginError

    backend = Scripted({3: ["x"] * 10})
    guard = Guard(timeout_s=2.0)
    [e] = start_episodes(backend, guard, lambda: Plain("3 go", "", exact), 1)
    run_episodes(backend, [e], Sampling(max_tokens=2), guard)
    close_episodes([e], guard)
    guard.close()
    assert e.finish == "length" and e.turns == Environment.max_turns and not e.fault
    assert environment_class("tests.unit.test_environments:Plain") == (Plain, {})
    with pytest.raises(PluginError) as err:
        environment_class("tests.unit.test_environments:NoStep")
    assert str(err.value).startswith("task.environment 'tests.unit.test_environments:NoStep': it has no step method; ")


class Broken(Environment):
    def __init__(self, prompt, answer, reward, chat=False, how="raise", release=None):
        super().__init__(prompt, answer, reward, chat)
        self.how, self.release = how, release

    def step(self, text):
        if self.how == "raise":
            raise RuntimeError("the environment broke")
        if self.how == "hang":
            self.release.wait(10)
        if self.how == "garbage":
            return Step([{"role": "user", "content": 42}], 1.0, False)
        return Step([], float("nan"), True)


def test_a_faulty_environment_ends_its_episode_with_reward_0_and_a_reason():
    """Raises, hangs past its limit, answers something that is not text, gives a reward that
    is not a number: each episode ends with reward 0 and its reason, and the others finish."""
    release = threading.Event()
    backend = Scripted({k: ["x"] for k in range(1, 6)})
    guard = Guard(timeout_s=0.5)
    hows = ["raise", "hang", "garbage", "nan"]
    episodes = [start_episodes(backend, guard, lambda i=i, how=how: Broken(f"{i} p", "x", exact, how=how, release=release), 1)[0]
                for i, how in enumerate(hows, 1)]
    episodes += start_episodes(backend, guard, lambda: SingleTurn("5 p", "x", exact), 1)
    try:
        run_episodes(backend, episodes, Sampling(max_tokens=2), guard)
    finally:
        release.set()
        guard.close()
    assert [e.finish for e in episodes] == ["env_error", "env_timeout", "env_garbage", "env_garbage", "stop"]
    assert [e.reward for e in episodes] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert "RuntimeError: the environment broke (at " in episodes[0].fault and "in step)" in episodes[0].fault
    assert "past 0.5 s" in episodes[1].fault and all(e.fault for e in episodes[:4]) and not episodes[4].fault


def test_the_environments_of_a_round_answer_at_once_on_the_guards_workers():
    """An environment that waits on a tool (here: until 4 episodes' steps run together) is
    stepped for every live episode at once, 4 workers at a time; one at a time, each step would
    wait out its limit and end its episode as env_timeout."""
    together = threading.Barrier(4, timeout=5)

    class Tool(Environment):
        def step(self, text):
            together.wait()
            return Step([], 1.0, True)

    backend = Scripted({k: ["x"] for k in range(1, 9)})
    guard = Guard(timeout_s=2.0, workers=4)
    episodes = [e for k in range(1, 9) for e in start_episodes(backend, guard, lambda k=k: Tool(f"{k} p", "x", exact), 1)]
    run_episodes(backend, episodes, Sampling(max_tokens=2), guard)
    guard.close()
    assert [e.finish for e in episodes] == ["stop"] * 8 and [e.reward for e in episodes] == [1.0] * 8


def test_an_environment_may_be_async():
    class Async(Environment):
        async def step(self, text):
            await asyncio.sleep(0)
            return Step([], 1.0, True)

    backend = Scripted({4: ["y"]})
    [e] = episodes_of(backend, lambda: Async("4 p", "y", exact))
    run_episodes(backend, [e], Sampling(max_tokens=2), Guard())
    assert e.reward == 1.0


def test_environments_of_one_problem_must_begin_alike():
    class Seeded(Environment):
        n = 0

        def reset(self):
            Seeded.n += 1
            return [{"role": "user", "content": f"{Seeded.n} differs"}]

    with pytest.raises(EpisodeFault, match="env_resets_differ"):
        episodes_of(Scripted({}), lambda: Seeded("p", "a", exact), n=2)


def test_a_skyrl_gym_environment_runs_unchanged_through_the_adapter():
    """skyrl-gym's own gsm8k_multi_turn (turn-level rewards, its own checker): a wrong answer
    gets its next instruction back as a user turn, a right one ends the episode."""
    pytest.importorskip("skyrl_gym")
    from prl.environments import environment_class

    cls, extra = environment_class("skyrl:gsm8k_multi_turn")
    backend = Scripted({6: ["#### 41", "#### 42"]})
    [e] = episodes_of(backend, lambda: cls("6 What is 6 x 7?", "42", exact, **extra, max_turns=3))
    run_episodes(backend, [e], Sampling(max_tokens=4), Guard())
    assert e.finish == "stop" and e.turns == 2 and e.rollout(backend).model_mask.tolist() == [1, 0, 0, 1]
    assert e.reward == pytest.approx(1.0 + 0.2 / 3)  # its format score for the first turn, then the answer


def test_inspect_replay_and_explain_show_an_episodes_turns_and_reward(tmp_path):
    from prl.cli.explain import episode_lines
    from prl.cli.inspect import describe
    from prl.cli.replay import version_row
    from prl.scheduler.archive import RolloutArchive, read_outcomes
    from prl.schemas import RolloutGroup

    backend = Scripted({7: ["<calc>3+4</calc>", "7"], 8: ["8"]})
    episodes = episodes_of(backend, lambda: Calculator("7 what is 3+4?", "7", exact), n=2)
    run_episodes(backend, episodes, Sampling(max_tokens=4), Guard())
    group = RolloutGroup("d", "p", 0, "producer-0", [7], 1.0, [e.rollout(backend) for e in episodes])
    view = describe(group, brief=True)
    assert view["turns"] == 2 and view["finish"] == {"stop": 2} and "<calc>3+4</calc>" in view["first_text"]
    archive = RolloutArchive(str(tmp_path / "archive"))
    archive.add(group, 0)
    archive.close()
    assert version_row(0, read_outcomes(str(tmp_path / "archive")))["turns_mean"] == 2.0  # from the masks, tokens unread
    lines = episode_lines(group)
    assert len(lines) == 2 and "2 model turn(s), stop, reward 1" in lines[0] and "<calc>3+4</calc>" in lines[0]


def test_the_guessing_game_answers_each_guess_and_rewards_finding_it():
    from prl.environments import GuessNumber

    backend = Scripted({9: ["50", "I think 75, or 80", "seven", "62"], 4: ["1", "2", "3", "4", "5"]})
    [found] = episodes_of(backend, lambda: GuessNumber("9 guess", "62", None, low=1, high=100))
    [lost] = episodes_of(backend, lambda: GuessNumber("4 guess", "8", None, low=1, high=8))
    run_episodes(backend, [found, lost], Sampling(max_tokens=4), Guard())
    assert found.reward == 1.0 and found.turns == 4 and found.env.max_turns == 8
    assert lost.reward == 0.0 and lost.turns == 4 == lost.env.max_turns and lost.finish == "length"


def test_guessing_game_data_never_shares_a_problem_between_train_and_test(tmp_path):
    from prl.tasks.datasets import load_problems
    from prl.tasks.guess import write_dataset

    write_dataset(300, 100, 0, str(tmp_path))
    train, test = (load_problems(str(tmp_path / f"{n}.parquet")) for n in ("train", "test"))
    assert len(train) == 300 and len(test) == 100 and not {p.id for p in train} & {p.id for p in test}
    assert all(p.chat and '"low"' in p.env_args for p in train)
