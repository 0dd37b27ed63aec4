"""What the learning curve draws: per-difficulty lines only where there is more than one."""

import pytest

from prl import plots


@pytest.mark.parametrize("difficulties, labels", [
    ([1, 2], ["mean over difficulties", "difficulty 1", "difficulty 2"]),
    ([0], ["mean over difficulties"]),  # a dataset without levels: its one line is the mean
])
def test_learning_curve_lines(monkeypatch, tmp_path, difficulties, labels):
    drawn = []
    monkeypatch.setattr(plots, "save_png", lambda fig, uri, dpi: drawn.append(fig))
    rows = [{"rollouts_generated": n, "eval/accuracy": 0.5,
             **{f"eval/accuracy_d{d}": 0.5 for d in difficulties}} for n in (0, 100)]
    assert plots.learning_curve(rows, str(tmp_path / "c.png"))
    assert [line.get_label() for line in drawn[0].axes[0].get_lines()] == labels


def test_the_priority_histogram_counts_every_problem_up_to_a_quarter(monkeypatch, tmp_path, recwarn):
    """p(1-p) reaches 1/4: every problem is counted in a bar, and an empty histogram does not
    warn about its log axis."""
    import numpy as np

    drawn = []
    monkeypatch.setattr(plots, "save_png", lambda fig, uri, dpi: drawn.append(fig))
    priorities = np.array([0.0, 0.1, 0.2, 0.25])
    plots.priority_histogram(priorities, np.array([0.1, np.nan]), str(tmp_path / "h.png"))
    axis = drawn[0].axes[0]
    assert sum(bar.get_height() for bar in axis.patches) == len(priorities)
    assert axis.get_xlabel() == "priority p(1-p)" and axis.get_yscale() == "log"
    plots.priority_histogram(np.array([]), np.array([np.nan]), str(tmp_path / "e.png"))  # nothing to count
    assert not [w for w in recwarn if "log-scaled" in str(w.message)]
