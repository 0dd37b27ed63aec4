"""Scheduler snapshots that scale and restore: a snapshot writes the replay buffer's new
rollouts only, and a scheduler killed at any point of its snapshot-and-publish cycle resumes
from storage with every batch published once (a batch sent again is the same batch), none
skipped, and its replay buffer whole."""

import fsspec
import pyarrow as pa
import pytest

from prl import storage
from prl.scheduler import snapshot
from prl.scheduler.service import Scheduler
from prl.schemas import PolicyVersion, TrainBatch, decode, encode, topic_name
from prl.schemas.topics import BATCHES, POLICY
from prl.transport.memory import MemoryBroker, MemoryTransport
from tests.integration.test_pipeline import small_config
from tests.support.servers import wait_until


class Crash(BaseException):
    """kill -9 at this point: nothing after it runs, nothing is cleaned up."""


class Learner:
    """Stands in for the learner: takes batches in order and announces a version for each."""

    def __init__(self, cfg, transport):
        self.cfg, self.transport = cfg, transport
        self.batches = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group="learner")
        self.publisher, self.version, self.last_seq, self.seen = transport.publisher(), 0, -1, {}

    def step(self) -> None:
        for msg in self.batches.poll(0.0):
            batch = decode(msg.value, TrainBatch)
            assert self.seen.setdefault(batch.seq, batch.batch_id) == batch.batch_id, f"seq {batch.seq} composed twice"
            if batch.seq == self.last_seq + 1:
                self.version, self.last_seq = self.version + 1, batch.seq
                record = PolicyVersion(self.version, "", batch.seq)
                self.publisher.publish(topic_name(self.cfg.run.name, POLICY), encode(record))
            assert batch.seq <= self.last_seq, f"batch {batch.seq} after {self.last_seq}: one skipped"


def run_until(scheduler, producer, learner, seq: int) -> None:
    def reached():
        scheduler.step()
        producer.step()
        learner.step()
        return learner.last_seq >= seq

    wait_until(reached, 120, f"batch {seq} trained")


POINTS = {
    "segment written": (snapshot.storage, "write_versioned"),
    "snapshot complete, segments not pruned": (snapshot.SegmentLog, "prune"),
    "offsets not committed": (Scheduler, "deliver"),
    "batch not sent": (Scheduler, "publish_batch"),
    "batch sent, not acknowledged": (Scheduler, "flush"),
}


@pytest.mark.parametrize("point", POINTS)
def test_a_scheduler_killed_at_any_point_of_its_cycle_resumes_consistently(tmp_path, monkeypatch, point):
    from prl.producers.service import Producer

    cfg = small_config(tmp_path, **{"scheduler.replay.warmup_updates": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer, learner = Scheduler(cfg, transport), Producer(cfg, transport), Learner(cfg, transport)
    run_until(scheduler, producer, learner, 3)
    assert len(scheduler.replay) > 0
    owner, name = POINTS[point]
    with monkeypatch.context() as m:
        m.setattr(owner, name, lambda *a, **k: (_ for _ in ()).throw(Crash()))
        with pytest.raises(Crash):
            run_until(scheduler, producer, learner, 10**9)
    killed_at = scheduler.next_seq
    restarted = Scheduler(cfg, transport)  # the dead one is dropped as it is: no close, no flush
    assert restarted.next_seq in (killed_at - 1, killed_at)
    assert len(restarted.replay) > 0
    run_until(restarted, producer, learner, killed_at + 3)
    assert sorted(learner.seen) == list(range(max(learner.seen) + 1))


def test_a_snapshot_writes_the_new_rollouts_of_the_replay_buffer_not_all_of_it(tmp_path):
    from prl.producers.service import Producer

    cfg = small_config(tmp_path, **{"scheduler.replay.warmup_updates": 0, "scheduler.tau_max": 1000})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer, learner = Scheduler(cfg, transport), Producer(cfg, transport), Learner(cfg, transport)
    run_until(scheduler, producer, learner, 8)
    fs, path = fsspec.core.url_to_fs(snapshot.root(cfg.run.run_dir) + "/replay")
    segments = {p.rsplit("/", 1)[-1]: fs.size(p) for p in fs.ls(path, detail=False)}
    newest = max(segments)
    fresh_rollouts = cfg.scheduler.groups_per_batch * cfg.sampling.group_size
    assert pa.ipc.open_stream(fs.cat_file(f"{path}/{newest}")).read_all().num_rows <= fresh_rollouts  # one batch's fresh rollouts
    assert len(scheduler.replay) > 2 * fresh_rollouts  # ...while the buffer holds far more
    kept = storage.list_versions(snapshot.root(cfg.run.run_dir), "snap-")
    assert len(kept) == snapshot.KEEP


def test_the_snapshot_at_the_end_of_a_run_leaves_the_one_before_whole(tmp_path):
    """The last snapshot comes with no batch since the one before: it takes the next number
    instead of writing that one's directory again (which pruned the segments of the one before
    it and left no whole snapshot to fall back on if the rewrite tore). Every kept snapshot
    restores on its own, and the run continues past both."""
    from prl.producers.service import Producer

    cfg = small_config(tmp_path, **{"scheduler.replay.warmup_updates": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer, learner = Scheduler(cfg, transport), Producer(cfg, transport), Learner(cfg, transport)
    run_until(scheduler, producer, learner, 3)
    producer.step()  # groups arrive after the last batch's snapshot: the last snapshot holds them
    scheduler.ask_to_finish()
    wait_until(scheduler.step, 30, "the scheduler to finish")
    kept = storage.list_versions(snapshot.root(cfg.run.run_dir), "snap-")
    assert kept == [f"snap-{scheduler.next_seq:08d}", f"snap-{scheduler.next_seq + 1:08d}"]
    for name in kept:
        state = snapshot.read_snapshot_at(f"{snapshot.root(cfg.run.run_dir)}/{name}", None, snapshot.Logs.at(cfg.run.run_dir))[0]
        assert state["next_seq"] == scheduler.next_seq
    restarted = Scheduler(cfg, transport)
    assert restarted.next_seq == scheduler.next_seq
    run_until(restarted, producer, learner, scheduler.next_seq + 2)
    assert storage.list_versions(snapshot.root(cfg.run.run_dir), "snap-")[-1] == f"snap-{restarted.next_seq + 1:08d}"
