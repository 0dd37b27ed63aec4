"""Faults over a real broker and a real S3 server: scheduler, two producers and learner run as
`prl` processes with checkpoints and snapshots on S3; each service is killed with SIGKILL in
turn, or stopped with SIGTERM in turn (then nothing is done twice); separately, the broker is
killed and restarted on its S3 storage, the network between every service and the broker
fails for a while, and hostile messages are written to the policy and batch topics while the
run trains. Then:

- no dispatched problem was lost: each dispatch was answered, dispatched again later, or is
  in flight in the scheduler's last snapshot;
- no fresh rollout was trained twice, none more than tau_max versions old;
- the learner's steps are contiguous across restarts (each restart continues at the step after
  its checkpoint) and its batches come in increasing sequence order.
"""

import time
from collections import Counter

import fsspec
import pytest

from prl.schemas import PolicyVersion, RolloutGroup, TrainBatch, TrainRollout
from prl.schemas.topics import BATCHES, POLICY, ROLLOUTS, topic_name
from tests.support.cluster import (CHECKPOINT_EVERY, CREDENTIALS, MAX_STEPS, SERVICES, Cluster, check_invariants, dead_letters,
                                   inject, network_fault_run, read_topic, storage_fault_run)
from tests.support.servers import KafkaBroker, S3Server, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def s3(monkeypatch, tmp_path):
    """The services' S3 server (checkpoints, snapshots); its env is set for this process and
    inherited by the services."""
    server = S3Server(log_path=tmp_path / "s3.log")
    server.create_bucket("prl-runs")
    for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()  # a cached client would still point at an earlier server
    yield server
    server.stop()


@pytest.fixture
def broker_s3(tmp_path):
    """A second S3 server for the broker's storage (the broker writes to it on every commit,
    so it gets a server of its own); returns the broker's environment."""
    server = S3Server(log_path=tmp_path / "s3-broker.log")
    server.create_bucket("prl-broker")
    yield {**CREDENTIALS, "AWS_ENDPOINT": server.endpoint, "AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true"}
    server.stop()


def test_kill_9_each_service_in_turn(s3, tmp_path, run_name):
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        step = 2
        cluster.wait_for_step(step)
        for name in SERVICES:
            if name == "learner":  # between a published version and the next checkpoint
                wait_until(lambda: cluster.step() % CHECKPOINT_EVERY, 60, "a version past a checkpoint", 0.05)
            cluster.kill(name)
            cluster.start(name)
            step += 3
            cluster.wait_for_step(min(step, MAX_STEPS))
        cluster.finish()
        figures = check_invariants(cluster)
        retrained = [ln for ln in cluster.logs("learner")[1] if ln.get("event") == "step" and ln["step"] <= figures["killed_at"]]
        assert retrained, "the restarted learner trained again what its checkpoint lacked"
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\nkill -9: {figures}")


def test_a_rolling_restart_by_sigterm_does_nothing_twice(s3, tmp_path, run_name):
    """Each service stopped with SIGTERM (a rollout, a drained node) and started again in turn:
    the invariants hold as after kill -9, and no work is done again: the scheduler's successor
    knows what it dispatched (it ignores no answer as unknown), and the learner's resumes at
    the step it stopped after, not at its checkpoint before (it trains no step again).

    At the default dispatch timeout (120 s): the other tests' 20 s, for work lost with a killed
    service, was shorter than two producers' restarts in a loaded CI run (40 s each); the
    dispatches they left unanswered were issued again, and answered twice, as they should be."""
    from prl.scheduler.snapshot import read_snapshot

    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name, max_steps=MAX_STEPS + 6,  # the learner is stopped last
                      dispatch_timeout_s=120)
    try:
        cluster.start_all()
        step = 2
        cluster.wait_for_step(step)
        for name in SERVICES:
            if name == "learner":  # the step it finishes when stopped is not a checkpoint's
                wait_until(lambda: cluster.step() % CHECKPOINT_EVERY == 1, 60, "a version past a checkpoint", 0.05)
            cluster.stop(name)
            cluster.start(name)
            step += 3
            cluster.wait_for_step(step)
        cluster.finish()
        figures = check_invariants(cluster)
    finally:
        cluster.stop_all()
        broker.stop()
    stopped_at = figures["killed_at"]
    assert stopped_at % CHECKPOINT_EVERY, "the learner was stopped at a checkpoint: nothing shown"
    assert [ln["version"] for ln in cluster.logs("learner")[1] if ln.get("event") == "resumed"] == [stopped_at]
    assert min(ln["step"] for ln in cluster.logs("learner")[1] if ln.get("event") == "step") == stopped_at + 1
    assert not read_snapshot(cluster.run_dir)[0]["counters"].get("duplicate_or_unknown_results")
    print(f"\nSIGTERM: {figures}")


def test_the_pipeline_goes_on_by_itself_after_the_network_fails_for_30_s(s3, tmp_path, run_name):
    """Every connection to the broker reset every 2-7 s and new ones refused for 1-3 s after
    each reset, for 30 s, services never killed (`prl bench faults` runs this longer and more
    often): within 30 s of the network healing the learner steps again, and the run finishes by
    itself with nothing lost, trained twice or skipped. Before the publisher kept what the
    broker had not acknowledged, 1 of 4 such runs stopped for good: a scheduler whose batch
    publish failed had already moved past it, and the learner waited for it."""
    fault_s = 30
    run = network_fault_run(tmp_path, run_name, fault_s, max_steps=2 + 4 * fault_s, seed=0)
    assert run["resets"] >= 4 and run["refusals"] >= 4
    assert run["measured"], "the run finished before the network healed: nothing was measured"
    assert run["recovery_s"] is not None and run["recovery_s"] <= 30, run
    print(f"\nnetwork faults: {run}")


def test_the_pipeline_rides_out_30_s_without_its_object_store(s3, tmp_path, run_name):
    """Every connection to the S3 server (checkpoints, policy versions, snapshots, archive) reset
    and new ones refused for 30 s, services never killed: the run finishes by itself with
    nothing lost, trained twice or skipped. Before, a service whose request outlasted s3fs's own
    retries stopped (the scheduler exited 2: "Could not connect to the endpoint URL")."""
    fsspec.filesystem("s3").clear_instance_cache()
    run = storage_fault_run(tmp_path, int(s3.endpoint.rsplit(":", 1)[1]), run_name, fault_s=30, max_steps=30)
    assert run["recovery_s"] is not None and run["recovery_s"] <= 30, run
    assert sum(run["storage_errors"].values()) > 0, f"no service met the outage: nothing shown {run}"
    print(f"\nobject store faults: {run}")


def test_a_policy_hijack_is_refused_end_to_end(s3, tmp_path, run_name):
    """PolicyVersions with a huge version and versions outside the run (another directory,
    an http:// URI) while the run trains: producers and scheduler dead-letter them, no rollout
    is made by a version the learner did not make, the learner steps on; a producer restarted
    afterwards (the policy topic keeps the messages) refuses them again and serves."""
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        cluster.wait_for_step(2)
        forged = dict(kind="full", weights_checksum="crc32c:00000000")
        inject(cluster, POLICY, PolicyVersion(10**9, f"file://{tmp_path}/elsewhere/v-{10**9:08d}", 10**9, time.time(), **forged))
        inject(cluster, POLICY, PolicyVersion(10**9, "http://evil.example/v-1000000000", 10**9, time.time(), **forged))
        # Both producers have refused both before producer-1 is killed (training can be fast
        # enough to reach step 5 before they read the announcements).
        def refused_both(name: str) -> bool:
            return cluster.logged(name, '"event": "dead_lettered"', '"reason": "version_outside_run"') >= 2

        wait_until(lambda: refused_both("producer-0") and refused_both("producer-1"), 120, "both producers to refuse both", 0.2)
        cluster.wait_for_step(5)
        cluster.kill("producer-1")
        cluster.start("producer-1")
        cluster.finish()
        figures = check_invariants(cluster)
        groups = read_topic(broker.bootstrap, topic_name(run_name, ROLLOUTS), RolloutGroup)
        assert max(g.policy_version for g in groups) <= MAX_STEPS
        reasons = Counter((d.service, d.reason) for d in dead_letters(cluster) if d.source_topic.endswith(".policy"))
        assert reasons[("producer", "version_outside_run")] >= 2 * 3  # two messages, three producer starts
        assert reasons[("scheduler", "implausible_policy")] == 2
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\npolicy hijack: {figures}, dead letters {dict(reasons)}")


def test_a_batch_far_ahead_does_not_stall_the_learner(s3, tmp_path, run_name):
    """A TrainBatch with seq 2^31-1 is dead-lettered (outside the learner's window) instead of
    trained: the learner keeps taking the scheduler's batches in order, and the scheduler,
    which follows only plausible announcements, never runs more than max_batches_ahead ahead."""
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        cluster.wait_for_step(2)
        rollout = TrainRollout("evil/0", "add1:1+1", 0, False, 1.0, 1.0, 1.0, [1, 4, 14, 4, 15], [5, 2], [-0.1, -0.1])
        inject(cluster, BATCHES, TrainBatch("evil", 2**31 - 1, 0, 1, [rollout], time.time()))
        cluster.finish()
        figures = check_invariants(cluster)
        batches = read_topic(broker.bootstrap, topic_name(run_name, BATCHES), TrainBatch)
        assert len([b for b in batches if b.batch_id != "evil"]) <= MAX_STEPS + 2 + 1  # max_batches_ahead = 2
        assert [(d.service, d.reason) for d in dead_letters(cluster)] == [("learner", "outside_window")]
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\nbatch far ahead: {figures}")


def test_a_broker_restart_loses_nothing_and_new_producers_join_after_a_clean_stop(s3, broker_s3, tmp_path, run_name):
    """The broker is killed and restarts on its storage mid-run: the run finishes with nothing
    lost or trained twice and every service stops cleanly; then the run is continued with a
    producer that never ran before: it must be given dispatches by the existing group and the
    learner must go on stepping. (It stalled in 6 of 11 runs while members sent LeaveGroup: the
    two producers stop together, one leaves during the rebalance the other's leave started, and
    tansu keeps it as the group's leader; the tests' config sets
    transport.kafka.leave_group_on_close = false.)"""
    broker = KafkaBroker(storage="s3://prl-broker/", env=broker_s3, log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        cluster.wait_for_step(3)
        broker = cluster.kill_and_restart_broker(broker_s3)
        cluster.finish()  # every service exits cleanly at the last step
        figures = check_invariants(cluster)
        more = f"learner.max_steps={MAX_STEPS + 4}"
        for name in ("scheduler", "learner", "producer-2"):
            cluster.start(name, more)
        cluster.wait_for_step(MAX_STEPS + 4, timeout_s=240)
        groups = read_topic(broker.bootstrap, topic_name(run_name, ROLLOUTS), RolloutGroup)
        assert any(g.producer_id == "producer-2" for g in groups)
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\nbroker restart: {figures}")


def test_claim_check_batches_survive_kill_9_of_the_learner(s3, tmp_path, run_name):
    """Claim-check batches (references to the rollout messages): the learner is killed with
    SIGKILL twice and restarted; it resumes from its checkpoint, fetches what the references
    name, and trains every batch once in order and no fresh rollout twice."""
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name, claim_check=True)
    try:
        cluster.start_all()
        for step in (3, 7):
            cluster.wait_for_step(step)
            wait_until(lambda: cluster.checkpointed() >= CHECKPOINT_EVERY, 60, "a checkpoint to resume from", 0.05)
            cluster.kill("learner")
            cluster.start("learner")
        cluster.finish()
        figures = check_invariants(cluster)
        kinds = {type(b).__name__ for b in read_topic(broker.bootstrap, topic_name(run_name, BATCHES), None)}
        assert kinds == {"TrainBatchRefs"}
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\nclaim-check, learner kill -9 twice: {figures}")
