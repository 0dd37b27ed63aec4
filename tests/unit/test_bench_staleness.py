"""`prl bench staleness`: when a simulated producer publishes each group, and the ratio it reports."""

import numpy as np
import pytest

from benchmarks.staleness import publish_after, trained_ratio


def test_a_call_publishes_every_group_when_its_longest_completion_ends():
    lengths = [np.array([10, 400]), np.array([50, 60]), np.array([1000, 3])]
    assert publish_after(lengths, 2.0, "call") == [2.0, 2.0, 2.0]


def test_a_streaming_producer_publishes_each_group_when_its_own_completions_end():
    lengths = [np.array([10, 400]), np.array([50, 60]), np.array([1000, 3])]
    assert publish_after(lengths, 2.0, "group") == pytest.approx([0.8, 0.12, 2.0])


def test_trained_ratio_is_one_when_what_was_trained_is_as_long_as_what_was_generated():
    row = {"trained_mean_tokens": 300.0, "generated_mean_tokens": 300.0, "generated_sd_tokens": 240.0,
           "trained_fresh_rollouts": 400}
    ratio, err = trained_ratio(row)
    assert ratio == 1.0
    assert err == pytest.approx(2 * 0.8 / 20)  # two standard errors of a mean of 400 lengths, relative


def test_the_length_histogram_counts_the_cap_in_its_last_bin():
    from benchmarks.staleness import LENGTH_BINS, length_histogram

    counts = length_histogram([1, 64, 1024, 1024], 1024)
    assert len(counts) == LENGTH_BINS and counts.sum() == 4 and counts[-1] == 2 and counts[0] == 1


def test_the_figure_is_written(tmp_path):
    from prl.plots import trained_share_by_length

    edges = [0, 256, 512, 768, 1024]
    rows = [{"tau_max": 4, "publish": publish, "length_bin_edges": edges, "signal_generated_by_length": [400, 300, 100, 10],
             "trained_by_length": trained} for publish, trained in (("call", [200, 150, 50, 5]), ("group", [260, 150, 30, 0]))]
    trained_share_by_length(rows, str(tmp_path / "staleness.png"))
    assert (tmp_path / "staleness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
