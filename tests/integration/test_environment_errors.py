"""Environment failures end in one line naming the thing and the fix, exit code 2, fast."""

import time

from prl.cli import main
from prl.servers import free_port


def test_an_unreachable_broker_fails_within_ten_seconds_naming_the_address(tmp_path, capsys):
    port = free_port()  # nothing listens there
    config = tmp_path / "kafka.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path}/run"\n[transport]\ntype = "kafka"\n'
                      f'[transport.kafka]\nbootstrap_servers = "127.0.0.1:{port}"\n')
    t0 = time.monotonic()
    assert main(["producer", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - t0 < 15 and len(err.splitlines()) == 1
    assert f"cannot reach a Kafka broker at 127.0.0.1:{port}" in err and "bootstrap_servers" in err


def test_an_unwritable_run_dir_is_named(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["run", "--run-dir", str(blocker / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot write to run.run_dir {blocker}/run" in err
