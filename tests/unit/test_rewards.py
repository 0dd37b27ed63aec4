import time

import pytest

from prl.rewards import RewardRunner, load_reward, math_verify


def test_math_verify_boxed_and_final_answer():
    assert math_verify("so the answer is \\boxed{0.5}", "1/2") == 1.0
    assert math_verify("The final answer is 42", "42") == 1.0
    assert math_verify("\\boxed{41}", "42") == 0.0


def test_reward_that_raises_or_hangs_counts_zero_and_goes_on():
    def bad(c, a):
        raise RuntimeError("boom")

    def slow(c, a):
        time.sleep(2)  # longer than the runner's limit; the runner does not wait for it
        return 1.0

    runner = RewardRunner(bad, timeout_s=1.0)
    assert runner("x", "y") == 0.0 and runner.errors == 1
    runner = RewardRunner(slow, timeout_s=0.05)
    assert runner("x", "y") == 0.0 and runner.timeouts == 1
    runner.fn = lambda c, a: float("nan")
    assert runner("x", "y") == 0.0 and runner.errors == 1
    runner.fn = lambda c, a: 1.0
    assert runner("x", "y") == 1.0
    runner.close()


def test_load_reward_by_dotted_path():
    assert load_reward("prl.tasks.addition:exact_match")("15", "15") == 1.0
    with pytest.raises(ValueError):
        load_reward("prl.tasks.addition")
