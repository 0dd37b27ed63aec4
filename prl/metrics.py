"""Metrics: namespaced keys (``learner/loss``, ``scheduler/groups_accepted``) appended
as JSON lines, one file per run directory, shared by every service of a process.

Object stores cannot append: there each process start writes its own part
(``metrics-learner.<start time>.jsonl``), rewritten at most every ``FLUSH_EVERY_S`` and at
exit, so a restarted service never overwrites what its predecessor wrote."""

from __future__ import annotations

import atexit
import json
import threading
import time
from pathlib import Path

import fsspec


FLUSH_EVERY_S = 10.0


class MetricsSink:
    """metrics.jsonl (or a part per process on object stores), and the configured trackers
    (prl/trackers.py): numeric values as scalars at the line's step, tables as tables."""

    def __init__(self, run_dir: str, filename: str = "metrics.jsonl", trackers: list | None = None):
        self.trackers = trackers or []
        fs, root = fsspec.core.url_to_fs(run_dir)
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        self.path = f"{root.rstrip('/')}/{filename}"
        if self._local:
            Path(root).mkdir(parents=True, exist_ok=True)
        else:
            stem, _, ext = filename.rpartition(".")
            self.path = f"{root.rstrip('/')}/{stem}.{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6:06d}.{ext}"
            atexit.register(self.flush)
        self._flushed_at = 0.0
        self._lock = threading.Lock()
        self._fs = fs
        self._buffer: list[str] = []

    def write(self, service: str, values: dict, **context) -> None:
        """One line: time, service, context (step, version, ...) and ``service/key`` values."""
        line = {"time": round(time.time(), 3), "service": service, **context}
        line.update({f"{service}/{k}": v for k, v in values.items()})
        text = json.dumps(line, default=float)
        step = int(context.get("rollouts_generated", context.get("step", context.get("seq", 0))) or 0)
        scalars = {k: v for k, v in line.items() if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)}
        with self._lock:
            for tracker in self.trackers:
                tracker.log(scalars, step)
            if self._local:
                with open(self.path, "a") as f:
                    f.write(text + "\n")
            else:
                self._buffer.append(text)
                if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
                    self._flush_locked()

    def table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        """A small table (a sample of rollouts) for the trackers; metrics.jsonl keeps numbers only."""
        with self._lock:
            for tracker in self.trackers:
                tracker.table(name, columns, rows, step)

    def flush(self) -> None:
        with self._lock:
            if not self._local and self._buffer:
                self._flush_locked()

    def close(self) -> None:
        self.flush()
        with self._lock:
            for tracker in self.trackers:
                tracker.close()
            self.trackers = []

    def _flush_locked(self) -> None:
        self._fs.pipe_file(self.path, ("\n".join(self._buffer) + "\n").encode())
        self._flushed_at = time.monotonic()


def read_metrics(path: str) -> list[dict]:
    with fsspec.open(path, "r") as f:
        return [json.loads(line) for line in f if line.strip()]
