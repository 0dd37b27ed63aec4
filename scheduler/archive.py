"""The rollout archive: every RolloutGroup the scheduler accepts, as Parquet through fsspec.

Layout (Hive partitioning, so pyarrow, pandas and duckdb read it without this project)::

    <run_dir>/archive/policy_version=<V>/part-<writer>-<n>.parquet

One row per rollout group. Columns (``policy_version`` comes from the directory name):

    dispatch_id      string   the dispatch this group answers
    problem_id       string
    producer_id      string   the generation pod
    prompt_ids       list<int32>
    temperature      float64
    rollouts         list<struct<completion_ids: list<int32>, logprobs: list<float32>,
                              reward: float32, finish_reason: string, text: string>>
    generate_seconds float32  producer's engine time for the call that made it
    reward_seconds   float32
    created_at       float64  unix time the producer finished the group
    error            string   "" for a served problem
    accepted_at      float64  unix time the scheduler accepted it
    learner_version  int64    the learner's version the scheduler knew then (age = this - V)

A file holds at most ``max_rows`` groups; a partial file is written when ``flush_every_s``
passes, at every scheduler snapshot (before the rollout offsets are committed, so a killed
scheduler loses no archived group: it re-reads and re-archives what came after its snapshot,
which can archive a group twice; the reader keeps the first) and on ``close`` (on shutdown).
Each writer start uses its own file prefix, so a restarted scheduler never overwrites a file.
Each file is written whole (on a local disk a temporary file renamed; on object storage one
PUT), so a killed scheduler leaves no torn file for the readers.
"""

from __future__ import annotations

import time
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from prl.storage import StorageError, replace_file
from prl.schemas import RolloutGroup
from prl.schemas.records import to_table

EXTRA = [("accepted_at", pa.float64()), ("learner_version", pa.int64())]
ARCHIVE_SCHEMA = pa.schema([f for f in RolloutGroup.SCHEMA if f.name != "policy_version"] + [pa.field(*e) for e in EXTRA])
# Token-level columns are written without a dictionary: one of a 50k vocabulary's ids or of
# log-probs outgrows its page and falls back to plain after the work is done (at 2,000 tokens
# a rollout: 1.7x the write time, and 1.2x the bytes).
TOKEN_COLUMNS = ("prompt_ids.list.element", "rollouts.list.element.completion_ids.list.element",
                 "rollouts.list.element.logprobs.list.element")


def column_paths(t: pa.DataType, path: str) -> list[str]:
    """Parquet's paths of the leaf columns under a field (a list's items: ``<path>.list.element``)."""
    if pa.types.is_list(t):
        return column_paths(t.value_type, path + ".list.element")
    if pa.types.is_struct(t):
        return [p for f in t for p in column_paths(f.type, f"{path}.{f.name}")]
    return [path]


DICTIONARY_COLUMNS = [p for f in ARCHIVE_SCHEMA for p in column_paths(f.type, f.name) if p not in TOKEN_COLUMNS]


def root(run_dir: str) -> str:
    return run_dir.rstrip("/") + "/archive"


class RolloutArchive:
    def __init__(self, uri: str, max_rows: int = 10_000, flush_every_s: float = 60.0):
        self.uri = uri.rstrip("/")
        self.max_rows, self.flush_every_s = max_rows, flush_every_s
        self.writer_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.pending: dict[int, list[tuple[RolloutGroup, float, int]]] = {}
        self.files_written = 0
        self.flushed_at = time.monotonic()

    def add(self, group: RolloutGroup, learner_version: int) -> None:
        rows = self.pending.setdefault(group.policy_version, [])
        rows.append((group, time.time(), learner_version))
        if len(rows) >= self.max_rows:
            self.write(group.policy_version)
        elif time.monotonic() - self.flushed_at >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        for version in list(self.pending):
            self.write(version)
        self.flushed_at = time.monotonic()

    def write(self, version: int) -> None:
        rows = self.pending.pop(version, [])
        if not rows:
            return
        table = to_table([g for g, _, _ in rows], RolloutGroup).drop_columns(["policy_version"])
        table = table.append_column("accepted_at", pa.array([t for _, t, _ in rows], pa.float64()))
        table = table.append_column("learner_version", pa.array([v for _, _, v in rows], pa.int64()))
        table = table.cast(ARCHIVE_SCHEMA).replace_schema_metadata(None)
        path = f"{self.uri}/policy_version={version}/part-{self.writer_id}-{self.files_written:05d}.parquet"
        fs, fpath = fsspec.core.url_to_fs(path)
        fs.makedirs(fpath.rsplit("/", 1)[0], exist_ok=True)
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, compression="zstd", use_dictionary=DICTIONARY_COLUMNS)
        replace_file(fs, fpath, buf.getvalue().to_pybytes())  # a killed scheduler leaves no torn file
        self.files_written += 1

    def close(self) -> None:
        self.flush()


def read_archive(uri: str) -> pa.Table:
    """The whole archive as one table with ``policy_version`` restored from the paths,
    sorted by acceptance time, each dispatch's group once (the first archived)."""
    import pyarrow.dataset as ds

    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"))
    files = [f for f in fs.find(path) if f.endswith(".parquet")]
    if not files:
        raise FileNotFoundError(f"no Parquet files under {uri}")
    try:
        dataset = ds.dataset(files, filesystem=fs, format="parquet", partitioning="hive", partition_base_dir=path)
        table = dataset.to_table()
    except (pa.ArrowInvalid, OSError) as exc:
        raise StorageError(unreadable_archive(fs, files, exc)) from None
    table = table.set_column(table.schema.get_field_index("policy_version"), "policy_version",
                             table["policy_version"].cast(pa.int64()))
    return first_of_each_dispatch(table.sort_by("accepted_at"))


def first_of_each_dispatch(table: pa.Table) -> pa.Table:
    """The rows without the copies a restarted scheduler archived again: the first of each dispatch."""
    _, first = np.unique(table["dispatch_id"].to_numpy(zero_copy_only=False), return_index=True)
    return table.take(np.sort(first)) if len(first) < table.num_rows else table


def unreadable_archive(fs, files: list[str], exc: Exception) -> str:
    """One line naming the archive file pyarrow could not read, and what to do about it."""
    for f in files:
        if problem := parquet_problem(fs, f):
            return (f"archive file {f} is not readable Parquet ({problem}); move it out of the archive and run "
                    "again (the scheduler writes archive files whole: this one was damaged or put there by hand)")
    return f"the archive under {files[0].rsplit('/', 2)[0]} cannot be read as one table: {' '.join(str(exc).split())[:300]}"


def parquet_problem(fs, path: str) -> str | None:
    """Why ``path`` is not a Parquet file whose schema can be read, or None."""
    try:
        with fs.open(path, "rb") as f:
            pq.read_schema(f)
        return None
    except (pa.ArrowInvalid, OSError) as exc:
        return " ".join(str(exc).split())[:200]


def groups_from_table(table: pa.Table) -> list[RolloutGroup]:
    """The archive's rows as RolloutGroups (the extra columns dropped)."""
    from prl.schemas.records import from_table

    return from_table(table, RolloutGroup)
