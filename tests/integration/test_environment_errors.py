"""Environment failures end in one line naming the thing and the fix, exit code 2, fast."""

import time
from pathlib import Path

import pytest

from prl.cli import main
from tests.support.servers import free_port


@pytest.mark.parametrize("command", [["producer"], ["inspect", "topics"], ["inspect", "tail", "rollouts"]],
                         ids=" ".join)
def test_an_unreachable_broker_fails_within_ten_seconds_naming_the_address(tmp_path, capsys, monkeypatch, command):
    """A service at the default wait (REACH_TIMEOUT_S, 10 s); the inspect commands, which check
    the broker the same way, at a wait of 1 s."""
    if command[0] == "inspect":
        monkeypatch.setattr("prl.transport.kafka.REACH_TIMEOUT_S", 1.0)
    port = free_port()  # nothing listens there
    config = tmp_path / "kafka.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path}/run"\n'
                      f'[transport.kafka]\nbootstrap_servers = "127.0.0.1:{port}"\n')
    t0 = time.monotonic()
    assert main([*command, "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - t0 < 15 and len(err.splitlines()) == 1
    assert f"cannot reach a Kafka broker at 127.0.0.1:{port}" in err and "bootstrap_servers" in err


def test_an_unwritable_run_dir_is_named(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["run", "--run-dir", str(blocker / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot write to run.run_dir {blocker}/run" in err


def run_cli(argv) -> int:
    """main's exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, start", [
    (["run", "--set", "task.train_path='{bad}'"], "prl run: {bad}: row 2: missing column 'answer'"),
    (["run", "--set", "learner.lr=5"], "prl run: invalid configuration: learner.lr: Input should be less than 1"),
    (["run", "--max-steps", "many"], "prl run: argument --max-steps: 'many' is not a whole number >= 1"),
    (["inspect", "tail", "nosuch"], "prl inspect tail: unknown topic kind 'nosuch'"),
    (["explain", "nosuch", "--run-dir", "{tmp}/nowhere"], "prl explain: no scheduler snapshot under {tmp}/nowhere/scheduler"),
], ids=["dataset row", "config value", "argument", "topic kind", "explain: run dir before problem"])
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, start):
    """A bad dataset (rows counted from 1), config value, argument, topic kind or run directory:
    one line, exit code 2, no traceback; --debug shows the traceback instead."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n{"id": "b", "prompt": "2+2="}\n')
    def fill(text: str) -> str:
        return text.replace("{bad}", str(bad)).replace("{tmp}", str(tmp_path))

    argv = [fill(a) for a in argv] + (["--run-dir", str(tmp_path / "r")] if argv[0] == "run" else [])
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(fill(start)), err
    if "many" not in argv:
        with pytest.raises(Exception):
            main(argv + ["--debug"])


@pytest.mark.parametrize("problem", ["unreachable endpoint", "no credentials"])
@pytest.mark.parametrize("command", [["replay", "report", "s3://runs/demo/archive"], ["inspect", "report"]], ids=" ".join)
def test_an_object_store_that_cannot_be_used_is_one_line_with_the_fix(tmp_path, capsys, monkeypatch, problem, command):
    """Reading a run or an archive on S3 without a reachable endpoint or without credentials
    (they were tracebacks); the lines name the variables to set."""
    import fsspec

    fsspec.filesystem("s3").clear_instance_cache()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    if problem == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
        fix = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        fix = "Could not connect to the endpoint URL"
    try:
        assert main([*command, "--run-dir", "s3://runs/demo"]) == 2
    finally:
        fsspec.filesystem("s3").clear_instance_cache()  # no instance with this endpoint outlives the test
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"prl {command[0]} {command[1]}: ") and fix in err


def test_a_run_continued_or_explained_with_another_strategy_is_one_line(tmp_path, capsys):
    """The scheduler's snapshot says which sampler wrote it: `prl run` continued (or `prl
    explain`) with another strategy than the run was started with (given --run-dir alone, the
    run's own config.toml is taken; here --set overrides it) names both and the fix (before: a
    KeyError traceback from the sampler's state)."""
    run = ["--run-dir", str(tmp_path / "r")]
    assert main(["run", *run, "--max-steps", "2", "--no-progress", "--set", "scheduler.strategy='uniform'"]) == 0
    capsys.readouterr()
    other = ["--set", "scheduler.strategy='priority'"]
    for argv in (["run", *run, "--max-steps", "4", "--no-progress", *other], ["explain", *run, "add1:8+1", *other]):
        assert run_cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert ("the scheduler snapshot holds a uniform sampler's state that does not fit this configuration's priority "
                "sampler of 1,880 problems without a label") in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
@pytest.mark.parametrize("ask", [["--set", 'run.device="cuda"'], ["--config", "examples/smollm2-chain-sum-gpu.toml"]],
                         ids=["run.device", "the GPU example"])
def test_a_config_that_asks_for_cuda_without_one_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, ask):
    """run.device = "cuda" on a machine where torch sees no GPU: the thing and the fix, no
    traceback, before a model is loaded. The GPU example asks for it: on a CPU it ran, an
    engine call of hours, with no word on why."""
    monkeypatch.chdir(Path(__file__).parents[2])
    assert main(["run", "--run-dir", str(tmp_path / "run"), "--no-progress", *ask]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "run.device = 'cuda' but torch" in err and "sees no CUDA GPU" in err and 'run.device = "auto"' in err


def test_a_full_disk_stops_the_run_in_one_line_and_the_same_command_continues_it(tmp_path, capsys, monkeypatch):
    """A full disk came out as pages of tracebacks (the service's, then the log file's own,
    which sits on the same disk) and exit 1. It is the person's to fix: one line naming it and
    what to change, exit 2; once there is room, the same command continues from the checkpoint."""
    import errno

    from prl.scheduler import archive

    written = []

    def full_after_two(fs, path, data):
        if len(written) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(path)
        archive_write(fs, path, data)

    archive_write = archive.replace_file
    monkeypatch.setattr(archive, "replace_file", full_after_two)
    argv = ["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--max-steps", "30",
            "--set", "learner.eval_every=0", "--set", "learner.checkpoint_every=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        "prl run: [Errno 28] No space left on device; free space on the file system written to (run.run_dir, --out, "
        "the temp dir) or write elsewhere")
    monkeypatch.setattr(archive, "replace_file", archive_write)
    assert main(argv) == 0
    assert "(continued from its checkpoint)" in capsys.readouterr().err


def judge_not_installed(completion: str, answer: str) -> float:
    """A reward whose judge's package is missing here: it fails the same way on every call."""
    import no_such_judge_package  # noqa: F401


def test_a_reward_that_fails_on_every_call_stops_the_run_in_one_line(tmp_path, capsys):
    """It scored every completion 0 and the run went on for ever, warning; it stops within the
    first generation calls, naming the error and where it was raised."""
    spec = "tests.integration.test_environment_errors:judge_not_installed"
    argv = ["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--max-steps", "5", "--set", f'producer.reward="{spec}"']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        f"prl run: producer.reward {spec} failed on each of its first ")
    assert "calls and never scored: ModuleNotFoundError: No module named 'no_such_judge_package' (at " in err
