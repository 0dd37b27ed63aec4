"""A service started on its own talks to Kafka: with no broker at transport.kafka.bootstrap_servers
it stops within seconds with one line naming the address and what to check."""

import pytest

from prl import epochs
from prl.cli import main
from prl.scheduler.archive import RolloutArchive
from tests.support.groups import make_groups
from tests.support.servers import free_port


@pytest.mark.parametrize("argv", [["scheduler"], ["producer"], ["learner"], ["replay", "publish"]], ids=" ".join)
def test_a_service_without_a_broker_stops_with_one_line(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.setattr("prl.transport.kafka.REACH_TIMEOUT_S", 1.0)
    if argv[0] == "replay":  # it reads its archive first
        archive = RolloutArchive(str(tmp_path / "archive"))
        archive.add(make_groups(1)[0], learner_version=0)
        archive.close()
    address = f"127.0.0.1:{free_port()}"
    assert main([*argv, "--set", f"run.run_dir={str(tmp_path)!r}", "--set", f"transport.kafka.bootstrap_servers='{address}'"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prl {' '.join(argv)}: cannot reach a Kafka broker at {address}") and "bootstrap_servers" in err
    assert len(err.strip().splitlines()) == 1


def test_an_offline_learner_needs_no_broker(tmp_path, capsys):
    """`prl learner --batches-from FILE` trains from a file: no broker is needed (the command
    goes on, here to the missing file)."""
    missing = tmp_path / "batches.arrow"
    address = f"127.0.0.1:{free_port()}"
    assert main(["learner", "--set", f"run.run_dir={str(tmp_path)!r}", "--set", f"transport.kafka.bootstrap_servers='{address}'",
                 "--batches-from", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "Kafka" not in err and str(missing) in err


def test_publishing_an_archive_that_is_not_there_fences_no_scheduler(tmp_path, capsys):
    """`prl replay publish` given a wrong archive stops before it claims the run's batch writing:
    the run's scheduler goes on (and no broker is needed to learn it)."""
    run_dir = tmp_path / "run"
    scheduler_epoch = epochs.claim(str(run_dir), "scheduler")
    address = f"127.0.0.1:{free_port()}"
    assert main(["replay", "publish", str(tmp_path / "archiv"), "--set", f"run.run_dir={str(run_dir)!r}",
                 "--set", f"transport.kafka.bootstrap_servers='{address}'"]) == 2
    assert capsys.readouterr().err.startswith(f"prl replay publish: no Parquet files under {tmp_path / 'archiv'}")
    assert epochs.fenced(str(run_dir), "scheduler", scheduler_epoch) is None
