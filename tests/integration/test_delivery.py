"""At least once through failed publishes, services alive: a publish the broker does not
acknowledge is kept and sent again by the next step, and nothing is committed past it (the
in-memory broker behind a publisher that fails as told; tests/integration/test_faults.py runs
the same over a real broker through a failing network)."""

import pytest

from prl.transport import TransportError
from prl.transport.memory import MemoryBroker, MemoryPublisher, MemoryTransport
from prl.schemas import Dispatch, RolloutGroup, TrainBatch, decode, encode, topic_name
from prl.schemas.topics import BATCHES, PROBLEMS, ROLLOUTS
from tests.integration.test_fencing import rebalance
from tests.integration.test_pipeline import small_config
from tests.support.servers import wait_until


class FailingPublisher(MemoryPublisher):
    """Holds what is published until a flush; ``failures`` flushes in a row fail and keep it
    all (as KafkaPublisher keeps what the broker did not acknowledge)."""

    def __init__(self, broker: MemoryBroker):
        super().__init__(broker)
        self.held: list[tuple] = []
        self.failures = 0

    @property
    def unacknowledged(self) -> int:
        return len(self.held)

    def publish(self, topic, value, *, key=None, headers=()):
        self.held.append((topic, value, key, headers))

    def flush(self, timeout_s=30.0):
        if self.failures:
            self.failures -= 1
            raise TransportError("publish not acknowledged: KafkaTimeoutError")
        for topic, value, key, headers in self.held:
            self.broker.append(topic, value, key, headers)
        self.held = []


def records(broker: MemoryBroker, topic: str, cls) -> list:
    return [decode(m.value, cls) for part in broker.partitions(topic) for m in part]


@pytest.fixture
def pipeline(tmp_path):
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    scheduler, producer = Scheduler(cfg, transport), Producer(cfg, transport)
    return cfg, broker, scheduler, producer


def test_a_producer_commits_no_dispatch_whose_group_the_broker_did_not_take(pipeline):
    cfg, broker, scheduler, producer = pipeline
    scheduler.step()
    dispatched = records(broker, topic_name(cfg.run.name, PROBLEMS), Dispatch)
    producer.publisher = FailingPublisher(broker)
    producer.publisher.failures = 2
    for _ in range(2):  # the broker away for two steps: the service loop tries again
        with pytest.raises(TransportError):
            producer.step()
        assert not broker.committed, "a dispatch was committed while its group was not on the topic"
    producer.step()
    answered = {g.dispatch_id for g in records(broker, topic_name(cfg.run.name, ROLLOUTS), RolloutGroup)}
    assert answered == {d.dispatch_id for d in dispatched}  # every dispatch answered, once: no new ones taken first
    assert sum(broker.committed.values()) == len(dispatched)


def test_a_producer_stopped_in_its_engine_call_publishes_the_call_and_commits_it(pipeline):
    """SIGTERM (a pod scaled down) during a generation call: the call finishes, its groups are
    published and its dispatches committed before the producer exits (the pod's grace period
    is what lets it: deploy/k8s/base/producer.yaml)."""
    import threading

    cfg, broker, scheduler, producer = pipeline
    scheduler.step()
    dispatched = records(broker, topic_name(cfg.run.name, PROBLEMS), Dispatch)
    in_call, generate, stop = threading.Event(), producer.backend.generate, threading.Event()

    def stopped_meanwhile(*args, **kwargs):
        in_call.set()
        assert stop.wait(30)
        return generate(*args, **kwargs)

    producer.backend.generate = stopped_meanwhile
    thread = threading.Thread(target=producer.run, args=(stop,))
    thread.start()
    assert in_call.wait(30)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    answered = {g.dispatch_id for g in records(broker, topic_name(cfg.run.name, ROLLOUTS), RolloutGroup)}
    assert answered == {d.dispatch_id for d in dispatched}
    assert sum(broker.committed.values()) == len(dispatched)


def test_a_producer_stopped_after_a_failed_publish_delivers_and_commits_it(pipeline):
    """Stopped (SIGTERM) while a failed step's groups wait unacknowledged, the producer sends
    them and commits their dispatches before it exits: no other producer generates them again."""
    import threading

    cfg, broker, scheduler, producer = pipeline
    scheduler.step()
    dispatched = records(broker, topic_name(cfg.run.name, PROBLEMS), Dispatch)
    producer.publisher = FailingPublisher(broker)
    producer.publisher.failures = 1
    with pytest.raises(TransportError):
        producer.step()
    stop = threading.Event()
    stop.set()
    producer.run(stop)  # the broker back: stops before its next step
    answered = [g.dispatch_id for g in records(broker, topic_name(cfg.run.name, ROLLOUTS), RolloutGroup)]
    assert sorted(answered) == sorted(d.dispatch_id for d in dispatched)
    assert sum(broker.committed.values()) == len(dispatched)


def test_a_scheduler_stopped_between_batches_uses_the_answers_to_what_it_dispatched(pipeline):
    """Stopped (SIGTERM) after dispatching and before any batch, the scheduler snapshots: the
    next one knows those dispatches and uses their answers (from the snapshot before, or none,
    it ignored them as unknown and dispatched the problems anew)."""
    import threading

    from prl.scheduler.service import Scheduler

    cfg, broker, scheduler, producer = pipeline
    scheduler.step()
    dispatched = records(broker, topic_name(cfg.run.name, PROBLEMS), Dispatch)
    stop = threading.Event()
    stop.set()
    scheduler.run(stop)  # stops before its next step
    producer.step()
    rebalance(broker, f"{cfg.run.name}.scheduler")
    second = Scheduler(cfg, MemoryTransport(broker))
    assert set(second.in_flight) == {d.dispatch_id for d in dispatched}
    second.step()
    assert second.groups_returned == len(dispatched) and not second.counters.get("duplicate_or_unknown_results")


def test_a_batch_the_broker_did_not_take_is_published_again_without_a_restart(pipeline):
    """The flush before the snapshot's commit fails (the batch not sent yet), then the flush
    after the batch was sent: each retried step sends what is missing, and the learner's topic
    gets every batch, in order, once."""
    cfg, broker, scheduler, producer = pipeline
    scheduler.step()
    producer.step()
    scheduler.publisher = FailingPublisher(broker)
    scheduler.publisher.failures = 3
    batches = topic_name(cfg.run.name, BATCHES)
    for _ in range(3):
        with pytest.raises(TransportError):
            scheduler.step()
        assert not records(broker, batches, TrainBatch)
    scheduler.step()
    assert scheduler.next_seq == 2  # both groups of four composed while the broker was away
    assert [b.seq for b in records(broker, batches, TrainBatch)] == [0, 1]


def test_a_late_answer_to_a_timed_out_dispatch_is_used_and_its_reissue_is_not(tmp_path):
    """Every dispatch times out before the producer answers; the producer then answers the old
    dispatches and their reissues: each problem's first answer is used (late or not), the other
    is a duplicate, and no problem's group is taken twice."""
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0, "producer.max_dispatches_per_call": 64})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer = Scheduler(cfg, transport), Producer(cfg, transport)
    scheduler.step()
    first = dict(scheduler.in_flight)
    for flight in first.values():
        flight.issued_at -= 2 * cfg.scheduler.dispatch_timeout_s  # past its timeout
    scheduler.redispatch_timed_out()
    scheduler.flush()
    assert scheduler.counters["redispatched"] == len(first) and not set(first) & set(scheduler.in_flight)
    producer.step()  # answers the old dispatches and the new ones
    scheduler.accept_rollouts()
    taken = [g.problem_id for g in scheduler.fresh]
    assert scheduler.counters["late_results_used"] == len(first)
    assert sorted(taken) == sorted({g.problem_id for g in scheduler.fresh}), "a problem's group taken twice"
    assert scheduler.counters["duplicate_or_unknown_results"] == len(first)


def test_a_problem_nobody_answers_is_retired_after_its_capped_attempts(tmp_path):
    """No producer: each dispatch is issued again with a doubling timeout, MAX_DISPATCH_ATTEMPTS
    times in all; then the problems are retired, and the scheduler stops saying why."""
    from prl.scheduler.service import MAX_DISPATCH_ATTEMPTS, NoProblemsLeft, Scheduler

    cfg = small_config(tmp_path, **{"scheduler.dispatch_timeout_s": 0.001})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)

    def stepped_out():
        try:
            scheduler.step()
        except NoProblemsLeft as exc:
            return str(exc)

    reason = wait_until(stepped_out, 60, "every problem retired")
    assert "TimedOut" in reason and "dispatch_timeout_s" in reason
    retired = scheduler.counters["problems_retired"]
    assert scheduler.counters["dispatched"] == MAX_DISPATCH_ATTEMPTS * retired


def test_bad_batches_are_dead_lettered_without_a_flush_each_and_committed_after_one(tmp_path):
    """The learner dead-letters a flood of bad batch messages at the rate it reads them: no
    flush (a broker round trip) for each; the dead letters reach their topic with the flush of
    its next checkpoint, and only once that is whole are the batch offsets committed past them."""
    from prl.learner.service import Learner
    from prl.schemas import DeadLetter
    from prl.schemas.topics import DEADLETTER
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0, "learner.checkpoint_every": 1})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    learner = Learner(cfg, transport)
    learner.publisher = FailingPublisher(broker)
    flushes = []
    flush = learner.publisher.flush
    learner.publisher.flush = lambda *a, **k: (flushes.append(len(learner.publisher.held)), flush(*a, **k))
    batches = topic_name(cfg.run.name, BATCHES)
    for i in range(50):
        broker.append(batches, b"not a batch %d" % i, b"k", [])
    for _ in range(50):
        learner.step()
    assert flushes == [] and learner.publisher.unacknowledged == 50
    assert not broker.committed, "offsets committed past dead letters not on their topic"
    broker.append(batches, encode(TrainBatch("b0", 0, 0, 0, random_rollouts(8, seed=0))), b"k", [])
    wait_until(lambda: learner.step() or learner.saved_version == 1, 30, "the good batch trained and checkpointed")
    assert len(records(broker, topic_name(cfg.run.name, DEADLETTER), DeadLetter)) == 50
    assert list(broker.committed.values()) == [51]


def learner_on_batches(tmp_path, n: int, **extra):
    """A learner of the run in ``tmp_path`` and ``n`` batches waiting on its batch topic."""
    from prl.learner.service import Learner
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0, "learner.checkpoint_every": 2, **extra})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    for i in range(n):
        broker.append(topic_name(cfg.run.name, BATCHES), encode(TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i))), b"k", [])
    return Learner(cfg, transport), broker, transport


@pytest.fixture
def background_checkpoints(monkeypatch):
    """Checkpoints written in the background on this CPU, as on a GPU."""
    from prl.learner import service

    monkeypatch.setattr(service, "BACKGROUND_DEVICES", ("cpu", "cuda"))


@pytest.fixture
def held_checkpoint_writes(monkeypatch, background_checkpoints):
    """Checkpoint files are written in the background only once the test sets the returned event."""
    import threading

    from prl.learner import checkpoint

    release, write = threading.Event(), checkpoint.write_files
    monkeypatch.setattr(checkpoint, "write_files", lambda *a: release.wait(60) and write(*a))
    yield release
    release.set()  # a thread still holding a write lets go before the test's directory goes


def test_the_learner_trains_on_while_its_checkpoint_is_written_and_commits_once_it_is_whole(tmp_path, held_checkpoint_writes):
    """A checkpoint step copies the state and goes on; until the files are written the latest
    checkpoint and the committed offsets stay where they were; then the checkpoint holds the
    weights of its step (not the steps trained since) and the offsets of the batches it covers."""
    from prl.learner import checkpoint

    learner, broker, _ = learner_on_batches(tmp_path, 4)
    while learner.version < 2:
        learner.step()
    at_two = {k: v.clone() for k, v in learner.policy_tensors().items()}
    learner.step()
    assert learner.version == 3 and learner.checkpointing is not None  # trained on while step 2's files wait
    assert checkpoint.latest_uri(learner.cfg.run.run_dir) is None and not broker.committed
    held_checkpoint_writes.set()
    learner.complete_checkpoint(wait=True)
    assert checkpoint.latest_uri(learner.cfg.run.run_dir).endswith("step-00000002")
    assert list(broker.committed.values()) == [2]  # batches 0 and 1; batch 2 is trained and not yet in a checkpoint
    saved = checkpoint.newest_checkpoint(learner.cfg.run.run_dir)
    assert all((saved.weights[k] == v).all() for k, v in at_two.items())
    assert any((learner.policy_tensors()[k] != v).any() for k, v in at_two.items())
    learner.close()


def test_a_learner_killed_while_writing_a_checkpoint_resumes_from_the_one_before(tmp_path, held_checkpoint_writes):
    """Killed with step 4's files half written, the next learner starts from step 2 and reads
    the batches after it again: none is lost, none trained twice from a checkpoint."""
    from prl.learner.service import Learner

    first, broker, transport = learner_on_batches(tmp_path, 6)
    held_checkpoint_writes.set()
    while first.version < 3:
        first.step()
    first.complete_checkpoint(wait=True)  # step 2's, written meanwhile
    assert first.saved_version == 2 and list(broker.committed.values()) == [2]
    held_checkpoint_writes.clear()
    first.step()  # step 4 starts its checkpoint, whose files are held: then the process is "killed"
    assert first.version == 4 and first.checkpointing is not None
    rebalance(broker, f"{first.cfg.run.name}.learner")
    second = Learner(first.cfg, transport)
    assert second.version == 2
    wait_until(lambda: second.step() or second.version == 3, 30, "the learner trained again from its checkpoint")
    assert second.last_seq == 2


@pytest.mark.parametrize("why", ["a CPU learner", "a host without room for the copy"])
def test_checkpoints_are_written_in_the_step_on_a_cpu_or_without_room(tmp_path, monkeypatch, why):
    from prl.learner import checkpoint, service

    if why != "a CPU learner":
        monkeypatch.setattr(service, "BACKGROUND_DEVICES", ("cpu", "cuda"))
        monkeypatch.setattr(service, "HOST_SHARE_FOR_CHECKPOINTS", 0.0)
    learner, broker, _ = learner_on_batches(tmp_path, 2)
    assert not learner.checkpoints_in_background
    while learner.version < 2:
        learner.step()
    assert checkpoint.latest_uri(learner.cfg.run.run_dir).endswith("step-00000002") and list(broker.committed.values()) == [2]
    learner.close()


def test_a_checkpoint_whose_write_fails_stops_the_learner_and_leaves_the_one_before(tmp_path, monkeypatch,
                                                                                  background_checkpoints):
    """A write that fails in the background (a full disk, storage refusing it) is raised at the
    next step boundary, as it was from the step itself: the latest checkpoint and the committed
    offsets stay those of the checkpoint before, and closing the learner raises nothing more."""
    from prl.learner import checkpoint

    learner, broker, _ = learner_on_batches(tmp_path, 4)
    while learner.version < 2:
        learner.step()
    learner.complete_checkpoint(wait=True)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_files", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        wait_until(lambda: learner.step() and False, 30, "the failed write raised")
    assert learner.version == 4 and checkpoint.latest_uri(learner.cfg.run.run_dir).endswith("step-00000002")
    assert list(broker.committed.values()) == [2]
    learner.close()


@pytest.mark.parametrize("where", ["in the step", "in the background"])
def test_a_learner_stopped_between_checkpoints_checkpoints_its_last_step(tmp_path, monkeypatch, where):
    """Stopped (SIGTERM) three steps past its last checkpoint, the learner checkpoints step 3
    and commits the batches it covers: the next learner goes on from step 3 and trains none of
    them again (it would have trained them again from the base, making versions it cannot announce)."""
    import threading

    from prl.learner import checkpoint, service
    from prl.learner.service import Learner

    if where == "in the background":
        monkeypatch.setattr(service, "BACKGROUND_DEVICES", ("cpu", "cuda"))
    first, broker, transport = learner_on_batches(tmp_path, 3, **{"learner.checkpoint_every": 10})
    assert first.checkpoints_in_background == (where == "in the background")
    stop = threading.Event()
    thread = threading.Thread(target=first.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: first.version == 3, 60, "three steps trained")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and first.saved_version == 3
    assert checkpoint.latest_uri(first.cfg.run.run_dir).endswith("step-00000003")
    assert list(broker.committed.values()) == [3]
    rebalance(broker, f"{first.cfg.run.name}.learner")
    second = Learner(first.cfg, transport)
    assert second.version == 3 and second.last_seq == 2


def test_a_learner_whose_batch_file_ends_between_checkpoints_checkpoints_its_last_step(tmp_path):
    """`prl learner --batches-from` (as `prl replay train` runs it) with fewer batches than
    max_steps: the file's end finishes the learner, and its last step is checkpointed."""
    from prl.learner import checkpoint
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"learner.checkpoint_every": 10, "scheduler.replay.ratio": 0})
    write_batches(str(tmp_path / "a.arrow"), [TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i)) for i in range(3)])
    learner = Learner(cfg, MemoryTransport(), batches_from=str(tmp_path / "a.arrow"))
    wait_until(learner.step, 60, "the batch file's end")
    assert learner.version == 3 and checkpoint.latest_uri(cfg.run.run_dir).endswith("step-00000003")
    learner.close()


def test_a_continued_prl_run_whose_learner_was_killed_between_checkpoints_goes_on(tmp_path):
    """`prl run` killed between checkpoints (Ctrl-C twice, SIGKILL) and continued: its learner
    resumes at its checkpoint (2) while version 3 is in storage, served and known to the
    scheduler, and the batch that made it went with the in-memory broker. The learner numbers on
    from 3: a batch of version-3 rollouts makes version 4, announced. Before, it was dead-lettered
    as from the future (so was every batch after it); and with that allowed, the versions made
    again went unannounced while the scheduler waited for them: the continued run hung."""
    import dataclasses

    from prl.learner.service import Learner
    from prl.schemas import PolicyVersion
    from prl.schemas.topics import POLICY
    from tests.unit.test_grpo import random_rollouts

    first, _, _ = learner_on_batches(tmp_path, 3)
    while first.version < 3:
        first.step()
    first.announce_written(wait=True)  # then killed: no checkpoint of step 3
    broker = MemoryBroker()
    second = Learner(first.cfg, MemoryTransport(broker))
    assert (second.version, second.published) == (2, 3)
    second.pass_over_batches_through(2)
    rollouts = [dataclasses.replace(r, policy_version=3) for r in random_rollouts(8, seed=9)]
    broker.append(topic_name(first.cfg.run.name, BATCHES), encode(TrainBatch("b3", 3, 3, 0, rollouts)), b"k", [])
    wait_until(lambda: second.step() or second.version == 4, 30, "the batch trained")
    second.announce_written(wait=True)
    assert not second.counters.get("dead_lettered/future_rollout") and second.last_seq == 3
    assert [r.version for r in records(broker, topic_name(first.cfg.run.name, POLICY), PolicyVersion)] == [2, 3, 4]  # its own, the newest in storage, its next
    second.close()


def test_a_batch_whose_snapshot_the_store_refused_is_snapshotted_before_it_is_sent(pipeline, monkeypatch):
    """The object store away at the snapshot before a batch: the step fails with nothing sent,
    and the retried step writes the snapshot first (a batch is on storage before it is on the
    topic: a restarted scheduler sends it again, the same), then sends it, once, in order."""
    import prl.scheduler.service as scheduler_module

    cfg, broker, scheduler, producer = pipeline
    batches = topic_name(cfg.run.name, BATCHES)
    real, failures, written = scheduler_module.write_snapshot, [2], []

    def write_snapshot(run_dir, seq, state, fresh, replay, pending=None, logs=None):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionRefusedError(111, "Connect call failed")
        written.append((pending.seq if pending is not None else None, len(records(broker, batches, TrainBatch))))
        return real(run_dir, seq, state, fresh, replay, pending, logs)

    monkeypatch.setattr(scheduler_module, "write_snapshot", write_snapshot)
    scheduler.step()
    producer.step()
    for _ in range(2):
        with pytest.raises(ConnectionRefusedError):
            scheduler.step()
        assert scheduler.outage_of(ConnectionRefusedError()) is scheduler.storage_outage
        assert not records(broker, batches, TrainBatch)
    scheduler.step()
    assert written[0] == (0, 0)  # batch 0's snapshot written while the topic held no batch
    assert [b.seq for b in records(broker, batches, TrainBatch)] == [0, 1]
    assert [seq for seq, _ in written] == [0, 1]  # and batch 1's before it was sent


def test_an_announcement_whose_check_met_the_store_away_is_followed_by_the_retried_step(pipeline, monkeypatch):
    """Checking an announcement reads the run's epochs on the object store. With the store away
    the step fails; the announcement, already polled, is followed by the retried step (before,
    it was lost: the scheduler waited for the learner, the learner for its next batch)."""
    from prl.schemas.topics import POLICY

    cfg, broker, scheduler, producer = pipeline
    followed, failures = [], [1]

    def follow(msg):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionRefusedError(111, "Connect call failed")
        followed.append(msg.value)

    monkeypatch.setattr(scheduler, "follow", follow)
    publisher = MemoryTransport(broker).publisher()
    for value in (b"first", b"second"):
        publisher.publish(topic_name(cfg.run.name, POLICY), value)
    publisher.flush()
    with pytest.raises(ConnectionRefusedError):
        scheduler.read_policy()
    scheduler.read_policy()
    assert followed == [b"first", b"second"]
