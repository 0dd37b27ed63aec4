"""Metrics: namespaced keys (``learner/loss``, ``scheduler/groups_accepted``) appended
as JSON lines, one file per run directory, shared by every service of a process."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import fsspec


class MetricsSink:
    def __init__(self, run_dir: str, filename: str = "metrics.jsonl"):
        fs, root = fsspec.core.url_to_fs(run_dir)
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        self.path = f"{root.rstrip('/')}/{filename}"
        if self._local:
            Path(root).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fs = fs
        self._buffer: list[str] = []

    def write(self, service: str, values: dict, **context) -> None:
        """One line: time, service, context (step, version, ...) and ``service/key`` values."""
        line = {"time": round(time.time(), 3), "service": service, **context}
        line.update({f"{service}/{k}": v for k, v in values.items()})
        text = json.dumps(line, default=float)
        with self._lock:
            if self._local:
                with open(self.path, "a") as f:
                    f.write(text + "\n")
            else:  # object stores cannot append: rewrite the whole file
                self._buffer.append(text)
                self._fs.pipe_file(self.path, ("\n".join(self._buffer) + "\n").encode())


def read_metrics(path: str) -> list[dict]:
    with fsspec.open(path, "r") as f:
        return [json.loads(line) for line in f if line.strip()]
