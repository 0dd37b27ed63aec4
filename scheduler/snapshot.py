"""Scheduler snapshots in object storage: what a restarted scheduler needs to continue.

``<run_dir>/scheduler/snap-00000042/`` (42: the next batch sequence number, or one past the
newest snapshot's number where that is more: the end of a run snapshots without a batch since
the one before, and a snapshot once written is never written again) holds
``state.json`` (in-flight table, counters, the sampler's small state, the pending batch's
header) and ``arrays.safetensors`` (the sampler's per-problem arrays, and where each record
below is stored), then ``manifest.json``; ``latest`` is written last (prl/storage.py).

The records are not written whole each time: the replay buffer alone is up to 30,000 rollouts
with their tokens and log-probs (about 0.5 GB at 2k tokens). A snapshot appends the records
that no segment holds yet as one segment per log, ``<run_dir>/scheduler/<log>/seg-00000042-<id>.arrow``,
and names each record it holds by segment and row, with each segment's checksum:

- ``replay/``: the replay buffer's rollouts, and the pending batch's (the batch composed with
  this state, not yet known to be on the topic: its fresh rollouts are the buffer's newest, its
  replayed ones the buffer's), with what the batch adds to each rollout (replayed or not,
  sample weight) in the header;
- ``fresh/``: the accepted rollout groups not yet in a batch.

A segment is deleted once neither of the two kept snapshots names it, so a step writes what
changed: the groups accepted and the rollouts that entered the buffer since the one before.

The scheduler snapshots before every batch it publishes and commits its rollout offsets right
after the snapshot. A restart resumes from the snapshot, re-reads exactly the results that
arrived after it, and publishes the pending batch again (same seq, same rollouts: the
learner skips it if it already has it), so no batch is lost and none is composed twice.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import uuid

import fsspec
import numpy as np
import pyarrow as pa

from prl import storage
from prl.schemas import RolloutGroup, TrainBatch, TrainRollout, decode
from prl.schemas.config import ConfigError
from prl.schemas.records import decode_many, encode_table, from_table, record_row


def root(run_dir: str) -> str:
    return run_dir.rstrip("/") + "/scheduler"


def split_arrays(state: dict, prefix: str = "") -> tuple[dict, dict]:
    """Separate numpy arrays (-> safetensors) from JSON-able values, recursively."""
    arrays, rest = {}, {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[prefix + key] = np.ascontiguousarray(value)
        elif isinstance(value, dict):
            sub_arrays, sub_rest = split_arrays(value, f"{prefix}{key}.")
            arrays.update(sub_arrays)
            rest[key] = sub_rest
        else:
            rest[key] = value
    return arrays, rest


def join_arrays(rest: dict, arrays: dict, prefix: str = "") -> dict:
    out = dict(rest)
    for key, value in rest.items():
        if isinstance(value, dict):
            out[key] = join_arrays(value, arrays, f"{prefix}{key}.")
    for name, arr in arrays.items():
        if name.startswith(prefix) and "." not in name[len(prefix):]:
            out[name[len(prefix):]] = arr
    return out


KEEP = 2  # snapshots kept: the newest, and the one before in case it does not verify


class SegmentLog:
    """Records on storage as segments, each written once; a snapshot names the records it
    holds by segment and row. ``key`` tells records apart (a rollout's id, a group's dispatch)."""

    def __init__(self, directory: str, record: type, key):
        self.dir, self.record, self.key = directory, record, key
        self.place: dict[str, tuple[str, int]] = {}  # key -> (segment, row): the records the last snapshot names
        self.checksums: dict[str, str] = {}  # segment -> checksum, of the segments the kept snapshots name
        self.named_before: set[str] = set()  # segments the snapshot before the last one names

    def append(self, seq: int, lists: dict[str, list]) -> dict:
        """Write the records of ``lists`` that no segment holds yet as one new segment (a record
        in two lists: the first list's copy); return the snapshot's part that names every record
        of each list, in order, by segment and row (``<name>segment``, ``<name>row``)."""
        unplaced = {}
        for records in reversed(lists.values()):
            unplaced.update({k: r for r in records if (k := self.key(r)) not in self.place})
        if unplaced:
            name = f"seg-{seq:08d}-{uuid.uuid4().hex[:8]}.arrow"
            table = pa.Table.from_pylist([record_row(r) for r in unplaced.values()], schema=self.record.SCHEMA)
            self.checksums[name] = storage.write_file(self.dir, "", name, encode_table(table))
            self.place.update({k: (name, row) for row, k in enumerate(unplaced)})
        self.place = {k: self.place[k] for records in lists.values() for k in map(self.key, records)}
        names = sorted({segment for segment, _ in self.place.values()})
        index = {n: i for i, n in enumerate(names)}
        part = {"segments": names, "checksums": [self.checksums[n] for n in names]}
        for prefix, records in lists.items():
            where = [self.place[self.key(r)] for r in records]
            part[prefix + "segment"] = np.array([index[segment] for segment, _ in where], dtype=np.int32)
            part[prefix + "row"] = np.array([row for _, row in where], dtype=np.int32)
        return part

    def prune(self, named: list[str]) -> None:
        """After a snapshot naming the segments ``named`` is complete: delete the segments this
        log knows of that neither it nor the snapshot before names (a segment it never knew, from
        a scheduler that crashed before its snapshot was complete, is left alone)."""
        keep = set(named) | self.named_before
        gone = [n for n in self.checksums if n not in keep]
        if gone:
            fs, path = fsspec.core.url_to_fs(self.dir)
            fs.rm([f"{path}/{n}" for n in gone])
        self.checksums = {n: c for n, c in self.checksums.items() if n in keep}
        self.named_before = set(named)

    def read(self, part: dict, prefixes: tuple[str, ...]) -> list[list]:
        """The records a snapshot's part names for each of ``prefixes`` (none where the part has
        no such list), each segment checked against its checksum; the log continues from them.
        The other segments in its directory (named by the snapshot before alone, or left by a
        process killed mid-snapshot) are deleted once two snapshots after this one do not name them."""
        names = list(part["segments"])
        segments = {n: from_table(pa.ipc.open_stream(pa.py_buffer(storage.read_checked(f"{self.dir}/{n}", c))).read_all(),
                                  self.record) for n, c in zip(names, part["checksums"])}
        others = storage.list_versions(self.dir, "seg-")
        self.checksums = {**{n: "" for n in others}, **dict(zip(names, part["checksums"]))}
        self.named_before = set(names) | set(others)
        self.place, out = {}, []
        for prefix in prefixes:
            where = list(zip(part.get(prefix + "segment", np.zeros(0)).tolist(), part.get(prefix + "row", np.zeros(0)).tolist()))
            records = [segments[names[s]][row] for s, row in where]
            self.place.update({self.key(r): (names[s], row) for r, (s, row) in zip(records, where)})
            out.append(records)
        return out


@dataclasses.dataclass
class Logs:
    """What a scheduler keeps between its snapshots: the segment logs (the replay buffer's and
    the pending batch's rollouts, and the accepted groups not yet in a batch) and the newest
    snapshot number in storage."""

    replay: SegmentLog
    fresh: SegmentLog
    newest: int = -1

    @classmethod
    def at(cls, run_dir: str) -> "Logs":
        return cls(SegmentLog(root(run_dir) + "/replay", TrainRollout, operator.attrgetter("rollout_id")),
                   SegmentLog(root(run_dir) + "/fresh", RolloutGroup, operator.attrgetter("dispatch_id")))


def batch_header(batch: TrainBatch) -> dict:
    """What a pending batch holds beside its rollouts as stored: its fields, and what it adds to
    each rollout (as RolloutRef does for a claim-check batch)."""
    return {"batch_id": batch.batch_id, "seq": batch.seq, "learner_version": batch.learner_version,
            "rollouts_generated": batch.rollouts_generated, "created_at": batch.created_at, "epoch": batch.epoch,
            "is_replay": np.array([r.is_replay for r in batch.rollouts], dtype=np.uint8),
            "advantage": np.array([r.advantage for r in batch.rollouts], dtype=np.float32),
            "sample_weight": np.array([r.sample_weight for r in batch.rollouts], dtype=np.float32)}


def batch_from(header: dict, rollouts: list[TrainRollout]) -> TrainBatch:
    """The pending batch again, from its header and its rollouts as stored; checked as one
    from the topic would be."""
    added = [header[k] for k in ("is_replay", "advantage", "sample_weight")]
    if any(len(a) != len(rollouts) for a in added):
        raise ValueError(f"scheduler snapshot: the pending batch names {len(rollouts):,} rollouts, its header "
                         f"{', '.join(str(len(a)) for a in added)} values")
    batch = TrainBatch(header["batch_id"], header["seq"], header["learner_version"], header["rollouts_generated"],
                       [dataclasses.replace(r, is_replay=bool(i), advantage=float(a), sample_weight=float(w))
                        for r, i, a, w in zip(rollouts, *(a.tolist() for a in added))],
                       header["created_at"], header["epoch"])
    batch.validate()
    return batch


def write_snapshot(run_dir: str, seq: int, state: dict, fresh: list[RolloutGroup], replay: list[TrainRollout],
                   pending: TrainBatch | None = None, logs: Logs | None = None) -> str:
    """Write the scheduler's state, the batch about to go out and, to ``logs`` (the
    scheduler's, kept between snapshots; new ones write every record), the records of the
    replay buffer, of that batch and of its fresh groups that no segment holds yet; return the
    snapshot's URI."""
    from safetensors.numpy import save

    logs = logs or Logs.at(run_dir)
    replay_part = logs.replay.append(seq, {"": replay, "batch_": pending.rollouts if pending is not None else []})
    fresh_part = logs.fresh.append(seq, {"": fresh})
    arrays, rest = split_arrays({**state, "replay_log": replay_part, "fresh_log": fresh_part,
                                 **({"pending": batch_header(pending)} if pending is not None else {})})
    files = {"state.json": json.dumps(rest).encode(),
             "arrays.safetensors": save(arrays) if arrays else save({"_": np.zeros(1)})}
    logs.newest = max(seq, logs.newest + 1)  # never into a directory written before: the one before must stay whole
    uri = storage.write_versioned(root(run_dir), f"snap-{logs.newest:08d}", files, KEEP, meta={"seq": seq})
    logs.replay.prune(replay_part["segments"])
    logs.fresh.prune(fresh_part["segments"])
    return uri


def read_snapshot(run_dir: str, check=None, logs: Logs | None = None
                  ) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None] | None:
    """The newest snapshot that verifies, parses and holds together (``check(state)`` raises
    ValueError where it does not: the scheduler checks its pool's sizes and its sampler's
    state); a torn, tampered or inconsistent one, or a garbage ``latest``, is logged and passed
    over for the one before. None if there is none. One of another configuration raises ConfigError."""
    logs = logs or Logs.at(run_dir)
    logs.newest = max([int(n[5:]) for n in storage.list_versions(root(run_dir), "snap-") if storage.VERSION_NAME.match(n)],
                      default=-1)
    found = storage.first_readable(storage.candidates(root(run_dir), "snap-"),
                                   lambda uri: read_snapshot_at(uri, check, logs), "snapshot", fatal=(ConfigError,))
    return None if found is None else found[1]


def read_snapshot_at(uri: str, check, logs: Logs) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None]:
    """One snapshot. Those written before 2026-12-06 hold their fresh groups and pending batch
    whole (fresh.arrow, pending.arrow); they are read as they are."""
    from safetensors.numpy import load

    rest = json.loads(storage.read_verified(uri, "state.json"))
    arrays = {k: v for k, v in load(storage.read_verified(uri, "arrays.safetensors")).items() if k != "_"}
    state = join_arrays(rest, arrays)
    replay_part, fresh_part, header = state.pop("replay_log"), state.pop("fresh_log", None), state.pop("pending", None)
    if check is not None:
        check(state)
    replay, batch_rollouts = logs.replay.read(replay_part, ("", "batch_"))
    if fresh_part is not None:
        (fresh,) = logs.fresh.read(fresh_part, ("",))
    else:
        fresh = decode_many(storage.read_verified(uri, "fresh.arrow"), RolloutGroup)
    if header is not None:
        pending = batch_from(header, batch_rollouts)
    else:
        pending = decode(storage.read_verified(uri, "pending.arrow"), TrainBatch) if storage.has_file(uri, "pending.arrow") else None
    return state, fresh, replay, pending


def expect_sized(fields: dict) -> None:
    """ValueError naming the first field whose length is not the one given: {name: (values, length)}."""
    for name, (values, size) in fields.items():
        if len(values) != size:
            raise ValueError(f"scheduler snapshot: {name} has {len(values):,} entries, the sampler {size:,}")


def expect_inside(fields: dict) -> None:
    """ValueError naming the first field that holds a value outside its range: {name: (values, low, high)}."""
    for name, (values, low, high) in fields.items():
        held = np.asarray(values, dtype=np.int64).ravel()
        outside = held[(held < low) | (held >= high)]
        if outside.size:
            raise ValueError(f"scheduler snapshot: {name} holds {outside[0]}, outside {low}..{high - 1}")


def expect_state(state: dict, kind: str, size: str, fits: bool) -> None:
    """ConfigError unless a snapshot's sampler state is one of this kind (``state["sampler"]``)
    and ``fits`` this pool (a run continued, or explained, with another configuration than it
    was started with): one line naming both sides and the fix."""
    if state.get("sampler") != kind or not fits:
        raise ConfigError(f"the scheduler snapshot holds a {state.get('sampler')!s} sampler's state that does not fit this "
                          f"configuration's {kind} sampler of {size}: give the run the configuration it was started with "
                          "(scheduler.strategy, task), or use a new run directory")
