"""Offline training batches from archived groups (`prl replay` builds them without a broker)."""

from dataclasses import replace

from prl.cli import replay
from prl.producers.service import rewards_only
from prl.schemas.config import load_config
from tests.support.groups import make_groups


def test_offline_batches_leave_out_groups_archived_as_rewards_only():
    groups = make_groups(12)
    stripped = {g.dispatch_id for g in groups[::3]}  # producer.drop_zero_signal_completions: nothing to train
    groups = [replace(g, rollouts=rewards_only(g.rollouts)) if g.dispatch_id in stripped else g for g in groups]
    batches = list(replay.to_batches(groups, load_config(overrides=["scheduler.groups_per_batch=4", "scheduler.max_in_flight=4"])))
    trained = {r.rollout_id.rsplit("/", 1)[0] for b in batches for r in b.rollouts}
    assert trained == {g.dispatch_id for g in groups} - stripped
    for b in batches:
        b.validate()


def test_a_batch_file_is_written_as_batches_come_and_read_back_in_order(tmp_path):
    """Offline batches go to the learner's file as they are made (a generator) and come back a
    record batch at a time; a file of one multi-row table (as earlier releases wrote) reads too."""
    import pyarrow as pa

    from prl.learner.sources import FileSource, write_batches
    from prl.schemas import TrainBatch, decode
    from prl.schemas.records import encode_table, to_table

    cfg = load_config(overrides=["scheduler.groups_per_batch=4", "scheduler.max_in_flight=4"])
    made = list(replay.to_batches(make_groups(20), cfg))
    assert write_batches(str(tmp_path / "a.arrow"), iter(made)) == len(made) == 5
    (tmp_path / "old.arrow").write_bytes(encode_table(to_table(made, TrainBatch)))
    for name in ("a.arrow", "old.arrow"):
        source = FileSource(str(tmp_path / name))
        read = []
        while (step := source.next(0.0))[0] is not None:
            read.append(decode(step[0].value, TrainBatch))
        source.close()
        assert step == (None, True)
        assert [(b.seq, [r.rollout_id for r in b.rollouts]) for b in read] == [(b.seq, [r.rollout_id for r in b.rollouts]) for b in made]
    assert pa.ipc.open_stream((tmp_path / "a.arrow").read_bytes()).read_all().num_rows == 5


def test_a_file_that_is_not_batches_or_is_cut_short_is_one_line(tmp_path):
    """`prl learner --batches-from` on a file that is not an Arrow stream, or one cut short after
    its first batches, ended in pyarrow's traceback; the batches before the cut are trained."""
    import pytest

    from prl.learner.sources import FileSource, write_batches
    from prl.service import ServiceStopped

    (tmp_path / "garbage.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ServiceStopped, match="garbage.arrow: not a file of TrainBatch records past the first 0"):
        FileSource(str(tmp_path / "garbage.arrow"))
    cfg = load_config(overrides=["scheduler.groups_per_batch=4", "scheduler.max_in_flight=4"])
    write_batches(str(tmp_path / "a.arrow"), replay.to_batches(make_groups(20), cfg))
    whole = (tmp_path / "a.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(whole[: len(whole) * 3 // 4])
    source = FileSource(str(tmp_path / "cut.arrow"))
    read = 0
    with pytest.raises(ServiceStopped, match=r"cut.arrow: not a file of TrainBatch records past the first \d"):
        while source.next(0.0)[0] is not None:
            read += 1
    assert 1 <= read < 5
