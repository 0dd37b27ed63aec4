"""Metrics: namespaced keys (``learner/loss``, ``scheduler/groups_accepted``) appended
as JSON lines, one file per run directory, shared by every service of a process.

Object stores cannot append: there each process start writes its own part
(``metrics-learner.<start time>.jsonl``), rewritten at most every ``FLUSH_EVERY_S`` and at
exit, so a restarted service never overwrites what its predecessor wrote."""

from __future__ import annotations

import atexit
import bisect
import json
import threading
import time
from pathlib import Path

import fsspec
import structlog


FLUSH_EVERY_S = 10.0
LATENCY_BOUNDS_MS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)


def latency_bucket(ms: float, bounds: tuple = LATENCY_BOUNDS_MS) -> str:
    """The histogram bucket a latency counts in: ``le_<bound>`` for the smallest bound it does
    not exceed, ``le_inf`` above them all. A service counts ``<name>_bucket/<bucket>``, so a
    percentile over any stretch of a run is the difference of two metrics lines."""
    i = bisect.bisect_left(bounds, ms)
    return f"le_{bounds[i]}" if i < len(bounds) else "le_inf"


def bucket_quantile(counts: dict[str, int], q: float) -> float | None:
    """The ``q`` quantile of a histogram of ``{bucket: count}`` (``latency_bucket``'s names): the
    upper bound of the bucket it falls in, so "p99 <= 100 ms" and no finer (inf past the last
    bound); None for an empty histogram."""
    ordered = sorted((float(b.removeprefix("le_")), n) for b, n in counts.items() if n > 0)
    total = sum(n for _, n in ordered)
    seen = 0
    for bound, n in ordered:
        seen += n
        if seen >= q * total:
            return bound
    return None


def end_torn_line(path: Path) -> None:
    """End a last line a killed process left without its newline, so this process's first
    line starts on a line of its own (the torn line alone is lost, and read_metrics says so)."""
    if not (path.exists() and path.stat().st_size):
        return
    with open(path, "rb") as f:
        f.seek(-1, 2)
        torn = f.read(1) != b"\n"
    if torn:
        with open(path, "ab") as f:  # appended at the end, after any line another process wrote since
            f.write(b"\n")


class MetricsSink:
    """metrics.jsonl (or a part per process on object stores), and the configured trackers
    (prl/trackers.py): numeric values as scalars at the line's step, tables as tables."""

    def __init__(self, run_dir: str, filename: str = "metrics.jsonl", trackers: list | None = None):
        self.trackers = trackers or []
        fs, root = fsspec.core.url_to_fs(run_dir)
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        self._fs_path = f"{root.rstrip('/')}/{filename}"
        if self._local:
            Path(root).mkdir(parents=True, exist_ok=True)
            end_torn_line(Path(self._fs_path))
        else:
            stem, _, ext = filename.rpartition(".")
            self._fs_path = f"{root.rstrip('/')}/{stem}.{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**6:06d}.{ext}"
            atexit.register(self.flush)
        self.path = self._fs_path if self._local else fs.unstrip_protocol(self._fs_path)  # what read_metrics opens
        self._flushed_at = 0.0
        self._lock = threading.Lock()
        self._fs = fs
        self._buffer: list[str] = []  # every line of this process's part: a part is rewritten whole
        self._unflushed = False

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
                with open(self._fs_path, "a") as f:
                    f.write(text + "\n")
            else:
                self._buffer.append(text)
                self._unflushed = True
                if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
                    self._flush_locked()

    def table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        """A small table (a sample of rollouts) for the trackers; metrics.jsonl keeps numbers only."""
        with self._lock:
            for tracker in self.trackers:
                tracker.table(name, columns, rows, step)

    def flush(self) -> None:
        with self._lock:
            if self._unflushed:
                self._flush_locked()

    def close(self) -> None:
        self.flush()
        atexit.unregister(self.flush)
        with self._lock:
            for tracker in self.trackers:
                tracker.close()
            self.trackers = []

    def _flush_locked(self) -> None:
        self._fs.pipe_file(self._fs_path, ("\n".join(self._buffer) + "\n").encode())
        self._flushed_at, self._unflushed = time.monotonic(), False


def read_run_metrics(run_dir: str) -> list[dict]:
    """Every line of every metrics file under ``run_dir`` (metrics*.jsonl: the services' and
    each process's parts on object stores), in time order."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    files = sorted(fs.glob(f"{path.rstrip('/')}/metrics*.jsonl"))
    return sorted((r for f in files for r in read_metrics(fs.unstrip_protocol(f))), key=lambda r: r.get("time", 0))


def read_metrics(path: str) -> list[dict]:
    """Every line of a metrics file; a line that is not a JSON object (cut short when a process
    was killed mid-write) is skipped with a warning naming it."""
    rows, torn = [], []
    with fsspec.open(path, "r") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                torn.append(number)
    if torn:
        structlog.get_logger("metrics").warning("metrics_lines_skipped", path=path, lines=torn[:20], count=len(torn))
    return rows
