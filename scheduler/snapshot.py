"""Scheduler snapshots in object storage: what a restarted scheduler needs to continue.

``<run_dir>/scheduler/snap-00000042/`` (42 = the next batch sequence number) holds
``state.json`` (in-flight table, counters, the sampler's small state), ``arrays.safetensors``
(the sampler's per-problem arrays, and where each rollout of the replay buffer is stored),
``fresh.arrow`` (accepted rollout groups not yet in a batch) and ``pending.arrow`` (the batch
composed with this state, not yet known to be on the topic), then ``manifest.json``; ``latest``
is written last (prl/storage.py).

The replay buffer (up to 30,000 rollouts with their tokens and log-probs: about 0.5 GB at 2k
tokens) is not written whole: a snapshot appends the rollouts that entered it since the one
before as one segment, ``<run_dir>/scheduler/replay/seg-00000042-<id>.arrow``, and names every
rollout in the buffer by segment and row, with each segment's checksum. A segment is deleted
once neither of the two kept snapshots names it, so a step writes what changed, not the buffer.

The scheduler snapshots before every batch it publishes and commits its rollout offsets right
after the snapshot. A restart resumes from the snapshot, re-reads exactly the results that
arrived after it, and publishes the pending batch again (same seq, same rollouts: the
learner skips it if it already has it), so no batch is lost and none is composed twice.
"""

from __future__ import annotations

import json
import uuid

import fsspec
import numpy as np
import pyarrow as pa

from prl import storage
from prl.schemas import RolloutGroup, TrainBatch, TrainRollout, decode, encode
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

    def append(self, seq: int, live: list[TrainRollout]) -> dict:
        """Write the rollouts of ``live`` that no segment holds yet as one new segment; return the
        snapshot's part that names every rollout of ``live``, in order, by segment and row."""
        new = [r for r in live if r.rollout_id not in self.place]
        if new:
            name = f"seg-{seq:08d}-{uuid.uuid4().hex[:8]}.arrow"
            self.checksums[name] = storage.write_file(self.dir, "", name, rollout_table(new))
            self.place.update({r.rollout_id: (name, row) for row, r in enumerate(new)})
        self.place = {r.rollout_id: self.place[r.rollout_id] for r in live}
        names = sorted({segment for segment, _ in self.place.values()})
        index = {n: i for i, n in enumerate(names)}
        where = [self.place[r.rollout_id] for r in live]
        return {"segments": names, "checksums": [self.checksums[n] for n in names],
                "segment": np.array([index[segment] for segment, _ in where], dtype=np.int32),
                "row": np.array([row for _, row in where], dtype=np.int32)}

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

    def read(self, part: dict) -> list[TrainRollout]:
        """The rollouts a snapshot's part names, each segment checked against its checksum; the
        log continues from them."""
        segments = {n: read_replay(storage.read_checked(f"{self.dir}/{n}", c))
                    for n, c in zip(part["segments"], part["checksums"])}
        names = list(part["segments"])
        rollouts = [segments[names[s]][row] for s, row in zip(part["segment"].tolist(), part["row"].tolist())]
        self.place = {r.rollout_id: (names[s], row) for r, s, row in zip(rollouts, part["segment"].tolist(), part["row"].tolist())}
        self.checksums = dict(zip(names, part["checksums"]))
        self.named_before = set(names)
        return rollouts


def rollout_table(rollouts: list[TrainRollout]) -> bytes:
    return encode_table(pa.Table.from_pylist([record_row(r) for r in rollouts], schema=TrainRollout.SCHEMA))


def write_snapshot(run_dir: str, seq: int, state: dict, fresh: list[RolloutGroup], replay: list[TrainRollout],
                   pending: TrainBatch | None = None, log: ReplayLog | None = None) -> str:
    """Write the scheduler's state, its fresh groups, the batch about to go out and, to ``log``
    (the scheduler's, kept between snapshots; a new one writes every rollout), the replay
    buffer's new rollouts; return the snapshot's URI."""
    from safetensors.numpy import save

    log = log or ReplayLog(run_dir)
    part = log.append(seq, replay)
    arrays, rest = split_arrays({**state, "replay_log": part})
    files = {
        "state.json": json.dumps(rest).encode(),
        "arrays.safetensors": save(arrays) if arrays else save({"_": np.zeros(1)}),
        "fresh.arrow": encode_table(to_table(fresh, RolloutGroup)),
        **({"pending.arrow": encode(pending)} if pending is not None else {}),
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
    pending = decode(storage.read_verified(uri, "pending.arrow"), TrainBatch) if storage.has_file(uri, "pending.arrow") else None
    state = join_arrays(rest, arrays)
    part = state.pop("replay_log")
    if check is not None:
        check(state)
    return state, fresh, log.read(part), pending


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
