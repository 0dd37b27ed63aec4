"""The reward functions producer configs name (``producer.reward = "prl.producers.rewards:reasoning_gym"``).

They are defined once in the shared floor, prl/rewards.py, because the learner scores its
held-out evaluation with the same functions; this module gives them their documented names.
"""

from prl.rewards import math_verify, reasoning_gym

__all__ = ["math_verify", "reasoning_gym"]
