"""Environments for tests of episodes on real engines."""

from prl.environments import Environment, Step


class AskTwice(Environment):
    """A two-turn environment: whatever the first answer, it asks to check it once more."""

    max_turns = 2

    def step(self, text):
        if not getattr(self, "asked", False):
            self.asked = True
            return Step([{"role": "user", "content": "Check your answer once more and give it again."}], 0.0, False)
        return Step([], float(self.reward(text, self.answer)), True)
