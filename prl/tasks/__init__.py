"""Problem sources: dataset files (``task.train_path``), or the built-in addition task."""

from __future__ import annotations

import numpy as np

ADDITION_TRAIN_PER_DIGIT = (80, 600, 600, 600)  # training problems of 1, 2, 3 and 4 digits
ADDITION_HELDOUT_PER_DIGIT = 300


def train_problems(task):
    """The training problems a task config names, each labelled by ``task.group_field`` (or unlabelled)."""
    if task.train_path:
        from prl.tasks.datasets import load_problems

        return load_problems(task.train_path, task.group_field)
    from prl.tasks import addition

    return addition.train_pool(ADDITION_TRAIN_PER_DIGIT, labelled=task.group_field == "difficulty")


def heldout_problems(task):
    """The held-out problems a task config names (may be empty)."""
    if task.train_path:
        from prl.tasks.datasets import load_problems

        return load_problems(task.heldout_path, task.group_field) if task.heldout_path else []
    from prl.tasks import addition

    return addition.heldout_set(ADDITION_HELDOUT_PER_DIGIT, len(ADDITION_TRAIN_PER_DIGIT))


def group_indices(problems) -> tuple[list[str], np.ndarray]:
    """(group names, each problem's group index): the label ``task.group_field`` gave each
    problem, for the priority's shared prior; one group "" when there is no label."""
    names = sorted({p.group for p in problems})
    index = {g: i for i, g in enumerate(names)}
    return names, np.asarray([index[p.group] for p in problems], dtype=np.int32)
