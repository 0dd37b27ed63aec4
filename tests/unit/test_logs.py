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
