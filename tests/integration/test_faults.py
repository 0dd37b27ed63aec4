"""Faults over a real broker and a real S3 server: scheduler, two producers and learner run as
`prl` processes with checkpoints and snapshots on S3; each service is killed with SIGKILL in
turn (and, separately, the broker is killed and restarted on its S3 storage; and hostile
messages are written to the policy and batch topics while the run trains). Then:

- no dispatched problem was lost: each dispatch was answered, dispatched again later, or is
  in flight in the scheduler's last snapshot;
- no fresh rollout was trained twice, none more than tau_max versions old;
- the learner's steps are contiguous across restarts (each restart continues at the step after
  its checkpoint) and its batches come in increasing sequence order.
"""

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import fsspec
import pytest

from prl import storage
from prl.formulas import rollout_age
from prl.learner import checkpoint
from prl.transport.kafka import KafkaTransport
from prl.trust import policy_root
from prl.scheduler.snapshot import read_snapshot
from prl.schemas import DeadLetter, Dispatch, PolicyVersion, RolloutGroup, TrainBatch, TrainRollout, decode, encode, headers
from prl.schemas.config import KafkaConfig
from prl.schemas.topics import BATCHES, DEADLETTER, POLICY, PROBLEMS, ROLLOUTS, topic_name
from tests.support.servers import KafkaBroker, Process, S3Server, wait_until, write_kafka_config

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MAX_STEPS = 14
CHECKPOINT_EVERY = 3  # a killed learner has usually published versions its last checkpoint lacks
TAU_MAX = 10
SERVICES = ("scheduler", "producer-0", "producer-1", "learner")


CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


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


class Cluster:
    """The four services as processes, each restartable; logs as <name>.<start>.log."""

    def __init__(self, tmp_path: Path, broker: KafkaBroker, run_name: str, **scheduler):
        self.dir = tmp_path
        self.run_dir = f"s3://prl-runs/{run_name}"
        self.run_name = run_name
        self.broker = broker
        self.config = tmp_path / "config.toml"
        write_kafka_config(self.config, broker.bootstrap, run_name, self.run_dir,
                           scheduler={"tau_max": TAU_MAX, "dispatch_timeout_s": 20,
                                      "replay": {"warmup_updates": 4}, **scheduler},
                           learner={"max_steps": MAX_STEPS, "checkpoint_every": CHECKPOINT_EVERY})
        self.procs: dict[str, Process] = {}
        self.starts: Counter = Counter()

    def start(self, name: str, *overrides: str) -> None:
        service, _, index = name.partition("-")
        extra = (["--id", name] if index else []) + [a for o in overrides for a in ("--set", o)]
        log = self.dir / f"{name}.{self.starts[name]}.log"
        self.starts[name] += 1
        self.procs[name] = Process([sys.executable, "-m", "prl.cli", service, "--config", str(self.config), *extra],
                                   log_path=log)

    def start_all(self) -> None:
        for name in SERVICES:
            self.start(name)

    def kill_and_restart_broker(self, env: dict) -> KafkaBroker:
        """SIGKILL the broker, start it again on the same port and its S3 storage."""
        self.broker.stop(signal.SIGKILL)
        self.broker = KafkaBroker(storage="s3://prl-broker/", env=env, port=self.broker.port,
                                  log_path=self.dir / "broker.1.log")
        return self.broker

    def kill(self, name: str) -> None:
        self.procs[name].stop(signal.SIGKILL)

    def step(self) -> int:
        """The newest policy version the learner has published."""
        latest = storage.read_latest(policy_root(self.run_dir))
        return latest["version"] if latest else 0

    def checkpointed(self) -> int:
        """The step of the learner's newest checkpoint (0 before the first)."""
        latest = checkpoint.read_latest(self.run_dir)
        return latest["step"] if latest else 0

    def wait_for_step(self, step: int, timeout_s: float = 300) -> None:
        def reached():
            for name, p in self.procs.items():
                assert p.proc.poll() is None or name == "learner", f"{name} exited:\n{self.tail(name)}"
            return self.step() >= step
        wait_until(reached, timeout_s, f"learner step {step}", 0.5)

    def finish(self) -> None:
        """The learner reaches max_steps; the scheduler and producers see it and exit 0 on
        their own, nobody is signalled."""
        wait_until(lambda: self.procs["learner"].proc.poll() is not None, 300, "the learner to finish", 0.5)
        wait_until(lambda: all(p.proc.poll() is not None for p in self.procs.values()), 120,
                   "the scheduler and producers to finish after the learner", 0.5)
        for name, p in self.procs.items():
            assert p.proc.returncode == 0, f"{name}:\n{self.tail(name)}"
        self.procs.clear()  # all exited; a continuation starts its own

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.stop(signal.SIGKILL)

    def logs(self, name: str) -> list[list[dict]]:
        """JSON log lines of each start of ``name``, in order."""
        out = []
        for i in range(self.starts[name]):
            lines = (self.dir / f"{name}.{i}.log").read_text().splitlines()
            out.append([json.loads(line) for line in lines if line.startswith("{")])
        return out

    def logged(self, name: str, *fragments: str) -> int:
        """Lines of the current start's log of ``name`` that hold every fragment (the log is read
        as the service writes it, so a line is matched by its text, not parsed)."""
        path = self.dir / f"{name}.{self.starts[name] - 1}.log"
        return sum(all(f in line for f in fragments) for line in path.read_text().splitlines()) if path.exists() else 0

    def tail(self, name: str) -> str:
        return (self.dir / f"{name}.{self.starts[name] - 1}.log").read_text()[-3000:]


def as_batch(record, groups) -> TrainBatch:
    """A TrainBatch, or a claim-check batch resolved against the rollout groups read."""
    if isinstance(record, TrainBatch):
        return record
    by_dispatch = {g.dispatch_id: g for g in groups}
    rollouts = []
    for ref in record.refs:
        g = by_dispatch[ref.rollout_id.rsplit("/", 1)[0]]
        r = g.rollouts[ref.index]
        rollouts.append(TrainRollout(ref.rollout_id, g.problem_id, g.policy_version, ref.is_replay, ref.advantage, r.reward,
                                     g.temperature, g.prompt_ids, r.completion_ids, r.logprobs))
    return TrainBatch(record.batch_id, record.seq, record.learner_version, record.rollouts_generated, rollouts)


def read_topic(bootstrap: str, topic: str, cls) -> list:
    """Every record on ``topic`` (the services have stopped: an idle poll means the end)."""
    transport = KafkaTransport(KafkaConfig(bootstrap_servers=bootstrap))
    sub = transport.subscriber([topic], group=None)
    msgs = []
    try:
        while batch := sub.poll(3.0, max_records=5000):
            msgs += batch
    finally:
        sub.close()
    return [decode(m.value, cls) for m in msgs]


def check_invariants(cluster: Cluster) -> dict:
    name = cluster.run_name
    dispatches = read_topic(cluster.broker.bootstrap, topic_name(name, PROBLEMS), Dispatch)
    groups = read_topic(cluster.broker.bootstrap, topic_name(name, ROLLOUTS), RolloutGroup)
    batches = [as_batch(b, groups) for b in read_topic(cluster.broker.bootstrap, topic_name(name, BATCHES), None)]
    assert_no_dispatch_lost(dispatches, groups, set(read_snapshot(cluster.run_dir)[0]["in_flight"]))
    lineage = learner_lineage(cluster)
    trained = assert_lineage_trains_each_batch_once(lineage, {b.batch_id: b for b in batches})
    policy = read_topic(cluster.broker.bootstrap, topic_name(name, POLICY), PolicyVersion)
    announced = assert_each_version_named_once([r for r in policy if r.uri.startswith(policy_root(cluster.run_dir))], groups)
    return {"dispatches": len(dispatches), "groups": len(groups), "batches": len(batches),
            "fresh_trained": len(trained), "restarts": sum(cluster.starts.values()) - len(SERVICES),
            "versions": len(announced), "killed_at": max((s["step"] for s in cluster.logs("learner")[0]
                                                          if s.get("event") == "step"), default=0)}


def assert_each_version_named_once(records: list, groups: list) -> dict:
    """One set of weights per version number across every learner start: a restarted learner
    that trains again what its checkpoint lacked never announces those numbers again (it says
    where it resumed with that version's own weights); new numbers rise; every rollout names an
    announced version (or the base, 0)."""
    checksums: dict[int, str] = {}
    for r in records:
        assert checksums.setdefault(r.version, r.weights_checksum) == r.weights_checksum, f"version {r.version} renamed"
    firsts = list(dict.fromkeys(r.version for r in records))
    assert firsts == sorted(firsts), f"a new version number below an announced one: {firsts}"
    assert {g.policy_version for g in groups} <= set(checksums) | {0}
    return checksums


def assert_no_dispatch_lost(dispatches, groups, in_flight: set) -> None:
    """Each problem's latest dispatch is answered or still in flight."""
    answered = {g.dispatch_id for g in groups}
    last_issued: dict[str, float] = {}
    for d in dispatches:
        last_issued[d.problem_id] = max(last_issued.get(d.problem_id, 0.0), d.issued_at)
    lost = [d for d in dispatches
            if d.dispatch_id not in answered and d.dispatch_id not in in_flight and last_issued[d.problem_id] == d.issued_at]
    assert not lost, f"{len(lost)} of {len(dispatches)} dispatches lost: {lost[:3]}"


def learner_lineage(cluster: Cluster) -> dict[int, dict]:
    """The last "step" log line for each step number (a step trained after the last
    checkpoint of a killed learner is trained again by its successor)."""
    lineage: dict[int, dict] = {}
    for start, lines in enumerate(cluster.logs("learner")):
        resumed = next((ln["version"] for ln in lines if ln.get("event") == "resumed"), 0)
        steps = [ln for ln in lines if ln.get("event") == "step"]
        assert [s["step"] for s in steps] == list(range(resumed + 1, resumed + 1 + len(steps))), f"start {start}"
        if start:
            assert resumed >= 1, "a restarted learner resumes from its checkpoint"
        for s in steps:
            lineage[s["step"]] = s
    assert sorted(lineage) == list(range(1, MAX_STEPS + 1))
    return lineage


def assert_lineage_trains_each_batch_once(lineage: dict[int, dict], by_id: dict) -> Counter:
    """Batches in order, none twice; no stale rollout trained; no fresh rollout trained twice."""
    seqs = [lineage[k]["batch_seq"] for k in sorted(lineage)]
    assert seqs == sorted(set(seqs)), "batches trained out of order or twice"
    trained: Counter = Counter()
    for step, line in sorted(lineage.items()):
        batch = by_id[line["batch_id"]]
        version = step - 1
        stale = [r for r in batch.rollouts if rollout_age(version, r.policy_version) > TAU_MAX]
        assert line["stale"] == len(stale)
        assert line["repeats"] == 0, "with a snapshot per batch, no rollout is offered twice"
        assert line["rollouts"] == len(batch.rollouts) - len(stale)
        trained.update(r.rollout_id for r in batch.rollouts
                       if not r.is_replay and rollout_age(version, r.policy_version) <= TAU_MAX)
    twice = [rid for rid, n in trained.items() if n > 1]
    assert not twice, f"fresh rollouts trained twice: {twice[:5]}"
    return trained


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


def test_broker_restart(s3, broker_s3, tmp_path, run_name):
    broker = KafkaBroker(storage="s3://prl-broker/", env=broker_s3, log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        cluster.wait_for_step(3)
        broker = cluster.kill_and_restart_broker(broker_s3)
        cluster.wait_for_step(7)
        cluster.finish()
        figures = check_invariants(cluster)
    finally:
        cluster.stop_all()
        broker.stop()
    print(f"\nbroker restart: {figures}")


def inject(cluster: Cluster, kind: str, record) -> None:
    """Write one message to a topic of the run, as anyone with access to the topic could."""
    transport = KafkaTransport(KafkaConfig(bootstrap_servers=cluster.broker.bootstrap))
    pub = transport.publisher()
    pub.publish(topic_name(cluster.run_name, kind), encode(record), key=b"attacker", headers=headers(record))
    pub.close()


def dead_letters(cluster: Cluster) -> list[DeadLetter]:
    return read_topic(cluster.broker.bootstrap, topic_name(cluster.run_name, DEADLETTER), DeadLetter)


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


def test_new_producers_join_the_group_after_a_broker_restart_and_a_clean_stop(s3, broker_s3, tmp_path, run_name):
    """The broker restarts on its storage mid-run, the run finishes and every service stops
    cleanly; then the run is continued with a producer that never ran before: it must be
    given dispatches by the existing group and the learner must go on stepping. (It stalled
    in 6 of 11 runs while members sent LeaveGroup: the two producers stop together, one leaves
    during the rebalance the other's leave started, and tansu keeps it as the group's leader;
    the tests' config sets transport.kafka.leave_group_on_close = false.)"""
    broker = KafkaBroker(storage="s3://prl-broker/", env=broker_s3, log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name)
    try:
        cluster.start_all()
        cluster.wait_for_step(3)
        broker = cluster.kill_and_restart_broker(broker_s3)
        cluster.finish()  # every service exits cleanly at the last step
        more = f"learner.max_steps={MAX_STEPS + 4}"
        for name in ("scheduler", "learner", "producer-2"):
            cluster.start(name, more)
        cluster.wait_for_step(MAX_STEPS + 4, timeout_s=240)
        groups = read_topic(broker.bootstrap, topic_name(run_name, ROLLOUTS), RolloutGroup)
        assert any(g.producer_id == "producer-2" for g in groups)
    finally:
        cluster.stop_all()
        broker.stop()


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
