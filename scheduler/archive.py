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

Readers never need the archive in memory: ``read_outcomes`` gives statistics (each group's
problem, versions, rewards, turns) from five leaf columns, ``read_archive(problem_id=...)`` one
problem's groups from the files that hold it, ``ArchivedGroups`` every group in order a file at a
time (`prl replay train` and `publish`).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from prl.episodes import model_turns
from prl.errors import one_line
from prl.storage import StorageError, replace_file, unreachable
from prl.schemas import RolloutGroup
from prl.schemas.records import to_table

log = structlog.get_logger("scheduler.archive")
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
        """Keep ``group`` for the archive; write what is pending when a file is full or
        ``flush_every_s`` has passed. With the object store unreachable, that write waits for
        the next ``flush`` (the scheduler's snapshot, which must succeed before its offsets are
        committed): accepting a result never fails on storage."""
        rows = self.pending.setdefault(group.policy_version, [])
        rows.append((group, time.time(), learner_version))
        full = len(rows) >= self.max_rows
        if full or time.monotonic() - self.flushed_at >= self.flush_every_s:
            try:
                if full:
                    self.write(group.policy_version)
                else:
                    self.flush()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                self.flushed_at = time.monotonic()
                log.warning("archive_write_deferred", error=one_line(exc)[:300], pending_groups=sum(map(len, self.pending.values())))

    def flush(self) -> None:
        for version in list(self.pending):
            self.write(version)
        self.flushed_at = time.monotonic()

    def write(self, version: int) -> None:
        """Write ``version``'s pending rows as one file; they stay pending until it is written."""
        rows = self.pending.get(version, [])
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
        del self.pending[version]

    def close(self) -> None:
        self.flush()


OUTCOME_COLUMNS = ("problem_id", "error", "learner_version", "rollouts.list.element.reward",
                   "rollouts.list.element.model_mask")  # what statistics of the archive need: no tokens
ORDER_COLUMNS = ("dispatch_id", "accepted_at")  # what the reader needs to order rows and drop copies
READ_THREADS = 16  # files read at once (on object storage a file's read is mostly waiting)


def read_archive(uri: str, columns: tuple[str, ...] | None = None, problem_id: str | None = None) -> pa.Table:
    """The archive as one table with ``policy_version`` restored from the paths, sorted by
    acceptance time, each dispatch's group once (the first archived).

    ``columns``: the Parquet column paths to read (a field of the rollouts as
    ``rollouts.list.element.reward``; a path an older file lacks is left out of it), None for
    all: statistics over a run's archive read a few bytes a group instead of its tokens.
    ``problem_id``: that problem's rows alone, read whole from the files that hold it."""
    fs, files = archive_files(uri)
    wanted = None if columns is None else list(dict.fromkeys((*ORDER_COLUMNS, *columns)))
    return in_order(uri, [t for t in read_parts(fs, files, wanted, problem_id) if t is not None])


def archive_files(uri: str) -> tuple:
    """(the filesystem, every Parquet file of the archive); FileNotFoundError where there is none."""
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/"))
    files = sorted(f for f in fs.find(path) if f.endswith(".parquet"))
    if not files:
        raise FileNotFoundError(f"no Parquet files under {uri}")
    return fs, files


def read_parts(fs, files: list[str], columns: list[str] | None, problem_id: str | None) -> list[pa.Table | None]:
    """``read_part`` of each file, READ_THREADS at a time."""
    with ThreadPoolExecutor(READ_THREADS) as pool:
        return list(pool.map(lambda f: read_part(fs, f, columns, problem_id), files))


def in_order(uri: str, parts: list[pa.Table]) -> pa.Table:
    """The files' tables as one, in acceptance order, each dispatch once."""
    if not parts:
        return ARCHIVE_SCHEMA.empty_table().append_column("policy_version", pa.array([], pa.int64()))
    try:
        table = pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise StorageError(f"the archive under {uri} cannot be read as one table: {' '.join(str(exc).split())[:300]}") from None
    return first_of_each_dispatch(table.sort_by("accepted_at"))


def read_part(fs, path: str, columns: list[str] | None, problem_id: str | None) -> pa.Table | None:
    """One archive file's ``columns`` (None: all) with its partition's ``policy_version``; with
    ``problem_id``, its rows of that problem (None where it has none)."""
    folder = path.rsplit("/", 2)[-2]
    if not folder.startswith("policy_version=") or not folder[len("policy_version="):].isdigit():
        raise StorageError(f"archive file {path} is not in a policy_version=<V> folder; move it out of the archive and run again")
    try:
        with fs.open(path, "rb") as f:
            part = pq.ParquetFile(f)
            if problem_id is not None and problem_id not in set(part.read(columns=["problem_id"])["problem_id"].to_pylist()):
                return None
            leaves = [part.schema.column(i).path + "." for i in range(len(part.schema))]
            table = part.read(columns=None if columns is None else [c for c in columns if "." not in c or any(
                leaf.startswith(c + ".") for leaf in leaves)])
    except (pa.ArrowInvalid, OSError) as exc:
        raise StorageError(f"archive file {path} is not readable Parquet ({' '.join(str(exc).split())[:200]}); move it "
                           "out of the archive and run again (the scheduler writes archive files whole: this one was "
                           "damaged or put there by hand)") from None
    if problem_id is not None:
        table = table.filter(pc.equal(table["problem_id"], problem_id))
    version = int(folder[len("policy_version="):])
    return with_model_masks(table).append_column("policy_version", pa.array(np.full(table.num_rows, version), pa.int64()))


def with_model_masks(table: pa.Table) -> pa.Table:
    """A file from before model masks with each rollout's mask empty (every token the model's),
    as newer files write it, so both read as one table."""
    if "rollouts" not in table.column_names or table.schema.field("rollouts").type.value_type.get_field_index("model_mask") >= 0:
        return table
    rollouts = table["rollouts"].combine_chunks()
    inner = rollouts.flatten()
    fields = [pc.struct_field(inner, f.name) for f in inner.type] + [pa.array([[]] * len(inner), pa.list_(pa.uint8()))]
    names = [f.name for f in inner.type] + ["model_mask"]
    offsets = np.concatenate([[0], np.cumsum(pc.list_value_length(rollouts).to_numpy(zero_copy_only=False))]).astype(np.int32)
    masked = pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(fields, names=names))
    return table.set_column(table.schema.get_field_index("rollouts"), "rollouts", masked)


def first_of_each_dispatch(table: pa.Table) -> pa.Table:
    """The rows without the copies a restarted scheduler archived again: the first of each dispatch."""
    _, first = np.unique(table["dispatch_id"].to_numpy(zero_copy_only=False), return_index=True)
    return table.take(np.sort(first)) if len(first) < table.num_rows else table


@dataclass(frozen=True)
class GroupOutcome:
    """An archived group without its tokens: what statistics over a run need."""

    problem_id: str
    policy_version: int
    learner_version: int
    rewards: list[float]
    turns: list[int]  # the model's turns in each rollout (1 each in a single-turn task)


def read_outcomes(uri: str) -> list[GroupOutcome]:
    """The archive's served groups (no error, some rollouts) in acceptance order, read without
    their tokens (OUTCOME_COLUMNS)."""
    table = read_archive(uri, OUTCOME_COLUMNS)
    table = table.filter(pc.and_(pc.equal(table["error"], ""), pc.greater(pc.list_value_length(table["rollouts"]), 0)))
    rollouts = table["rollouts"].combine_chunks()
    inner = rollouts.flatten()
    bounds = np.concatenate([[0], np.cumsum(pc.list_value_length(rollouts).to_numpy())]).tolist()
    rewards = pc.struct_field(inner, "reward").to_numpy(zero_copy_only=False).tolist()
    masks = pc.struct_field(inner, "model_mask")
    mask_values = pc.list_flatten(masks).to_numpy(zero_copy_only=False)
    mask_bounds = np.concatenate([[0], np.cumsum(pc.list_value_length(masks).to_numpy())]).tolist()
    turns = [model_turns(mask_values[a:b]) for a, b in zip(mask_bounds[:-1], mask_bounds[1:])]
    columns = zip(table["problem_id"].to_pylist(), table["policy_version"].to_pylist(), table["learner_version"].to_pylist())
    return [GroupOutcome(pid, v, lv, rewards[a:b], turns[a:b]) for (pid, v, lv), a, b in zip(columns, bounds[:-1], bounds[1:])]


class ArchivedGroups:
    """Every archived group, tokens and all, in acceptance order, each dispatch once (as
    ``read_archive`` gives them), read a file at a time: a file is read when its first group is
    due and let go after its last, so what is held is the files of one moment of the run (the
    versions a snapshot flushed together), not the archive."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, self.files = archive_files(uri)
        parts = read_parts(self.fs, self.files, list(ORDER_COLUMNS), None)
        order = in_order(uri, [t.append_column("file", pa.array(np.full(t.num_rows, i), pa.int32()))
                                .append_column("row", pa.array(np.arange(t.num_rows), pa.int32())) for i, t in enumerate(parts)])
        self.order = list(zip(order["file"].to_pylist(), order["row"].to_pylist()))

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[RolloutGroup]:
        remaining = Counter(f for f, _ in self.order)
        held: dict[int, list[RolloutGroup]] = {}
        for f, row in self.order:
            if f not in held:
                held[f] = groups_from_table(read_part(self.fs, self.files[f], None, None))
            yield held[f][row]
            remaining[f] -= 1
            if not remaining[f]:
                del held[f]


def groups_from_table(table: pa.Table) -> list[RolloutGroup]:
    """The archive's rows as RolloutGroups (the extra columns dropped)."""
    from prl.schemas.records import from_table

    return from_table(table, RolloutGroup)
