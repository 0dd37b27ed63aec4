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


def read_snapshot(run_dir: str) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None] | None:
    """The newest snapshot that verifies and parses (a torn, tampered or unparsable one, or a
    garbage ``latest``, is logged and passed over for the one before); None if there is none."""
    found = storage.first_readable(storage.candidates(root(run_dir), "snap-"), read_snapshot_at, "snapshot")
    return None if found is None else found[1]


def read_snapshot_at(uri: str) -> tuple[dict, list[RolloutGroup], list[TrainRollout], TrainBatch | None]:
    from safetensors.numpy import load

    rest = json.loads(storage.read_verified(uri, "state.json"))
    arrays = {k: v for k, v in load(storage.read_verified(uri, "arrays.safetensors")).items() if k != "_"}
    fresh = decode_many(storage.read_verified(uri, "fresh.arrow"), RolloutGroup)
    replay = read_replay(storage.read_verified(uri, "replay.arrow"))
    pending = decode(storage.read_verified(uri, "pending.arrow"), TrainBatch) if storage.has_file(uri, "pending.arrow") else None
    state = join_arrays(rest, arrays)
    check_state(state)
    return state, fresh, replay, pending


def check_state(state: dict) -> None:
    """A snapshot's scheduler state holds together as written: one entry per problem in every
    per-problem array, one per prior group in every per-group list, and every problem or group
    it names inside the pool; otherwise ValueError naming the field. Checksums catch a torn or
    tampered file, not a writer that wrote the wrong thing; this does, so such a snapshot is
    passed over for the one before (read_snapshot) instead of failing later, mid-run."""
    problems, sized, inside = sampler_fields(state["sampler"])
    if "trained" in state:
        sized["trained"] = (state["trained"], problems)
    inside["in_flight"] = ([entry[0] for entry in state["in_flight"].values()], 0, problems)
    for name, (values, size) in sized.items():
        if len(values) != size:
            raise ValueError(f"scheduler snapshot: {name} has {len(values):,} entries, the sampler {size:,}")
    for name, (values, low, high) in inside.items():
        held = np.asarray(values, dtype=np.int64).ravel()
        outside = held[(held < low) | (held >= high)]
        if outside.size:
            raise ValueError(f"scheduler snapshot: {name} holds {outside[0]}, outside {low}..{high - 1}")


def sampler_fields(sampler: dict) -> tuple[int, dict, dict]:
    """A sampler state's pool size; its fields with their expected lengths; its fields of
    indices with the range ``[low, high)`` they must lie in."""
    kind, problems, groups = sampler_size(sampler)
    if kind == "uniform":
        order = sampler.get("pass_order", [])
        return problems, {"successes": (sampler["successes"], problems)}, {
            "pass_order": (order, 0, problems), "pass_position": ([sampler.get("pass_position", 0)], 0, len(order) + 1)}
    orders = sampler["unseen_order"]
    if sorted(orders, key=int) != [str(g) for g in range(groups)]:
        raise ValueError(f"scheduler snapshot: unseen_order is for groups {sorted(orders, key=int)}, "
                         f"not the {groups} prior groups 0..{groups - 1}")
    heap = len(sampler["heap_keys"])
    sized = {**{f"arrays.{name}": (values, problems) for name, values in sampler["arrays"].items()},
             **{name: (sampler[name], groups) for name in ("group_successes", "group_attempts", "unseen_pos",
                                                           "group_stamp", "unseen_deadline") if name in sampler},
             "heap_stamps": (sampler["heap_stamps"], heap), "heap_problems": (sampler["heap_problems"], heap)}
    inside = {"arrays.group": (sampler["arrays"]["group"], 0, groups),
              "heap_problems": (sampler["heap_problems"], -groups, problems),  # a group's clock is -1 - group
              **{name: (sampler[name], 0, problems) for name in ("solved_pool", "unsolved_pool", "retest_queue")},
              **{f"unseen_order.{g}": (orders[str(g)], 0, problems) for g in range(groups)},
              **{f"unseen_pos.{g}": ([pos], 0, len(orders[str(g)]) + 1)
                 for g, pos in zip(range(groups), sampler["unseen_pos"])}}
    return problems, sized, inside


def read_replay(data: bytes) -> list[TrainRollout]:
    """The replay buffer's rollouts: a table of TrainRollout rows (snapshots written before
    kept them as one TrainBatch record, which still reads)."""
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    if (table.schema.metadata or {}).get(b"kind") == b"train_batch":
        return from_table(table, TrainBatch)[0].rollouts
    return from_table(table, TrainRollout)


def expect_state(state: dict, kind: str, problems: int, groups: int | None = None) -> None:
    """A snapshot's sampler state is for this kind of sampler (``uniform`` or ``priority``),
    pool size and number of prior groups; otherwise ConfigError naming both sides and the fix
    (a run continued, or explained, with another configuration than it was started with)."""
    written = sampler_size(state)
    if written != (kind, problems, groups):
        raise ConfigError(f"the scheduler snapshot holds a {describe(*written)}, this configuration "
                          f"makes a {describe(kind, problems, groups)}: give the run the configuration it was started with "
                          "(scheduler.strategy, scheduler.priority.prior, task), or use a new run directory")


def sampler_size(state: dict) -> tuple[str, int, int | None]:
    """The sampler a state was written by (``priority`` or ``uniform``; older snapshots: by their
    keys), its pool size and its number of prior groups (None for the uniform sampler)."""
    if (state.get("sampler") or ("priority" if "arrays" in state else "uniform")) == "priority":
        return "priority", len(state["arrays"]["group"]), state.get("groups", len(state["unseen_order"]))
    return "uniform", len(state["attempts"]), None


def describe(kind: str, problems: int, groups: int | None) -> str:
    what = "uniform sampler (strategy uniform or dapo_filter)" if kind == "uniform" else "priority sampler"
    return f"{what} of {problems:,} problems" + (f" in {groups} prior group{'s' * (groups != 1)}" if groups is not None else "")
