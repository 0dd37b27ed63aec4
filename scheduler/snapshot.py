"""Scheduler snapshots in object storage: what a restarted scheduler needs to continue.

``<run_dir>/scheduler/snap-00000042/`` (42 = the next batch sequence number) holds
``state.json`` (in-flight table, counters, the sampler's small state, the pending batch's
header), ``arrays.safetensors`` (the sampler's per-problem arrays, and where each rollout of the
replay buffer and of the pending batch is stored), ``fresh.arrow`` (accepted rollout groups not
yet in a batch), then ``manifest.json``; ``latest`` is written last (prl/storage.py). The pending
batch is the one composed with this state, not yet known to be on the topic.

The replay buffer (up to 30,000 rollouts with their tokens and log-probs: about 0.5 GB at 2k
tokens) is not written whole: a snapshot appends the rollouts that entered it since the one
before as one segment, ``<run_dir>/scheduler/replay/seg-00000042-<id>.arrow``, and names every
rollout in the buffer by segment and row, with each segment's checksum. The pending batch is
named the same way (its fresh rollouts are the buffer's newest, its replayed ones the buffer's),
with what the batch adds to each rollout (replayed or not, sample weight). A segment is deleted
once neither of the two kept snapshots names it, so a step writes what changed, not the buffer.

The scheduler snapshots before every batch it publishes and commits its rollout offsets right
after the snapshot. A restart resumes from the snapshot, re-reads exactly the results that
arrived after it, and publishes the pending batch again (same seq, same rollouts: the
learner skips it if it already has it), so no batch is lost and none is composed twice.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import fsspec
import numpy as np
import pyarrow as pa

from prl import storage
from prl.schemas import RolloutGroup, TrainBatch, TrainRollout, decode
from prl.schemas.config import ConfigError
from prl.schemas.records import decode_many, encode_table, from_table, record_row, to_table


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


class ReplayLog:
    """The replay buffer's rollouts on storage as segments, each written once."""

    def __init__(self, run_dir: str):
        self.dir = root(run_dir) + "/replay"
        self.place: dict[str, tuple[str, int]] = {}  # rollout id -> (segment, row): the rollouts the last snapshot names
        self.checksums: dict[str, str] = {}  # segment -> checksum, of the segments the kept snapshots name
        self.named_before: set[str] = set()  # segments the snapshot before the last one names

    def append(self, seq: int, live: list[TrainRollout], batch: list[TrainRollout] = ()) -> dict:
        """Write the rollouts of ``live`` (the replay buffer) and ``batch`` (the pending batch's)
        that no segment holds yet as one new segment; return the snapshot's part that names
        every rollout of each, in order, by segment and row (``segment``/``row`` for ``live``,
        ``batch_segment``/``batch_row`` for ``batch``)."""
        unplaced = {r.rollout_id: r for r in [*batch, *live] if r.rollout_id not in self.place}  # the buffer's copy wins
        if unplaced:
            name = f"seg-{seq:08d}-{uuid.uuid4().hex[:8]}.arrow"
            self.checksums[name] = storage.write_file(self.dir, "", name, rollout_table(list(unplaced.values())))
            self.place.update({rid: (name, row) for row, rid in enumerate(unplaced)})
        self.place = {r.rollout_id: self.place[r.rollout_id] for r in [*live, *batch]}
        names = sorted({segment for segment, _ in self.place.values()})
        index = {n: i for i, n in enumerate(names)}
        return {"segments": names, "checksums": [self.checksums[n] for n in names],
                **self.rows("", live, index), **self.rows("batch_", batch, index)}

    def rows(self, prefix: str, rollouts: list[TrainRollout], index: dict) -> dict:
        where = [self.place[r.rollout_id] for r in rollouts]
        return {prefix + "segment": np.array([index[segment] for segment, _ in where], dtype=np.int32),
                prefix + "row": np.array([row for _, row in where], dtype=np.int32)}

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

    def read(self, part: dict) -> tuple[list[TrainRollout], list[TrainRollout]]:
        """The rollouts a snapshot's part names, each segment checked against its checksum: the
        replay buffer's and the pending batch's (as stored, before what the batch adds). The log
        continues from them."""
        names = list(part["segments"])
        segments = {n: read_replay(storage.read_checked(f"{self.dir}/{n}", c)) for n, c in zip(names, part["checksums"])}
        self.checksums = dict(zip(names, part["checksums"]))
        self.named_before = set(names)
        self.place = {}
        named = []
        for prefix in ("", "batch_"):  # a snapshot written before pending batches were named has no batch_
            where = list(zip(part.get(prefix + "segment", np.zeros(0)).tolist(), part.get(prefix + "row", np.zeros(0)).tolist()))
            rollouts = [segments[names[s]][row] for s, row in where]
            self.place.update({r.rollout_id: (names[s], row) for r, (s, row) in zip(rollouts, where)})
            named.append(rollouts)
        return named[0], named[1]


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


def rollout_table(rollouts: list[TrainRollout]) -> bytes:
    return encode_table(pa.Table.from_pylist([record_row(r) for r in rollouts], schema=TrainRollout.SCHEMA))


def write_snapshot(run_dir: str, seq: int, state: dict, fresh: list[RolloutGroup], replay: list[TrainRollout],
                   pending: TrainBatch | None = None, log: ReplayLog | None = None) -> str:
    """Write the scheduler's state, its fresh groups, the batch about to go out and, to ``log``
    (the scheduler's, kept between snapshots; a new one writes every rollout), the rollouts
    of the replay buffer and of that batch that no segment holds yet; return the snapshot's URI."""
    from safetensors.numpy import save

    log = log or ReplayLog(run_dir)
    part = log.append(seq, replay, pending.rollouts if pending is not None else [])
    arrays, rest = split_arrays({**state, "replay_log": part, **({"pending": batch_header(pending)} if pending is not None else {})})
    files = {
        "state.json": json.dumps(rest).encode(),
        "arrays.safetensors": save(arrays) if arrays else save({"_": np.zeros(1)}),
        "fresh.arrow": encode_table(to_table(fresh, RolloutGroup)),
    }
    uri = storage.write_versioned(root(run_dir), f"snap-{seq:08d}", files, KEEP, meta={"seq": seq})
    log.prune(part["segments"])
    return uri


def read_snapshot(run_dir: str, check=None, log: ReplayLog | None = None
                  ) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None] | None:
    """The newest snapshot that verifies, parses and holds together (``check(state)`` raises
    ValueError where it does not: the scheduler checks its pool's sizes and its sampler's
    state); a torn, tampered or inconsistent one, or a garbage ``latest``, is logged and passed
    over for the one before. None if there is none. One of another configuration raises ConfigError."""
    log = log or ReplayLog(run_dir)
    found = storage.first_readable(storage.candidates(root(run_dir), "snap-"),
                                   lambda uri: read_snapshot_at(uri, check, log), "snapshot", fatal=(ConfigError,))
    return None if found is None else found[1]


def read_snapshot_at(uri: str, check, log: ReplayLog) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None]:
    from safetensors.numpy import load

    rest = json.loads(storage.read_verified(uri, "state.json"))
    arrays = {k: v for k, v in load(storage.read_verified(uri, "arrays.safetensors")).items() if k != "_"}
    fresh = decode_many(storage.read_verified(uri, "fresh.arrow"), RolloutGroup)
    state = join_arrays(rest, arrays)
    part, header = state.pop("replay_log"), state.pop("pending", None)
    if check is not None:
        check(state)
    replay, batch_rollouts = log.read(part)
    if header is not None:
        pending = batch_from(header, batch_rollouts)
    else:  # a snapshot written before pending batches were named by segment and row holds its batch whole, if any
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


def read_replay(data: bytes) -> list[TrainRollout]:
    """The replay buffer's rollouts: a table of TrainRollout rows."""
    return from_table(pa.ipc.open_stream(pa.py_buffer(data)).read_all(), TrainRollout)


def expect_state(state: dict, kind: str, size: str, fits: bool) -> None:
    """ConfigError unless a snapshot's sampler state is one of this kind (``state["sampler"]``)
    and ``fits`` this pool (a run continued, or explained, with another configuration than it
    was started with): one line naming both sides and the fix."""
    if state.get("sampler") != kind or not fits:
        raise ConfigError(f"the scheduler snapshot holds a {state.get('sampler')!s} sampler's state that does not fit this "
                          f"configuration's {kind} sampler of {size}: give the run the configuration it was started with "
                          "(scheduler.strategy, task), or use a new run directory")
