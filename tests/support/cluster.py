"""The pipeline's four services as `prl` processes over a real broker, and what must hold
after any fault: no dispatch lost, no batch trained twice or skipped, no fresh rollout trained
twice or older than tau_max, one set of weights per version number. Used by
tests/integration/test_faults.py and `prl bench faults`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from prl import storage
from prl.formulas import rollout_age
from prl.learner import checkpoint
from prl.transport.kafka import KafkaTransport
from prl.trust import policy_root
from prl.scheduler.snapshot import read_snapshot
from prl.schemas import DeadLetter, Dispatch, PolicyVersion, RolloutGroup, TrainBatch, TrainRollout, decode, encode, headers
from prl.schemas.config import KafkaConfig
from prl.schemas.topics import BATCHES, DEADLETTER, POLICY, PROBLEMS, ROLLOUTS, topic_name
from tests.support.servers import KafkaBroker, Process, wait_until, write_kafka_config

MAX_STEPS = 14
CHECKPOINT_EVERY = 3  # a killed learner has usually published versions its last checkpoint lacks
TAU_MAX = 10
SERVICES = ("scheduler", "producer-0", "producer-1", "learner")
REPO = Path(__file__).resolve().parents[2]


CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


class Cluster:
    """The four services as processes, each restartable; logs as <name>.<start>.log."""

    def __init__(self, tmp_path: Path, broker: KafkaBroker, run_name: str, max_steps: int = MAX_STEPS, **scheduler):
        self.dir = tmp_path
        self.max_steps = max_steps
        self.run_dir = f"s3://prl-runs/{run_name}"
        self.run_name = run_name
        self.broker = broker
        self.config = tmp_path / "config.toml"
        write_kafka_config(self.config, broker.bootstrap, run_name, self.run_dir,
                           scheduler={"tau_max": TAU_MAX, "dispatch_timeout_s": 20,
                                      "replay": {"warmup_updates": 4}, **scheduler},
                           learner={"max_steps": max_steps, "checkpoint_every": CHECKPOINT_EVERY})
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

    def stop(self, name: str) -> None:
        """SIGTERM, as Kubernetes stops a pod: the service finishes its step and exits 0."""
        code = self.procs[name].stop(signal.SIGTERM, timeout_s=60)
        assert code == 0, f"{name} exited {code} when stopped:\n{self.tail(name)}"

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
            if self.step() >= step:  # at max_steps the others may have finished since
                return True
            for name, p in self.procs.items():
                assert p.proc.poll() is None or name == "learner", f"{name} exited:\n{self.tail(name)}"
            return False
        self.wait(reached, timeout_s, f"learner step {step}")

    def finish(self) -> None:
        """The learner reaches max_steps; the scheduler and producers see it and exit 0 on
        their own, nobody is signalled."""
        self.wait(lambda: self.procs["learner"].proc.poll() is not None, 300, "the learner to finish")
        self.wait(lambda: all(p.proc.poll() is not None for p in self.procs.values()), 120,
                  "the scheduler and producers to finish after the learner")
        for name, p in self.procs.items():
            assert p.proc.returncode == 0, f"{name}:\n{self.tail(name)}"
        self.procs.clear()  # all exited; a continuation starts its own

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        """wait_until; on a timeout the error holds where each live service is (its stacks)."""
        try:
            wait_until(predicate, timeout_s, what, 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; where each service was:\n{self.stacks()}") from None

    def stacks(self) -> str:
        """Each live service's threads that are in this repository's code, as `kill -USR1` has
        the service write them to its log (kafka-python's own threads left out)."""
        out = []
        for name, p in self.procs.items():
            if p.proc.poll() is not None:
                continue
            size = p.log_path.stat().st_size
            os.kill(p.proc.pid, signal.SIGUSR1)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: b"most recent call first" in p.log_path.read_bytes()[size:], 10, "stacks", 0.1)
            dump = p.log_path.read_bytes()[size:].decode(errors="replace")
            ours = [b for b in dump.split("\n\n") if "most recent call first" in b and any(
                str(REPO) in line and "site-packages" not in line for line in b.splitlines())]
            out.append(f"--- {name}\n" + "\n\n".join(ours or dump.split("\n\n")[-1:]))  # else the main thread
        return "\n".join(out)

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
                                     g.temperature, g.prompt_ids, r.completion_ids, r.logprobs, ref.sample_weight,
                                     r.model_mask))
    return TrainBatch(record.batch_id, record.seq, record.learner_version, record.rollouts_generated, rollouts,
                      record.created_at, record.epoch)


def read_topic(bootstrap: str, topic: str, cls) -> list:
    """Every record on ``topic`` (the services have stopped: the end is the high watermark
    the first fetch reports)."""
    transport = KafkaTransport(KafkaConfig(bootstrap_servers=bootstrap))
    sub = transport.subscriber([topic], group=None)
    msgs = []
    try:
        def at_end():
            batch = sub.poll(0.2, max_records=5000)
            msgs.extend(batch)
            return not batch and sub.caught_up()
        wait_until(at_end, 60, f"the end of {topic}", 0)
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
    assert sorted(lineage) == list(range(1, cluster.max_steps + 1))
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


def inject(cluster: Cluster, kind: str, record) -> None:
    """Write one message to a topic of the run, as anyone with access to the topic could."""
    transport = KafkaTransport(KafkaConfig(bootstrap_servers=cluster.broker.bootstrap))
    pub = transport.publisher()
    pub.publish(topic_name(cluster.run_name, kind), encode(record), key=b"attacker", headers=headers(record))
    pub.close()


def dead_letters(cluster: Cluster) -> list[DeadLetter]:
    return read_topic(cluster.broker.bootstrap, topic_name(cluster.run_name, DEADLETTER), DeadLetter)




def after_the_heal(cluster: Cluster, timeout_s: float, **figures) -> dict:
    """Right after the faults end: ``recovery_s``, the seconds to the learner's next step (None:
    no step within ``timeout_s``, a stall, or not ``measured``: the run had finished before the
    heal), the step at the heal and ``figures``."""
    healed, step_at_heal = time.monotonic(), cluster.step()
    run = {"recovery_s": None, "step_at_heal": step_at_heal, **figures, "measured": step_at_heal < cluster.max_steps}
    try:
        cluster.wait_for_step(min(step_at_heal + 1, cluster.max_steps), timeout_s=timeout_s)
    except TimeoutError:
        return run
    run["recovery_s"] = round(time.monotonic() - healed, 1) if run["measured"] else None
    return run


def network_fault_run(tmp_path: Path, run_name: str, fault_s: float, max_steps: int, seed: int = 0,
                      recovery_timeout_s: float = 120.0) -> dict:
    """The four services over a broker reached only through a FaultyProxy; once the learner has
    stepped twice, ``fault_s`` of resets (every 2-7 s) and refusals (1-3 s), services never
    killed; then the network heals and the run must finish by itself. Returns the invariants'
    figures and ``recovery_s``: from the heal to the first learner step after it (None: a stall,
    no step within ``recovery_timeout_s``, or not ``measured``). Needs the S3 environment of the
    run directory set."""
    from tests.support.proxy import FaultyProxy, port_outside_ephemeral_range

    proxy_port = port_outside_ephemeral_range()
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log", advertised_port=proxy_port)
    proxy = FaultyProxy(proxy_port, broker.port)
    cluster = Cluster(tmp_path, broker, run_name, max_steps=max_steps)
    try:
        cluster.start_all()
        cluster.wait_for_step(2)
        proxy.faults(fault_s, seed=seed)
        run = after_the_heal(cluster, recovery_timeout_s, resets=proxy.resets, refusals=proxy.refusals)
        if run["measured"] and run["recovery_s"] is None:  # a stall
            return run
        cluster.finish()
        return {**run, **check_invariants(cluster)}
    finally:
        cluster.stop_all()
        proxy.stop()
        broker.stop()


def storage_fault_run(tmp_path: Path, s3_port: int, run_name: str, fault_s: float, max_steps: int,
                      recovery_timeout_s: float = 120.0) -> dict:
    """The four services with their object store (checkpoints, versions, snapshots, archive)
    reached only through a FaultyProxy; once the learner has stepped twice, every connection
    there is reset and new ones refused for ``fault_s``, services never killed; then the run
    must finish by itself. Returns the invariants' figures, the storage errors each service
    logged and ``recovery_s`` as network_fault_run does. Sets AWS_ENDPOINT_URL to the proxy for
    the services (the caller's S3 environment otherwise)."""
    import os

    from tests.support.proxy import FaultyProxy, port_outside_ephemeral_range

    proxy_port = port_outside_ephemeral_range()
    proxy = FaultyProxy(proxy_port, s3_port)
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy_port}"
    broker = KafkaBroker(storage="memory://tansu/", log_path=tmp_path / "broker.log")
    cluster = Cluster(tmp_path, broker, run_name, max_steps=max_steps)
    try:
        cluster.start_all()
        cluster.wait_for_step(2)
        proxy.reset_all()
        proxy.refuse(fault_s)  # longer than s3fs's own retries of a request (about 10 s)
        run = after_the_heal(cluster, recovery_timeout_s)
        if run["measured"] and run["recovery_s"] is None:  # a stall
            return run
        cluster.finish()
        errors = {name: cluster.logged(name, '"storage_error"') for name in SERVICES}
        return {**run, **check_invariants(cluster), "storage_errors": errors}
    finally:
        cluster.stop_all()
        proxy.stop()
        broker.stop()
