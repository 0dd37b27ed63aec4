"""Epochs: each start of a role claims one above the last; only the newest one's records pass."""

from prl import epochs


def test_each_claim_is_one_above_the_last_and_only_the_newest_passes(tmp_path):
    run_dir = str(tmp_path / "run")
    assert epochs.newest(run_dir, "scheduler") == 0 and epochs.fenced(run_dir, "scheduler", 0) is None
    first, second = epochs.claim(run_dir, "scheduler"), epochs.claim(run_dir, "scheduler")
    assert (first, second) == (1, 2) and epochs.newest(run_dir, "learner") == 0  # roles count apart
    assert epochs.fenced(run_dir, "scheduler", 2) is None
    assert "replaced by epoch 2" in epochs.fenced(run_dir, "scheduler", 1)
    assert "no scheduler of this run claimed it" in epochs.fenced(run_dir, "scheduler", 10**6)  # a forged epoch
