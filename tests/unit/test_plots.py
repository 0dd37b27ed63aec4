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


def test_the_run_report_draws_clipped_tokens_and_kl_by_age_over_the_whole_run(monkeypatch, tmp_path):
    """Token-weighted over the steps, youngest age first (11+ after 10)."""
    drawn = []
    monkeypatch.setattr(plots, "save_png", lambda fig, uri, dpi: drawn.append(fig))

    def step(i, ages):
        return {"step": i, "learner/loss": 0.0, **{f"learner/age/{a}/{k}": v for a, (n, c, kl) in ages.items()
                                                  for k, v in (("tokens", n), ("clip_fraction", c), ("approx_kl", kl))}}

    rows = [step(1, {"0": (10, 0.0, 0.001), "2": (30, 0.1, 0.01)}), step(2, {"2": (10, 0.5, 0.03), "11+": (5, 0.2, 0.1)})]
    assert plots.by_age(rows) == [("0", 10, 0.0, 0.001), ("2", 40, 0.2, pytest.approx(0.015)), ("11+", 5, 0.2, 0.1)]
    plots.run_report(rows, str(tmp_path / "r.png"))
    clipped = drawn[0].axes[6]
    assert [t.get_text() for t in clipped.get_xticklabels()] == ["0", "2", "11+"]
    assert [bar.get_height() for bar in clipped.patches] == [0.0, pytest.approx(0.2), 0.2]
