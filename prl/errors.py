"""The failures a person can fix: commands print them as one line (what, and what to change)
and exit 2, with no traceback unless ``--debug``. Each module raises its own kind; this list
names them all in one place."""

from __future__ import annotations


class UsageError(ValueError):
    """A command used in a way it cannot run (the message says how to run it)."""


def user_errors() -> tuple[type, ...]:
    """Every exception type that means "fix the input", imported when a command fails."""
    from prl.devices import DeviceMissing
    from prl.model_export import ExportFailed
    from prl.model_import import ImportFailed
    from prl.plugins import PluginError
    from prl.policy import VersionRejected
    from prl.service import ServiceStopped
    from prl.storage import StorageError
    from prl.tasks.datasets import DatasetError
    from prl.tasks.reasoning_gym import DataError
    from prl.transport import TransportError
    from prl.trust import KeyMissing
    from prl.schemas.config import ConfigError

    return (UsageError, ConfigError, DeviceMissing, ExportFailed, DatasetError, DataError, StorageError, TransportError, ImportFailed, KeyMissing,
            VersionRejected, PluginError, ServiceStopped, FileNotFoundError, PermissionError, NotADirectoryError,
            *object_store_errors())


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
    "EndpointConnectionError": "for an S3-compatible store set AWS_ENDPOINT_URL",
    "NoCredentialsError": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or another source of the AWS chain)",
}


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if type(exc).__name__ in HINTS:
        text += f"; {HINTS[type(exc).__name__]}"
    return text if len(text) <= 600 else text[:597] + "..."
