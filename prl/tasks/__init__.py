"""Problem sources: the built-in addition task and dataset files."""

from __future__ import annotations


def train_problems(task):
    """The training problems a task config names."""
    if task.name == "dataset":
        from prl.tasks.datasets import load_problems

        return load_problems(task.train_path, task.group_field)
    from prl.tasks import addition

    return addition.train_pool(task.train_per_digit, task.seed)


def heldout_problems(task):
    """The held-out problems a task config names (may be empty)."""
    if task.name == "dataset":
        from prl.tasks.datasets import load_problems

        return load_problems(task.heldout_path, task.group_field) if task.heldout_path else []
    from prl.tasks import addition

    return addition.heldout_set(task.heldout_per_digit, len(task.train_per_digit))
