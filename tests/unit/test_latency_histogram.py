"""Latency histograms as services count them (prl/metrics.py): a percentile read back from the
buckets is the upper bound of the bucket the true percentile falls in, never below it."""

import numpy as np
import pytest

from prl.metrics import LATENCY_BOUNDS_MS, bucket_quantile, latency_bucket


def test_each_latency_counts_in_the_smallest_bucket_it_does_not_exceed():
    assert [latency_bucket(ms) for ms in (0.0, 1.0, 1.5, 100.0, 100.1, 5000.0, 5000.1)] == \
        ["le_1", "le_1", "le_2", "le_100", "le_150", "le_5000", "le_inf"]


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_a_percentile_from_buckets_brackets_the_true_one(q):
    rng = np.random.default_rng(0)
    for scale in (3.0, 40.0, 400.0):
        latencies = rng.lognormal(np.log(scale), 1.0, 5_000)
        counts: dict[str, int] = {}
        for ms in latencies:
            counts[latency_bucket(ms)] = counts.get(latency_bucket(ms), 0) + 1
        upper, true = bucket_quantile(counts, q), float(np.quantile(latencies, q))
        lower = max([0.0, *(b for b in LATENCY_BOUNDS_MS if b < upper)])
        assert lower <= true <= upper, (scale, q, lower, true, upper)


def test_the_difference_of_two_readings_is_the_stretch_between_them():
    before = {"le_10": 500, "le_100": 5}
    after = {"le_10": 550, "le_100": 5, "le_1000": 100}  # the last 150: two thirds over 100 ms
    assert bucket_quantile({k: after[k] - before.get(k, 0) for k in after}, 0.5) == 1000.0
    assert bucket_quantile(after, 0.5) == 10.0
    assert bucket_quantile({}, 0.99) is None and bucket_quantile({"le_5": 0}, 0.99) is None
