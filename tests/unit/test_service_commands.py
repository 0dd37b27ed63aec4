"""A service started on its own with the single-machine config (the in-memory transport) would
talk to no one and wait forever: it stops at once with one line saying what to give it."""

import pytest

from prl.cli import main

LINE = 'transport.type is "memory", which reaches no other process'


@pytest.mark.parametrize("argv", [["scheduler"], ["producer"], ["learner"], ["replay", "publish"]], ids=" ".join)
def test_a_service_on_the_memory_transport_stops_with_one_line(tmp_path, capsys, argv):
    assert main([*argv, "--set", f"run.run_dir={str(tmp_path)!r}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prl {' '.join(argv)}: {LINE}") and "--config kafka.toml" in err
    assert len(err.strip().splitlines()) == 1


def test_an_offline_learner_needs_no_broker(tmp_path, capsys):
    """`learner.batches_from` trains from a file: the memory transport is fine there (the
    command goes on, here to the missing file)."""
    missing = tmp_path / "batches.arrow"
    assert main(["learner", "--set", f"run.run_dir={str(tmp_path)!r}", "--set", f"learner.batches_from={str(missing)!r}"]) == 2
    err = capsys.readouterr().err
    assert LINE not in err and str(missing) in err
