"""The libraries' own loggers: their warnings reach the console through prl's renderer, their
chatter does not (an S3 run printed aiobotocore's "Found credentials" on every command)."""

import logging

import pytest

from prl import logs


@pytest.mark.parametrize("name", ["kafka.conn", "aiobotocore.credentials", "botocore.credentials", "s3fs", "transformers"])
def test_a_library_logs_warnings_not_info_on_the_console(capsys, name):
    logs.configure("console", "info")
    logging.getLogger(name).info("Found credentials in environment variables.")
    logging.getLogger(name).warning("the broker went away")
    err = capsys.readouterr().err
    assert "Found credentials" not in err
    assert "the broker went away" in err and f"[{name}]" in err


def test_a_run_keeps_the_libraries_lines_and_warnings_in_its_log_file(capsys, tmp_path):
    """`prl run` without --verbose: vLLM's start-up warnings and a library's Python warnings go to
    the log file alone; prl's own warnings reach the console too. --verbose shows them all."""
    import structlog

    log_file = tmp_path / "prl.log"
    for verbose in (False, True):
        logs.configure("console", "info", log_file=str(log_file), console_level="warning", libraries_on_console=verbose)
        logging.getLogger("vllm.platforms.cpu").warning("libtcmalloc is not found in LD_PRELOAD")
        # a library's warnings.warn, as logging.captureWarnings turns it into a log line
        logging.getLogger("py.warnings").warning("FutureWarning: `torch.distributed.reduce_op` is deprecated")
        structlog.get_logger("learner").warning("bf16_autocast_emulated")
        err = capsys.readouterr().err
        assert "bf16_autocast_emulated" in err
        assert ("libtcmalloc" in err) == verbose and ("reduce_op" in err) == verbose
    text = log_file.read_text()
    assert text.count("libtcmalloc") == 2 and text.count("reduce_op") == 2
    logging.captureWarnings(False)


def test_native_writes_go_to_the_log_file_while_the_console_keeps_python_s(tmp_path):
    """torch's and vLLM's C++ warnings are written to file descriptor 2 below Python: while a run
    lasts they land in its log file, and what prl prints still reaches the terminal."""
    import subprocess
    import sys

    log_file = tmp_path / "prl.log"
    code = ("import os, sys\nfrom prl import logs\n"
            f"with logs.native_output_to({str(log_file)!r}):\n"
            "    os.write(2, b'[W1205 utils.cpp:68] Warning: NUMA binding\\n')\n"
            "    print('step 1', file=sys.stderr)\n"
            "os.write(2, b'after\\n')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "step 1\nafter\n"
    assert log_file.read_text() == "[W1205 utils.cpp:68] Warning: NUMA binding\n"


def test_a_log_file_on_a_full_disk_loses_lines_and_prints_no_traceback(capsys, tmp_path):
    """Python's logging prints '--- Logging error ---' and a traceback to stderr for every line
    a handler cannot write: pages of them on a full disk, under the one line that says so."""
    import errno

    import structlog

    class FullDisk:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    logs.configure("console", "info", log_file=str(tmp_path / "prl.log"), console_level="warning")
    next(h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)).stream = FullDisk()
    structlog.get_logger("learner").warning("checkpoint_written")
    err = capsys.readouterr().err
    assert "checkpoint_written" in err and "Logging error" not in err and "Traceback" not in err
    logging.captureWarnings(False)
