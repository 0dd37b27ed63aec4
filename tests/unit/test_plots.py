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
    rows = [{"rollouts_generated": n, "learner/eval/accuracy": 0.5,
             **{f"learner/eval/accuracy_d{d}": 0.5 for d in difficulties}} for n in (0, 100)]
    assert plots.learning_curve(rows, str(tmp_path / "c.png"))
    assert [line.get_label() for line in drawn[0].axes[0].get_lines()] == labels


@pytest.mark.parametrize("weight, top", [("variance", 0.25), ("signal", 1.0), ("solvable", 1.0)])
def test_the_priority_histogram_spans_what_the_weight_can_be(monkeypatch, tmp_path, weight, top, recwarn):
    """A chance weighs up to 1, p(1-p) up to 1/4: every problem is counted in a bar, and the
    axis names the weight (a p(1-p) axis once left every problem above 1/4 of a "solvable" run
    outside the bars, and warned when none was left inside)."""
    import numpy as np

    drawn = []
    monkeypatch.setattr(plots, "save_png", lambda fig, uri, dpi: drawn.append(fig))
    priorities = np.array([0.0, 0.1, 0.2, top])
    plots.priority_histogram(priorities, np.array([0.1, np.nan]), str(tmp_path / "h.png"), weight=weight)
    axis = drawn[0].axes[0]
    assert sum(bar.get_height() for bar in axis.patches) == len(priorities)
    assert axis.get_xlabel() == plots.PRIORITY_LABELS[weight] and axis.get_yscale() == "log"
    plots.priority_histogram(np.array([]), np.array([np.nan]), str(tmp_path / "e.png"), weight=weight)  # nothing to count
    assert not [w for w in recwarn if "log-scaled" in str(w.message)]
