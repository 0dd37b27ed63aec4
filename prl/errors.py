"""The failures a person can fix: commands print them as one line (what, and what to change)
and exit 2, with no traceback unless ``--debug``. Each module raises its own kind (the commands
list them all, ``prl.cli.user_errors``); this floor imports none of them, so every module can use
``one_line``."""

from __future__ import annotations

import errno
import traceback


class UsageError(ValueError):
    """A command used in a way it cannot run (the message says how to run it)."""


def object_store_errors() -> tuple[type, ...]:
    """An S3 endpoint that cannot be reached, or no credentials for it (botocore's, when the
    s3 extra is installed; s3fs turns a missing bucket or key and a refusal into
    FileNotFoundError and PermissionError itself)."""
    try:
        from botocore.exceptions import EndpointConnectionError, NoCredentialsError
    except ImportError:
        return ()
    return (EndpointConnectionError, NoCredentialsError)


HINTS = {  # exception class name -> what to change, after the library's own message
    "EndpointConnectionError": "check that the store is up and reachable, and AWS_ENDPOINT_URL for an S3-compatible one",
    "NoCredentialsError": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or another source of the AWS chain)",
}


# An OSError of the machine, not of the code: what to change, after its message
DISK_HINTS = {
    errno.ENOSPC: "free space on the file system written to (run.run_dir, --out, the temp dir) or write elsewhere",
    errno.EDQUOT: "the disk quota is used up: free some or write elsewhere",
    errno.EROFS: "that file system is read-only: write elsewhere",
}


def disk_full_or_read_only(exc: BaseException) -> bool:
    """A write the machine refused (no space, no quota, read-only): the person fixes the disk."""
    return isinstance(exc, OSError) and exc.errno in DISK_HINTS


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised (``file:line in function``), for a fault in code a person wrote."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ in HINTS:
        text += f"; {HINTS[type(exc).__name__]}"
    elif disk_full_or_read_only(exc):
        text += f"; {DISK_HINTS[exc.errno]}"
    return text if len(text) <= 600 else text[:597] + "..."
