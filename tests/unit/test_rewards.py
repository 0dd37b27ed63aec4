import threading

import pytest

from prl.plugins import BROKEN_AFTER, PluginError
from prl.rewards import RewardBroken, RewardRunner, load_reward, math_verify
from prl.schemas.config import ProducerConfig


def test_math_verify_boxed_and_final_answer():
    assert math_verify("so the answer is \\boxed{0.5}", "1/2") == 1.0
    assert math_verify("The final answer is 42", "42") == 1.0
    assert math_verify("\\boxed{41}", "42") == 0.0


def test_reward_that_raises_or_hangs_counts_zero_and_goes_on():
    def bad(c, a):
        raise RuntimeError("boom")

    released = threading.Event()

    def slow(c, a):
        released.wait(10)  # longer than the runner's limit; the runner does not wait for it
        return 1.0

    runner = RewardRunner(bad, timeout_s=1.0)
    assert runner("x", "y") == 0.0 and runner.errors == 1
    runner = RewardRunner(slow, timeout_s=0.05)
    assert runner("x", "y") == 0.0 and runner.timeouts == 1
    runner.fn = lambda c, a: float("nan")
    assert runner("x", "y") == 0.0 and runner.errors == 1
    runner.fn = lambda c, a: 1.0
    assert runner("x", "y") == 1.0
    released.set()
    runner.close()


def test_a_failing_reward_is_warned_of_at_its_1st_10th_100th_time_with_where_it_raised():
    """A reward with a bug scores 0 on every call: the producer's log says why, and where."""
    import structlog

    def buggy(completion, answer):
        return float(completion == answer.stirp())

    runner = RewardRunner(buggy, timeout_s=5.0)
    with structlog.testing.capture_logs() as logs:
        assert [runner("15", "15") for _ in range(100)] == [0.0] * 100
        runner.fn = lambda c, a: float("inf")
        runner("15", "15")
        runner.fn = lambda c, a: None  # forgot to return: the warning named the runner's float() as where it raised
        runner("15", "15")
    runner.close()
    assert [(e["event"], e["kind"], e["count"]) for e in logs] == [
        ("reward_failed", "error", 1), ("reward_failed", "error", 10), ("reward_failed", "error", 100),
        ("reward_failed", "not_finite", 1), ("reward_failed", "not_a_number", 1)]
    assert logs[-1]["error"] == "returned None; scored 0" and "at" not in logs[-1]
    assert logs[0]["error"] == "AttributeError: 'str' object has no attribute 'stirp'"
    assert logs[0]["at"].startswith(__file__) and logs[0]["at"].endswith("in buggy")
    assert logs[0]["reward"].endswith("buggy") and runner.errors == 102


def test_load_reward_by_dotted_path():
    assert load_reward("prl.tasks.addition:exact_match")("15", "15") == 1.0
    with pytest.raises(ValueError):
        load_reward("prl.tasks.addition")


@pytest.mark.parametrize("spec", ["math:floor", "tests.unit.test_rewards:scores_the_completion_alone"])
def test_a_reward_that_cannot_take_a_completion_and_an_answer_stops_the_start(spec):
    with pytest.raises(PluginError) as err:
        load_reward(spec)
    name = spec.partition(":")[2]
    assert str(err.value).startswith(f"producer.reward {spec!r}: {name} cannot be called as {name}(completion, answer): ")


def scores_the_completion_alone(completion):
    return float(completion == "42")


def test_a_reward_that_fails_the_same_way_from_its_first_call_on_is_broken():
    """It stops the producer, saying why, once BROKEN_AFTER calls in a row from the first failed
    the same way and none scored: a missing dependency here."""
    def needs_a_package(completion, answer):
        import no_such_judge_xyz  # noqa: F401

    runner = RewardRunner(needs_a_package, workers=4)
    assert runner.many(["x"] * (BROKEN_AFTER - 1), ["y"] * (BROKEN_AFTER - 1)) == [0.0] * (BROKEN_AFTER - 1)
    with pytest.raises(RewardBroken) as err:
        runner.many(["x"] * 2, ["y"] * 2)
    runner.close()
    assert f"needs_a_package failed on each of its first {BROKEN_AFTER + 1} calls and never scored: " \
           "ModuleNotFoundError: No module named 'no_such_judge_xyz' (at " in str(err.value)
    assert f"{__file__}:" in str(err.value) and "in needs_a_package)" in str(err.value)


@pytest.mark.parametrize("then", ["fails another way", "scores once"])
def test_a_reward_that_fails_on_some_completions_only_goes_on(then):
    """A reward that raises on what it cannot parse (scored 0, as README allows) is not broken
    when its errors differ, or when it has scored a completion: the producer goes on."""
    def parses(completion, answer):
        return float(int(completion) == int(answer))

    runner = RewardRunner(parses)
    first = ["x" if then == "fails another way" else "7"] + ["no"] * (2 * BROKEN_AFTER)
    assert runner.many(first, ["7"] * len(first)) == [float(then == "scores once")] + [0.0] * 2 * BROKEN_AFTER
    runner.close()
    assert runner.errors == 2 * BROKEN_AFTER + (then == "fails another way")


def test_every_built_in_reward_scores_a_right_answer_1_on_the_runners_worker_thread():
    """As a producer calls them: through RewardRunner, on its worker thread (math-verify's own
    time limits use signal.alarm, which raises off the main thread: every answer scored 0)."""
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed: pip install -e '.[real]'")
    import json

    from prl.tasks.reasoning_gym import make_rows

    row = make_rows("chain_sum", 1, 0, seed=0, settings={})[0][0]
    truth = row["reward_model"]["ground_truth"]
    right = {"prl.tasks.addition:exact_match": ("15", "15"), "prl.rewards:math_verify": ("so \\boxed{\\frac{1}{2}}", "0.5"),
             "prl.rewards:reasoning_gym": (json.loads(truth)["answer"], truth)}
    workers = ProducerConfig().reward_workers
    for spec, (completion, answer) in right.items():
        runner = RewardRunner(load_reward(spec), workers=workers)  # the producer's default: calls at once
        wrong = "no" if spec.endswith("exact_match") else "so \\boxed{7}"
        scores = runner.many([completion, wrong] * 2 * workers, [answer] * 4 * workers)
        assert scores == [1.0, 0.0] * 2 * workers and runner.errors == runner.timeouts == 0, spec
        runner.close()


def test_a_reward_that_waits_is_scored_workers_calls_at_once_each_within_its_limit():
    """16 calls that each wait until 8 are running at once: 8 workers score them in two waves (one
    worker would wait until the limit ends each call). A call stuck past the limit scores 0
    and the next wave is scored by fresh workers."""
    together, release = threading.Barrier(8, timeout=5), threading.Event()

    def judge(completion, answer):
        if completion == "stuck":
            release.wait(10)
        elif answer == "together":
            together.wait()  # returns once 8 calls run at the same time
        return float(completion in answer)

    runner = RewardRunner(judge, timeout_s=2.0, workers=8)
    assert runner.many(["to", "no"] * 8, ["together"] * 16) == [1.0, 0.0] * 8 and runner.timeouts == 0
    scores = runner.many(["stuck"] + ["a"] * 15, ["a"] * 16)
    release.set()
    runner.close()
    assert scores == [0.0] + [1.0] * 15 and runner.timeouts == 1
