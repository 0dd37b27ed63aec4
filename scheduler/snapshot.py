"""Scheduler snapshots in object storage: what a restarted scheduler needs to continue.

``<run_dir>/scheduler/snap-00000042/`` (42 = the next batch sequence number) holds
``state.json`` (in-flight table, counters, the sampler's small state), ``arrays.safetensors``
(the sampler's per-problem arrays), ``fresh.arrow`` (accepted rollout groups not yet in a
batch), ``replay.arrow`` (the replay buffer's rollouts, as one TrainBatch record) and
``pending.arrow`` (the batch composed with this state, not yet known to be on the topic),
then ``manifest.json``; ``latest`` is written last (prl/storage.py).

The scheduler snapshots *before* publishing the batch and commits its rollout offsets right
after the snapshot. A restart resumes from the snapshot, re-reads exactly the results that
arrived after it, and publishes the pending batch again (same seq, same rollouts: the
learner skips it if it already has it), so no batch is lost and none is composed twice.
"""

from __future__ import annotations

import json

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


def write_snapshot(run_dir: str, seq: int, state: dict, fresh: list[RolloutGroup], replay: list[TrainRollout],
                   pending: TrainBatch | None = None, keep: int = 2) -> str:
    from safetensors.numpy import save

    arrays, rest = split_arrays(state)
    files = {
        "state.json": json.dumps(rest).encode(),
        "arrays.safetensors": save(arrays) if arrays else save({"_": np.zeros(1)}),
        "fresh.arrow": encode_table(to_table(fresh, RolloutGroup)),
        "replay.arrow": encode_table(pa.Table.from_pylist([record_row(r) for r in replay], schema=TrainRollout.SCHEMA)),
        **({"pending.arrow": encode(pending)} if pending is not None else {}),
    }
    return storage.write_versioned(root(run_dir), f"snap-{seq:08d}", files, keep, meta={"seq": seq})


def read_snapshot(run_dir: str, check=None) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None] | None:
    """The newest snapshot that verifies, parses and holds together (``check(state)`` raises
    ValueError where it does not: the scheduler checks its pool's sizes and its sampler's
    state); a torn, tampered or inconsistent one, or a garbage ``latest``, is logged and passed
    over for the one before. None if there is none. One of another configuration raises ConfigError."""
    found = storage.first_readable(storage.candidates(root(run_dir), "snap-"),
                                   lambda uri: read_snapshot_at(uri, check), "snapshot", fatal=(ConfigError,))
    return None if found is None else found[1]


def read_snapshot_at(uri: str, check=None) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None]:
    from safetensors.numpy import load

    rest = json.loads(storage.read_verified(uri, "state.json"))
    arrays = {k: v for k, v in load(storage.read_verified(uri, "arrays.safetensors")).items() if k != "_"}
    fresh = decode_many(storage.read_verified(uri, "fresh.arrow"), RolloutGroup)
    replay = read_replay(storage.read_verified(uri, "replay.arrow"))
    pending = decode(storage.read_verified(uri, "pending.arrow"), TrainBatch) if storage.has_file(uri, "pending.arrow") else None
    state = join_arrays(rest, arrays)
    if check is not None:
        check(state)
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
