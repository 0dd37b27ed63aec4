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
