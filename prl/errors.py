"""The failures a person can fix: commands print them as one line (what, and what to change)
and exit 2, with no traceback unless ``--debug``. Each module raises its own kind; this list
names them all in one place."""

from __future__ import annotations


class UsageError(ValueError):
    """A command used in a way it cannot run (the message says how to run it)."""


def user_errors() -> tuple[type, ...]:
    """Every exception type that means "fix the input", imported when a command fails."""
    from prl.model_import import ImportFailed
    from prl.models import CheckpointRejected
    from prl.service import ServiceStopped
    from prl.storage import StorageError
    from prl.tasks.datasets import DatasetError
    from prl.tasks.reasoning_gym import DataError
    from prl.transport import TransportError
    from prl.trust import KeyMissing
    from schemas.config import ConfigError

    return (UsageError, ConfigError, DatasetError, DataError, StorageError, TransportError, ImportFailed, KeyMissing,
            CheckpointRejected, ServiceStopped, FileNotFoundError, PermissionError, NotADirectoryError)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 600 else text[:597] + "..."
