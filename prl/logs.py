"""Logging, configured once per process: structlog events and the libraries' own loggers
(kafka-python, transformers, vLLM, the S3 clients) go through the same handlers and the same renderer.

- ``console`` format: lines for people; ``json``: one JSON object per line, nothing else.
- The console shows ``console_level`` and above; with ``log_file`` every event at ``level``
  and above also goes to that file (``prl run`` keeps the console to one line per
  evaluation and writes the details to ``<run_dir>/prl.log``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from contextlib import contextmanager

import structlog

SHARED = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]
LIBRARIES = ("kafka", "transformers", "vllm", "urllib3", "botocore", "aiobotocore", "s3fs", "fsspec", "httpx", "filelock")


def configure(fmt: str = "console", level: str = "info", log_file: str | None = None,
              console_level: str | None = None, libraries_on_console: bool = True) -> None:
    """``libraries_on_console``: False keeps the libraries' own lines (their loggers and Python
    warnings) off the console; they go to ``log_file`` alone."""
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*SHARED, structlog.processors.format_exc_info, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=SHARED, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer])
    handlers = [_handler(logging.StreamHandler(_CurrentStderr()), console_level or level, formatter)]
    if not libraries_on_console and log_file:
        handlers[0].addFilter(_OwnLines())
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        handlers.append(_handler(logging.FileHandler(log_file), level, formatter))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(min(h.level for h in handlers))
    _route_libraries(max(logging.WARNING, min(h.level for h in handlers)))
    logging.captureWarnings(True)  # a library's warnings.warn is a log line too (logger py.warnings)
    logging.raiseExceptions = False  # a line the file cannot take (a full disk) is lost, not a traceback on the console


class Recurring:
    """A fault that can recur on every call (a reward function's, an environment's), warned of
    at its 1st, 10th, 100th, ... time of each kind with the count so far: the first says what is
    wrong, the later ones that it goes on, and the log stays short."""

    def __init__(self, log, event: str):
        self.log, self.event, self.counts = log, event, Counter()

    def __call__(self, kind: str, **fields) -> None:
        self.counts[kind] += 1
        if str(self.counts[kind]).rstrip("0") == "1":
            self.log.warning(self.event, kind=kind, count=self.counts[kind], **fields)


def failure_line(where: str, message: str, fmt: str) -> str:
    """The one line a command that stops on a mistake a person can fix ends with: ``where:
    message``, or with ``json`` a JSON object like every other line of a pod's log."""
    if fmt != "json":
        return f"{where}: {message}"
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    return json.dumps({"event": "command_failed", "level": "error", "logger": where, "timestamp": now, "error": message})


THIRD_PARTY = (*LIBRARIES, "py.warnings", "torch", "peft", "accelerate", "matplotlib", "PIL")


class _OwnLines(logging.Filter):
    """Passes prl's own lines; drops the libraries' (they stay in the log file)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(record.name == name or record.name.startswith(name + ".") for name in THIRD_PARTY)


@contextmanager
def native_output_to(log_file: str | None):
    """While the block runs, what is written below Python to the process's standard error (the
    C++ warnings of torch and of vLLM's native libraries) goes to ``log_file``; ``sys.stderr``
    keeps the console. Nothing changes where ``sys.stderr`` is not the process's own (a test's
    capture) or there is no log file."""
    if not log_file or sys.stderr is not sys.__stderr__:
        yield
        return
    original = sys.stderr
    original.flush()
    console = os.dup(2)
    target = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(target, 2)
    os.close(target)
    sys.stderr = open(console, "w", buffering=1, encoding=original.encoding, errors="backslashreplace", closefd=False)
    try:
        yield
    finally:
        sys.stderr.close()  # the console's file object; its descriptor is closed below, after fd 2 is back
        os.dup2(console, 2)
        os.close(console)
        sys.stderr = original


def _handler(handler: logging.Handler, level: str, formatter) -> logging.Handler:
    handler.setLevel(getattr(logging, level.upper()))
    handler.setFormatter(formatter)
    return handler


def _route_libraries(level: int) -> None:
    """The libraries' loggers propagate to our handlers (warnings and above), and their own
    handlers and progress bars are off."""
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for name in LIBRARIES:
        lib = logging.getLogger(name)
        lib.handlers.clear()
        lib.propagate = True
        lib.setLevel(level)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when a line is written (it may be replaced after
    configuration: by a test's capture, or a command that redirects it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()
