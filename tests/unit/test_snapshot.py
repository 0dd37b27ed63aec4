"""What a scheduler snapshot holds as segments (the pending batch, the fresh groups): each
record written once, named by segment and row, and restored as it was."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from prl import storage
from prl.scheduler.snapshot import Logs, batch_from, batch_header, read_snapshot, root, split_arrays, write_snapshot
from prl.schemas import RolloutGroup, TrainBatch, TrainRollout, encode
from prl.schemas.records import encode_table, to_table
from tests.support.groups import make_groups

TOKENS = 500


def rollouts(start: int, n: int) -> list[TrainRollout]:
    rng = np.random.default_rng(start)
    return [TrainRollout(f"d{start + i}/0", "p", 3, False, 0.5 - i % 2, 1.0, 1.0, np.arange(8, dtype=np.int32),
                         rng.integers(0, 1000, TOKENS, dtype=np.int32), -rng.exponential(1.0, TOKENS).astype(np.float32))
            for i in range(n)]


def state(seq: int) -> dict:
    return {"next_seq": seq, "trained": np.zeros(10, np.uint8), "in_flight": {}}


def batch_of(seq: int, fresh: list[TrainRollout], replayed: list[TrainRollout]) -> TrainBatch:
    drawn = [dataclasses.replace(r, is_replay=True, sample_weight=0.25) for r in replayed]
    return TrainBatch(f"b{seq}", seq, seq + 1, 100 * seq, fresh + drawn, 1765000000.125)


def snapshot_bytes(run_dir: str, seq: int) -> int:
    return sum(p.stat().st_size for p in Path(root(run_dir), f"snap-{seq:08d}").iterdir())


def test_a_pending_batch_is_named_by_segment_and_row_and_restored_as_it_was(tmp_path):
    run_dir = str(tmp_path / "run")
    buffer, logs = rollouts(0, 40), Logs.at(run_dir)
    write_snapshot(run_dir, 1, state(1), [], buffer, None, logs)
    fresh = rollouts(100, 16)
    buffer += fresh  # the composition put the batch's fresh rollouts in the buffer
    pending = batch_of(2, fresh, buffer[5:13])
    segments = set(Path(run_dir, "scheduler", "replay").iterdir())
    write_snapshot(run_dir, 2, state(2), [], buffer, pending, logs)

    new = set(Path(run_dir, "scheduler", "replay").iterdir()) - segments
    assert len(new) == 1  # one segment: the fresh rollouts, written once for the buffer and the batch
    assert list(new)[0].stat().st_size < len(encode(pending))
    assert snapshot_bytes(run_dir, 2) < len(encode(pending)) / 10  # the batch's tokens are not in the snapshot
    _, _, restored_buffer, restored = read_snapshot(run_dir, logs=Logs.at(run_dir))
    assert encode(restored) == encode(pending)
    assert [r.rollout_id for r in restored_buffer] == [r.rollout_id for r in buffer]
    assert not any(r.is_replay for r in restored_buffer)  # what the batch adds stays with the batch


def test_a_pending_batch_without_a_replay_buffer_is_written_once_and_restored(tmp_path):
    run_dir = str(tmp_path / "run")
    pending = batch_of(1, rollouts(0, 8), [])
    write_snapshot(run_dir, 1, state(1), [], [], pending)
    _, _, restored_buffer, restored = read_snapshot(run_dir)
    assert restored_buffer == [] and encode(restored) == encode(pending)


def test_a_pending_batch_whose_header_does_not_match_its_rollouts_is_refused():
    """A snapshot's files verify against their checksums; a writer that wrote the wrong thing
    is caught here, and the snapshot passed over for the one before (storage.first_readable)."""
    pending = batch_of(1, rollouts(0, 8), [])
    with pytest.raises(ValueError, match="names 7 rollouts, its header 8, 8, 8 values"):
        batch_from(batch_header(pending), pending.rollouts[:-1])


def test_fresh_groups_are_written_once_and_restored_in_order(tmp_path):
    run_dir, groups = str(tmp_path / "run"), make_groups(12)
    logs = Logs.at(run_dir)
    write_snapshot(run_dir, 1, state(1), groups[:8], [], None, logs)
    written = set(Path(root(run_dir), "fresh").iterdir())
    write_snapshot(run_dir, 2, state(2), groups[4:], [], None, logs)  # a batch took 4, 4 arrived
    new = set(Path(root(run_dir), "fresh").iterdir()) - written
    assert len(new) == 1 and pa.ipc.open_stream(list(new)[0].read_bytes()).read_all().num_rows == 4
    fresh = read_snapshot(run_dir)[1]
    assert [encode(g) for g in fresh] == [encode(g) for g in groups[4:]]


def test_a_snapshot_that_holds_its_fresh_groups_and_pending_batch_whole_still_restores(tmp_path):
    """Written before 2026-12-06: fresh.arrow and pending.arrow, no segments for either."""
    from safetensors.numpy import save

    run_dir, groups, pending = str(tmp_path / "run"), make_groups(3), batch_of(1, rollouts(0, 8), [])
    empty = {"segments": [], "checksums": [], "segment": np.zeros(0, np.int32), "row": np.zeros(0, np.int32)}
    arrays, rest = split_arrays({**state(1), "replay_log": empty})
    files = {"state.json": json.dumps(rest).encode(), "arrays.safetensors": save(arrays),
             "fresh.arrow": encode_table(to_table(groups, RolloutGroup)), "pending.arrow": encode(pending)}
    storage.write_versioned(root(run_dir), "snap-00000001", files, 2, meta={"seq": 1})
    _, fresh, _, restored = read_snapshot(run_dir)
    assert [encode(g) for g in fresh] == [encode(g) for g in groups] and encode(restored) == encode(pending)


def test_restoring_keeps_the_pending_batch_s_segments_until_two_snapshots_no_longer_name_them(tmp_path):
    run_dir, seq = str(tmp_path / "run"), 1
    write_snapshot(run_dir, seq, state(seq), [], [], batch_of(seq, rollouts(0, 8), []))
    logs = Logs.at(run_dir)
    read_snapshot(run_dir, logs=logs)
    segment_dir = Path(run_dir, "scheduler", "replay")
    first = set(segment_dir.iterdir())
    write_snapshot(run_dir, seq + 1, state(seq + 1), [], [], None, logs)
    assert first <= set(segment_dir.iterdir())  # the snapshot before still names them
    write_snapshot(run_dir, seq + 2, state(seq + 2), [], [], None, logs)
    assert not first & set(segment_dir.iterdir())


def test_segments_a_restored_snapshot_does_not_name_are_deleted_two_snapshots_later(tmp_path):
    """A restarted scheduler knows the segments its snapshot names; those of the snapshot
    before, and one a scheduler killed mid-snapshot left, would stay forever otherwise."""
    run_dir, groups = str(tmp_path / "run"), make_groups(12)
    fresh_dir = Path(root(run_dir), "fresh")
    write_snapshot(run_dir, 1, state(1), groups[:4], [], None, Logs.at(run_dir))
    earlier = set(fresh_dir.iterdir())
    write_snapshot(run_dir, 2, state(2), groups[4:8], [], None, Logs.at(run_dir))  # the killed scheduler's last
    orphan = fresh_dir / "seg-00000003-0badf00d.arrow"
    orphan.write_bytes(b"written before the kill")
    logs = Logs.at(run_dir)
    assert [g.dispatch_id for g in read_snapshot(run_dir, logs=logs)[1]] == [g.dispatch_id for g in groups[4:8]]
    write_snapshot(run_dir, 3, state(3), groups[8:], [], None, logs)
    assert earlier | {orphan} <= set(fresh_dir.iterdir())  # the snapshot before this one may still be read
    write_snapshot(run_dir, 4, state(4), groups[8:], [], None, logs)
    assert not (earlier | {orphan}) & set(fresh_dir.iterdir())
    assert [g.dispatch_id for g in read_snapshot(run_dir)[1]] == [g.dispatch_id for g in groups[8:]]
