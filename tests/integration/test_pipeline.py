"""The in-process pipeline: services on the in-memory transport."""

import json
import shutil
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.support.addition import small_addition
from prl.formulas import rollout_age
from prl.transport.memory import MemoryBroker, MemoryTransport
from prl.schemas import DeadLetter, RolloutGroup, decode, encode, headers, topic_name
from prl.schemas.config import load_config
from prl.schemas.topics import DEADLETTER, PROBLEMS, ROLLOUTS
from tests.support.servers import wait_until
from prl.trust import checkpoint_name


def small_config(tmp_path, **extra):
    overrides = [
        f"run.run_dir={json.dumps(str(tmp_path / 'run'))}",
        "scheduler.groups_per_batch=4", "scheduler.max_in_flight=8", "learner.eval_every=0",
        *small_addition(tmp_path / "data"),
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(overrides=overrides)


def test_scheduler_dead_letters_garbage_and_goes_on(tmp_path):
    """A message that does not decode goes to the dead-letter topic; the service goes on."""
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path)
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)
    pub = transport.publisher()
    garbage = [b"", b"\x00\x01junk", b"A" * 1000]
    for g in garbage:
        pub.publish(topic_name(cfg.run.name, ROLLOUTS), g, key=b"x")
    scheduler.step()  # dispatches the first problems, dead-letters the garbage
    dead = [decode(m.value, DeadLetter) for part in broker.partitions(topic_name(cfg.run.name, DEADLETTER)) for m in part]
    assert sorted(d.original for d in dead) == sorted(garbage)
    assert all(d.reason == "not_arrow" and d.source_topic == topic_name(cfg.run.name, ROLLOUTS) for d in dead)
    # ...and goes on: a producer answers the dispatches and the scheduler accepts them.
    producer = Producer(cfg, transport)
    producer.step()
    wait_until(lambda: scheduler.step() or scheduler.groups_returned >= 1, 30, "a returned group")
    assert sum(broker.end_offsets(topic_name(cfg.run.name, PROBLEMS))) >= cfg.scheduler.max_in_flight


def test_scheduler_counts_each_dispatch_until_the_broker_acknowledged_it(tmp_path):
    """scheduler/dispatch_to_ack_ms adds up, per dispatch, the time from its issue to the
    flush that the broker acknowledged: the scheduler's share of dispatch latency, for
    re-dispatches of timed-out problems too; its histogram counts each dispatch once."""
    import time

    from prl.metrics import bucket_quantile

    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)
    acknowledge = scheduler.publisher.flush
    scheduler.publisher.flush = lambda *a, **k: (time.sleep(0.05), acknowledge(*a, **k))  # a broker 50 ms away
    scheduler.step()
    dispatched = scheduler.counters["dispatched"]
    assert dispatched == cfg.scheduler.max_in_flight
    assert 50 * dispatched <= scheduler.counters["dispatch_to_ack_ms"] < 1000 * dispatched
    buckets = {k.split("/")[1]: n for k, n in scheduler.counters.items() if k.startswith("dispatch_to_ack_ms_bucket/")}
    assert sum(buckets.values()) == dispatched and bucket_quantile(buckets, 0.0) >= 50  # each dispatch, >= 50 ms
    for flight in scheduler.in_flight.values():  # nobody answered: every dispatch times out
        flight.issued_at -= cfg.scheduler.dispatch_timeout_s + 1
    scheduler.step()
    assert scheduler.counters["redispatched"] == dispatched
    assert scheduler.counters["dispatched"] == 2 * dispatched
    assert 50 * 2 * dispatched <= scheduler.counters["dispatch_to_ack_ms"] < 1000 * 2 * dispatched


def test_duplicate_results_are_ignored(tmp_path):
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer = Scheduler(cfg, transport), Producer(cfg, transport)
    scheduler.step()
    producer.step()
    rollouts = transport.subscriber([topic_name(cfg.run.name, ROLLOUTS)], group=None)
    msgs = rollouts.poll(1.0)
    assert msgs
    pub = transport.publisher()
    for m in msgs:  # at-least-once delivery: every result arrives twice
        pub.publish(m.topic, m.value, key=m.key)
    wait_until(lambda: scheduler.step() or scheduler.counters.get("duplicate_or_unknown_results", 0) >= len(msgs), 30, "duplicates")
    assert scheduler.groups_returned == len({decode(m.value, RolloutGroup).dispatch_id for m in msgs})


def test_prl_run_screen_is_one_line_per_evaluation_and_a_summary(tmp_path, capsys):
    """A newcomer's screen: the progress bar, one line per evaluation, the summary table;
    every log line goes to <run_dir>/prl.log instead. With --log-format json: JSON only."""
    from prl.cli import main

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "4", "--set", "learner.eval_every=2"]) == 0
    screen = [seg for line in capsys.readouterr().err.splitlines() for seg in line.split("\r")]
    shown = [s.strip() for s in screen if s.strip() and not s.strip().startswith("learner steps")]
    evals = [s for s in shown if s.startswith("step ")]
    assert [s.split()[1] for s in evals] == ["0", "2", "4"]
    assert shown[len(evals)].startswith("prl run finished in") and shown[-1].startswith("wrote ")
    counted = [int(s.split()[3].replace(",", "")) for s in evals]  # step N  rollouts R ...
    total = int(shown[len(evals)].split(", ")[1].split()[0].replace(",", ""))  # ...: 4 steps, R rollouts generated
    assert counted == sorted(counted) and total >= counted[-1]  # the summary counts every one generated
    assert len(shown) == len(evals) + 2 + 1 + 5  # finished, wrote; the table: header, overall, four difficulties
    assert "step" in (run_dir / "prl.log").read_text() and json.loads((run_dir / "summary.json").read_text())["steps"] == 4
    assert main(["run", "--run-dir", str(tmp_path / "json"), "--max-steps", "2", "--log-format", "json",
                 "--set", "learner.eval_every=2"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(json.loads(line) for line in lines)
    assert json.loads(lines[-1])["event"] == "run_finished"


@pytest.mark.slow
def test_prl_run_three_steps(tmp_path):
    from prl.cli import main

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "3", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "learner/loss" in r]
    assert steps == [1, 2, 3]
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / "latest").exists()
    # The scheduler archived every accepted group, closed on shutdown, partitioned by version.
    from prl.scheduler.archive import read_archive

    archive = read_archive(str(run_dir / "archive"))
    scheduler_rows = [r for r in rows if r["service"] == "scheduler"]
    assert archive.num_rows >= scheduler_rows[-1]["scheduler/groups_returned"] > 0
    assert set(archive["policy_version"].to_pylist()) <= {0, 1, 2, 3}
    assert set(archive["producer_id"].to_pylist()) == {"local"}  # not host-pid: a rerun samples the same stream
    # Each evaluation's answers, one line per held-out problem, beside the metrics.
    answers = sorted(p.name for p in (run_dir / "evaluations").iterdir())
    assert answers == ["step-00000000.jsonl", "step-00000003.jsonl"]
    lines = (run_dir / "evaluations" / answers[-1]).read_text().splitlines()
    assert len(lines) == len({json.loads(line)["problem_id"] for line in lines}) > 0


def test_scheduler_snapshot_restores_state(tmp_path):
    """A restarted scheduler continues from its last snapshot: same in-flight table,
    counters, pending fresh groups and sampler state."""
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path, **{"scheduler.max_batches_ahead": 2,
                                    "scheduler.replay.warmup_updates": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, producer = Scheduler(cfg, transport), Producer(cfg, transport)
    taken = {}
    original = scheduler.snapshot

    def snapshot(pending=None):
        original(pending)
        taken["state"] = json.loads(json.dumps(scheduler.state_dict(), default=lambda a: a.tolist()))
        taken["fresh"] = [g.dispatch_id for g in scheduler.fresh]
        taken["replay"] = [r.rollout_id for r in scheduler.replay.state_dict()[1]]

    scheduler.snapshot = snapshot

    def progressed():
        producer.step()
        scheduler.step()
        return scheduler.next_seq >= 2

    wait_until(progressed, 60, "two batches")
    restarted = Scheduler(cfg, transport)
    got = json.loads(json.dumps(restarted.state_dict(), default=lambda a: a.tolist()))
    assert got == taken["state"]
    assert [g.dispatch_id for g in restarted.fresh] == taken["fresh"]
    assert [r.rollout_id for r in restarted.replay.state_dict()[1]] == taken["replay"] != []
    assert restarted.next_seq == 2


def test_scheduler_stays_at_most_max_batches_ahead(tmp_path):
    """Flow control: with no learner consuming, the scheduler publishes max_batches_ahead
    batches and then stops, and dispatches no more than the in-flight bound allows."""
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler
    from prl.schemas.topics import BATCHES

    cfg = small_config(tmp_path, **{"scheduler.max_batches_ahead": 2})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    scheduler, producer = Scheduler(cfg, transport), Producer(cfg, transport)

    def saturated():
        producer.step()
        scheduler.step()
        return scheduler.next_seq == 2 and len(scheduler.fresh) + len(scheduler.in_flight) >= cfg.scheduler.max_in_flight

    wait_until(saturated, 60, "the scheduler to fill its window")
    for _ in range(5):
        producer.step()
        scheduler.step()
    assert sum(broker.end_offsets(topic_name(cfg.run.name, BATCHES))) == 2
    assert len(scheduler.in_flight) + len(scheduler.fresh) <= cfg.scheduler.max_in_flight


def test_each_service_says_what_it_waits_for_while_no_work_comes(tmp_path):
    """The silent stall: nothing answers the scheduler's dispatches. Its steps and the learner's
    move nothing (what they log as ``idle`` after a while, prl/service.py), and each says what
    it waits for; answers move the scheduler on until max_batches_ahead batches wait, and then
    it says it waits for the learner."""
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path, **{"scheduler.max_batches_ahead": 2})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler, learner = Scheduler(cfg, transport), Learner(cfg, transport)
    scheduler.step(), learner.step()
    marks = scheduler.progress(), learner.progress()
    for _ in range(3):
        scheduler.step(), learner.step()
    assert (scheduler.progress(), learner.progress()) == marks
    assert scheduler.waiting_for() == {"waits_for": "rollouts", "in_flight": cfg.scheduler.max_in_flight, "fresh_groups": 0,
                                       "evaluations_running": [], "topic": topic_name(cfg.run.name, ROLLOUTS)}
    assert learner.waiting_for() == {"waits_for": "a batch", "batch_seq": 0, "topic": f"{cfg.run.name}.batches"}

    producer = Producer(cfg, transport)
    assert producer.waiting_for()["waits_for"] == "dispatches"
    mark = producer.progress()
    producer.step()
    assert producer.progress() != mark

    def two_batches_wait():
        producer.step()
        scheduler.step()
        return scheduler.next_seq == 2
    wait_until(two_batches_wait, 60, "two batches waiting for the learner")
    assert scheduler.progress() != marks[0]
    assert scheduler.waiting_for() == {"waits_for": "the learner", "learner_version": 0, "batches_ahead": 2}


class ScriptedProducer:
    """A scheduler on the in-memory transport, its dispatches answered by a script instead of
    a model: every group is made at policy version 0 with the rewards ``rewards(n)`` gives
    the n-th answer (as many as the dispatch asked for: sampling.group_size). No learner
    consumes the batches."""

    def __init__(self, cfg, rewards):
        from prl.scheduler.service import Scheduler
        from prl.schemas.topics import BATCHES

        self.cfg, self.rewards = cfg, rewards
        transport = MemoryTransport(MemoryBroker())
        transport.ensure_topics(cfg.run.name)
        self.scheduler = Scheduler(cfg, transport)
        self.dispatches = transport.subscriber([topic_name(cfg.run.name, PROBLEMS)], group="producers")
        self.batches = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group=None)
        self.publisher = transport.publisher()
        self.answered, self.trained = 0, []

    def step(self) -> int:
        """One scheduler step, then answer what it dispatched; returns the answers so far."""
        from prl.schemas import Dispatch, Rollout

        self.scheduler.step()
        for m in self.dispatches.poll(0.0):
            d = decode(m.value, Dispatch)
            group = RolloutGroup(d.dispatch_id, d.problem_id, 0, "p", [1, 3], 1.0,
                                 [Rollout([4, 2], [-0.1, -0.1], r, "stop") for r in self.rewards(self.answered)])
            self.publisher.publish(topic_name(self.cfg.run.name, ROLLOUTS), encode(group), key=d.problem_id.encode(),
                                   headers=headers(group))
            self.answered += 1
        self.collect()
        return self.answered

    def settle(self) -> None:
        """Wait until the scheduler has accepted every answer and published what it will."""
        wait_until(lambda: self.scheduler.step() or self.scheduler.groups_returned == self.answered, 30, "every group accepted")
        self.scheduler.step()
        self.collect()

    def collect(self) -> None:
        from prl.schemas import TrainBatch

        self.trained += [decode(m.value, TrainBatch) for m in self.batches.poll(0.0)]


def test_batches_are_composed_for_the_version_that_will_train_them(tmp_path):
    """With batches queued ahead of the learner, batch k is trained k versions later than
    now; rollouts that would be older than tau_max by then are dropped by the scheduler
    (and counted), so the learner never receives a rollout it has to drop."""
    cfg = small_config(tmp_path, **{"scheduler.tau_max": 2, "scheduler.max_batches_ahead": 5, "sampling.group_size": 4,
                                    "scheduler.replay.ratio": 0})
    run = ScriptedProducer(cfg, lambda n: (1.0, 0.0, 0.0, 0.0))  # stuck at version 0
    wait_until(lambda: run.step() >= 40, 30, "40 groups answered (the scheduler stalls if it keeps stale groups)")
    run.settle()
    assert [b.seq for b in run.trained] == [0, 1, 2]  # trained at versions 0, 1, 2: version-0 rollouts are age <= 2
    assert all(b.learner_version == b.seq and max(rollout_age(b.learner_version, r.policy_version) for r in b.rollouts) <= 2
               for b in run.trained)
    stale = sum(v for k, v in run.scheduler.counters.items() if k.startswith("stale_groups_dropped/"))
    assert stale == run.answered - 3 * 4 - len(run.scheduler.fresh)


@pytest.mark.parametrize("strategy, dynamic", [("priority", False), ("dapo_filter", True)])
def test_batch_is_what_survives_of_groups_per_batch_unless_dynamic_sampling(tmp_path, strategy, dynamic):
    """Without dynamic sampling a batch is the groups with a signal among groups_per_batch
    returned ones (every strategy takes one step per groups_per_batch groups generated);
    with it (DAPO), generation goes on until groups_per_batch groups with a signal fill it."""
    cfg = small_config(tmp_path, **{"scheduler.strategy": f"'{strategy}'", "scheduler.replay.ratio": 0,
                                    "scheduler.max_batches_ahead": 100, "scheduler.tau_max": 100,
                                    "sampling.group_size": 4})
    run = ScriptedProducer(cfg, lambda n: [0.0] * 4 if n % 2 else [1.0, 0.0, 0.0, 0.0])  # every other group: no signal
    wait_until(lambda: run.step() >= 48, 30, "48 groups answered")
    run.settle()
    answered, trained, groups_per_batch = run.answered, run.trained, cfg.scheduler.groups_per_batch
    assert run.scheduler.dynamic_sampling is dynamic and run.scheduler.zero_variance_filter
    assert all(len({r.problem_id for r in b.rollouts}) == (groups_per_batch if dynamic else groups_per_batch // 2)
               for b in trained)
    assert all(any(r.reward for r in b.rollouts[i:i + 4]) for b in trained for i in range(0, len(b.rollouts), 4))
    assert len(trained) == (answered // 2 // groups_per_batch if dynamic else answered // groups_per_batch)
    assert run.scheduler.counters["zero_signal_dropped"] == (answered // 2 if dynamic else len(trained) * groups_per_batch // 2)


@pytest.mark.parametrize("deleted", ["whole", "version.json"])
def test_producer_skips_a_version_pruned_before_it_loaded_it(tmp_path, deleted):
    """The learner keeps its last chains of versions: a producer that reads an announcement
    late finds the version gone, or half deleted (a newer one is there), skips it without a
    dead letter and loads the next one. (A version that is there but not what it claims:
    tests/integration/test_hostile.py.)"""
    from prl.producers.service import Producer
    from prl.models import export_state, load_model
    from prl.policy import PolicyWriter
    from prl.schemas import PolicyVersion
    from prl.schemas.topics import POLICY

    cfg = small_config(tmp_path)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    producer = Producer(cfg, transport)
    pub = transport.publisher()

    def announce(version, out):
        record = PolicyVersion(version, out.uri, version - 1, 0.0, out.kind, out.checksum)
        pub.publish(topic_name(cfg.run.name, POLICY), encode(record), key=b"run", headers=headers(record))

    weights = export_state(load_model(cfg.model.path))
    old = PolicyWriter(cfg.run.run_dir, cfg.model.dtype).publish(3, weights)
    good = PolicyWriter(cfg.run.run_dir, cfg.model.dtype).publish(4, weights)
    if deleted == "whole":
        shutil.rmtree(old.uri.removeprefix("file://"))
    else:  # the pruner removes a version's files one by one: caught between two of them
        Path(old.uri.removeprefix("file://"), deleted).unlink()
    announce(3, old)  # 4 is there
    producer.step()
    assert producer.backend.version == 0 and producer.counters["superseded_versions_skipped"] == 1
    assert not [k for k in producer.counters if k.startswith("dead_lettered")]
    announce(4, good)
    producer.step()
    assert producer.backend.version == 4


def test_health_and_metrics_endpoints(tmp_path):
    import urllib.request

    from prl.status import StatusServer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)
    scheduler.step()
    server = StatusServer(scheduler, 0, host="127.0.0.1")
    try:
        base = f"http://127.0.0.1:{server.port}"
        health = json.loads(urllib.request.urlopen(base + "/health", timeout=5).read())
        assert health["status"] == "ok" and health["service"] == "scheduler"
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert f"prl_scheduler_in_flight {cfg.scheduler.max_in_flight}" in text
        assert "prl_scheduler_dispatched" in text
        idle = float(next(line for line in text.splitlines() if line.startswith("prl_scheduler_seconds_idle ")).split()[1])
        assert health["seconds_idle"] <= idle < health["seconds_idle"] + 5  # what an alert on a stopped pipeline reads
    finally:
        server.close()


def test_a_learner_told_to_wait_when_finished_waits_for_sigterm_and_exits_0(tmp_path):
    """`prl learner --when-finished wait` (the k8s manifests' args), its run over (here: a batch
    file read to its end), answers /health "finished" until SIGTERM, then exits 0."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from prl.learner.sources import write_batches
    from tests.support.servers import free_port

    write_batches(str(tmp_path / "batches.arrow"), [])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "prl.cli", "learner", "--set", f"run.run_dir={str(tmp_path / 'run')!r}",
                             "--batches-from", str(tmp_path / "batches.arrow"), "--http", f"127.0.0.1:{port}",
                             "--when-finished", "wait"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def health():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        try:
            return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read())["status"]
        except OSError:  # not listening yet
            return None

    try:
        wait_until(lambda: health() == "finished", 120, "the learner to finish and wait", 0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    assert "waiting_to_be_stopped" in proc.communicate()[0]


def test_learner_dead_letters_a_batch_with_out_of_vocabulary_tokens(tmp_path):
    from prl.learner.service import Learner
    from prl.schemas import TrainBatch, TrainRollout, encode
    from prl.schemas.topics import BATCHES

    cfg = small_config(tmp_path)
    transport = MemoryTransport(broker := MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    learner = Learner(cfg, transport)
    rollout = TrainRollout("r", "p", 0, False, 1.0, 1.0, 1.0, [1, 2], [3, 10**6], [-0.1, -0.1])
    transport.publisher().publish(topic_name(cfg.run.name, BATCHES), encode(TrainBatch("b", 0, 0, 1, [rollout])))
    learner.step()
    dead = [decode(m.value, DeadLetter) for part in broker.partitions(topic_name(cfg.run.name, DEADLETTER)) for m in part]
    assert [d.reason for d in dead] == ["invalid_value"] and "token id" in dead[0].detail
    assert learner.version == 0 and learner.counters["dead_lettered/invalid_value"] == 1


@pytest.mark.parametrize("setting", ["true", "auto"])
def test_learner_warns_once_when_bf16_autocast_would_be_emulated(tmp_path, monkeypatch, setting):
    """On a device without native bf16, bf16_autocast = true is obeyed with one warning that
    names the fix; "auto" trains in fp32 and says so, without a warning."""
    import prl.learner.service
    from structlog.testing import capture_logs

    monkeypatch.setattr(prl.learner.service, "native_bf16", lambda device_type: False)
    cfg = small_config(tmp_path, **{"learner.bf16_autocast": setting})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    with capture_logs() as logs:
        prl.learner.service.Learner(cfg, transport)
    precision = [e for e in logs if e["event"] == "precision"]
    warned = [e for e in logs if e["event"] == "bf16_autocast_emulated"]
    assert [e["bf16_autocast"] for e in precision] == [setting == "true"]
    assert len(warned) == (setting == "true") and all('"auto"' in e["fix"] for e in warned)


def test_batches_lost_with_the_earlier_broker_are_logged_not_warned_of(tmp_path):
    """Every continued `prl run` loses the batches its scheduler sent ahead to the earlier
    process's broker (nothing trained is lost): it was a console warning at each continuation."""
    from structlog.testing import capture_logs

    from prl.learner.service import Learner

    cfg = small_config(tmp_path)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    learner = Learner(cfg, transport)
    with capture_logs() as logs:
        learner.pass_over_batches_through(2)
    assert [(e["event"], e["log_level"]) for e in logs] == [("batches_passed_over", "info")] and learner.last_seq == 2


def write_problems(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("case", ["chat prompts, no chat template", "prompts longer than the model's context"])
def test_prl_run_says_why_when_no_problem_can_be_served_and_exits(tmp_path, capsys, case):
    """Every problem retired by the producers (a chat prompt for a model without a chat
    template, or prompts too long for its context): one line saying so, non-zero exit,
    within seconds, instead of waiting forever; the warnings before it do not flood the console
    with a line per problem (the 1st and the 10th)."""
    import time

    from prl.cli import main

    if case.startswith("chat"):
        rows = [{"id": f"q{i}", "prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(40)]
    else:
        rows = [{"id": f"q{i}", "prompt": "1" * 100 + "+1=", "answer": "2"} for i in range(40)]
    train = write_problems(tmp_path / "train.jsonl", rows)
    t0 = time.monotonic()
    code = main(["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--set", f"task.train_path={json.dumps(train)}"])
    lines = capsys.readouterr().err.strip().splitlines()
    err = lines[-1]
    assert code == 2 and time.monotonic() - t0 < 60
    assert sum("problem_retired" in line for line in lines) == 2
    assert err.startswith("prl run: no problem can be dispatched: producers could not serve 40 of 40")
    assert ("NoChatTemplate" if case.startswith("chat") else "PromptTooLong") in err


def test_replay_train_learns_from_the_archive_into_a_new_run_dir(tmp_path, capsys):
    """`prl replay train` on a finished run's archive trains every archived batch from the
    base model into a new directory; the live run is not touched, and a directory that
    already holds checkpoints is refused in one line."""
    from prl.cli import main

    run = str(tmp_path / "run")
    assert main(["run", "--run-dir", run, "--max-steps", "3", "--no-progress", "--set", "learner.eval_every=0"]) == 0
    live = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    capsys.readouterr()
    assert main(["replay", "train", "--set", f"run.run_dir='{run}'", "--out", str(tmp_path / "offline")]) == 0
    out, err = capsys.readouterr()
    assert "info" not in err and "learner" in (tmp_path / "offline" / "prl.log").read_text()  # the log is in the file
    steps = int(out.split()[1])
    assert f"train: {steps}/{steps} batches" in err  # progress counts batches to the end (plain lines: not a terminal)
    assert out.startswith("trained ") and steps > 0 and (tmp_path / "offline" / "checkpoints" / "latest").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == live
    assert main(["replay", "train", "--set", f"run.run_dir='{run}'", "--no-progress", "--out", run]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err


@pytest.mark.parametrize("label", [True, False])
def test_explain_says_why_for_a_tried_and_a_never_tried_problem(tmp_path, capsys, label):
    """The group is named where the prior uses it (with task.group_field, not without)."""
    import pyarrow.dataset as ds

    from prl.cli import main
    from prl.schemas.config import load_config
    from prl.tasks import addition, heldout_problems

    run = str(tmp_path / "run")
    prior_set = ["--set", "task.group_field='difficulty'"] if label else []
    assert main(["run", "--run-dir", run, "--max-steps", "3", "--no-progress", "--set", "learner.eval_every=0", *prior_set]) == 0
    archived = ds.dataset(f"{run}/archive", format="parquet", partitioning="hive").to_table()["problem_id"].to_pylist()
    never = next(p.id for p in addition.train_pool([80, 600, 600, 600]) if p.id not in set(archived))
    capsys.readouterr()
    assert main(["explain", archived[0], "--set", f"run.run_dir='{run}'", *prior_set]) == 0
    out = capsys.readouterr().out
    heading = f"{archived[0]} (group " if label else f"{archived[0]} at learner version "
    assert out.startswith(heading) and "priority p(1-p) = " in out and "archived group(s):" in out
    assert "trained" in out and "rewards " in out
    assert main(["explain", never, "--run-dir", run, *prior_set]) == 0  # every command takes --run-dir
    out = capsys.readouterr().out
    assert "never tried" in out and "no archived group" in out
    assert main(["explain", archived[0] + "x", "--run-dir", run, *prior_set]) == 2  # mistyped: the id meant is named
    assert f"is not a training problem of this run's task (did you mean {archived[0]!r}" in capsys.readouterr().err
    heldout = heldout_problems(load_config(None, []).task)[0].id
    assert main(["explain", heldout, "--run-dir", run, *prior_set]) == 0
    assert capsys.readouterr().out.startswith(f"{heldout} is a held-out problem: evaluated greedily by the fleet, never trained")


@pytest.mark.parametrize("claim_check", [False, True])
def test_claim_check_batches_train_the_same_rollouts_as_copies(tmp_path, claim_check):
    """With scheduler.claim_check the batches carry references (topic, partition, offset)
    instead of tokens; the learner fetches the groups and trains exactly what a copying run
    trains: same batches, same rollouts, far fewer bytes on the batch topic."""
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler
    from prl.schemas import TrainBatchRefs
    from prl.schemas.topics import BATCHES

    cfg = small_config(tmp_path, **{"scheduler.claim_check": str(claim_check).lower(), "scheduler.replay.warmup_updates": 0,
                                    "learner.max_steps": 4})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    learner, scheduler, producer = Learner(cfg, transport), Scheduler(cfg, transport), Producer(cfg, transport)

    def trained_four():
        scheduler.step()
        producer.step()
        return learner.step() or learner.version >= 4

    wait_until(trained_four, 120, "four learner steps")
    batches = [m for p in broker.partitions(topic_name(cfg.run.name, BATCHES)) for m in p]
    kinds = {decode(m.value).KIND for m in batches}
    assert kinds == ({"train_batch_refs"} if claim_check else {"train_batch"})
    assert learner.counters.get("dead_lettered/unresolvable_ref", 0) == 0 and len(learner.trained) > 0
    if claim_check:
        refs = [r for m in batches for r in decode(m.value, TrainBatchRefs).refs]
        assert any(r.is_replay for r in refs) and learner.counters["fetched_bytes"] > 0
        assert learner.counters["fetch_cache_bytes"] > 0  # replayed rollouts' groups were not fetched again
        assert max(len(m.value) for m in batches) < 20_000  # references only


def test_every_version_reaches_the_producer_and_checkpoints_come_every_n_steps(tmp_path):
    """checkpoint_every=4: a version goes out at every step (a base, then deltas, a new base
    when the chain would outgrow the weights or every 10 versions), the producer loads each one
    without a refusal, and full checkpoints are written at steps 4 and 8 and at the last."""
    from prl.cli.run import run_pipeline

    cfg = small_config(tmp_path, **{"learner.checkpoint_every": 4, "learner.max_steps": 10})
    summary = run_pipeline(cfg, progress=False, max_seconds=60)
    assert summary["steps"] == 10
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not [k for r in rows for k in r if "dead_lettered" in k]
    kinds = [k.rsplit("/", 1)[1] for r in rows if "learner/version_bytes" in r for k in r if "/version_kind/" in k]
    assert len(kinds) == 10 and kinds[0] == kinds[9] == "full" and kinds.count("delta") >= 5  # a base every 10 versions
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert names == [checkpoint_name(4), checkpoint_name(8), checkpoint_name(10)]


def test_the_version_a_run_ends_at_is_evaluated_by_the_fleet(tmp_path, monkeypatch):
    """The last version is still being written in the background when the run asks for its
    evaluation (a real model's write takes seconds; here every write is made slow): it is
    announced first, so a producer can load it, and its evaluation completes (three quick
    refusals used to report it incomplete)."""
    from prl.cli.run import run_pipeline
    from prl.policy import PolicyWriter

    write = PolicyWriter.write
    monkeypatch.setattr(PolicyWriter, "write", lambda self, *a: time.sleep(0.5) or write(self, *a))

    cfg = load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "scheduler.groups_per_batch=4",
                                 "scheduler.max_in_flight=8", "learner.eval_every=100",
                                 *small_addition(tmp_path / "data", heldout=10)])
    summary = run_pipeline(cfg, progress=False, max_rollouts=64)  # a budget, not a version due for evaluation
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < summary["steps"] < 100 and summary["evaluated_at"] == summary["steps"]
    assert not [r for r in rows if "eval/incomplete" in r]


def test_a_run_ended_by_its_budget_continues_without_evaluating_its_last_version_again(tmp_path):
    """A budget ends the run with the scheduler batches ahead of the learner; they go with the
    process's broker. The run continued trains on (it used to wait for them for good), and its
    scheduler's snapshot holds the last evaluation: that version is evaluated no second time."""
    from prl.cli.run import run_pipeline
    from prl.metrics import read_run_metrics

    cfg = load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "scheduler.groups_per_batch=4",
                                 "scheduler.max_in_flight=8", "learner.eval_every=100",
                                 *small_addition(tmp_path / "data", heldout=10)])
    first = run_pipeline(cfg, progress=False, max_rollouts=64)
    second = run_pipeline(cfg, progress=False, max_rollouts=first["rollouts_generated"] + 64, max_seconds=120)
    assert 0 < first["steps"] < second["steps"] < 100 and second["first_step"] == first["steps"]
    steps = [r["step"] for r in read_run_metrics(cfg.run.run_dir) if "eval/accuracy" in r]
    assert steps == [0, first["steps"], second["steps"]]


def test_a_learner_restarted_past_its_checkpoint_never_announces_a_number_again(tmp_path):
    """Killed after publishing versions 5 and 6 with its checkpoint at 4, a learner resumes at 4,
    trains 5 and 6 again without announcing them (their numbers name the weights producers may
    already serve) and announces 7 as a full base; every announced number names one checksum,
    which is what storage rebuilds to."""
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from prl.models import base_weight_shapes, resolve_model_dir
    from prl.policy import PolicyReader
    from prl.schemas import PolicyVersion, TrainBatch
    from prl.schemas.topics import POLICY
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"learner.checkpoint_every": 4, "scheduler.replay.ratio": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    batches = [TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i)) for i in range(8)]
    write_batches(str(tmp_path / "a.arrow"), batches[:6])
    write_batches(str(tmp_path / "b.arrow"), batches[4:])
    first = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))
    while first.version < 6:
        first.step()
    first.announce_written(wait=True)  # then "killed" after announcing 6: no close, no checkpoint of 5 or 6
    second = Learner(cfg, transport, batches_from=str(tmp_path / "b.arrow"))
    assert second.version == 4 and second.published == 6
    while second.version < 8:
        second.step()
    second.announce_written(wait=True)
    sub = transport.subscriber([topic_name(cfg.run.name, POLICY)], group=None, from_beginning=True)
    records = [decode(m.value, PolicyVersion) for m in sub.poll(0.0)]
    # 4: where it resumed, its own weights; 6: the newest in storage, as the first learner wrote it
    assert [r.version for r in records] == [0, 1, 2, 3, 4, 5, 6, 4, 6, 7, 8]
    for n in (4, 6):
        assert {(r.weights_checksum, r.last_batch_seq) for r in records if r.version == n} == \
            {(records[n].weights_checksum, records[n].last_batch_seq)}
    assert [r.kind for r in records[-2:]] == ["full", "delta"]
    assert second.counters["versions_not_announced_again"] == 2
    reader = PolicyReader(base_weight_shapes(resolve_model_dir(cfg.model.path)))
    for r in records[1:]:
        reader.read(r.uri, r.version, r.kind, r.weights_checksum)  # each rebuilds to its announcement


def test_a_version_written_and_not_announced_before_a_kill_is_announced_by_the_next_learner(tmp_path):
    """Killed between writing version 6 and announcing it (the writer runs beside the learner),
    a learner leaves a scheduler waiting for 6 to send more batches; the next learner, which
    never announces 6 itself, announces it at its start as storage holds it, with the batches
    it was trained on, and the scheduler takes it."""
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from prl.scheduler.service import Scheduler
    from prl.schemas import PolicyVersion, TrainBatch
    from prl.schemas.topics import POLICY
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"learner.checkpoint_every": 4, "scheduler.replay.ratio": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    batches = [TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i)) for i in range(7)]
    write_batches(str(tmp_path / "a.arrow"), batches)
    first = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))
    while first.version < 5:
        first.step()
    first.announce_written(wait=True)
    first.announce = lambda record: None  # "killed" before it announces 6
    first.step()
    first.outgoing[-1][2].result()  # 6 is whole in storage
    second = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))
    sub = transport.subscriber([topic_name(cfg.run.name, POLICY)], group=None, from_beginning=True)
    records = [decode(m.value, PolicyVersion) for m in sub.poll(0.0)]
    assert [(r.version, r.last_batch_seq) for r in records] == [(0, -1), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (4, 3), (6, 5)]
    assert second.version == 4 and second.published == 6
    scheduler = Scheduler(cfg, transport)
    scheduler.next_seq = 7  # it had published the seven batches
    scheduler.read_policy()
    assert (scheduler.learner_version, scheduler.learner_last_seq) == (6, 5)
    assert not scheduler.counters.get("dead_lettered/implausible_policy")


def test_prl_run_stopped_by_ctrl_c_checkpoints_its_step_and_continues(tmp_path, capsys):
    """Ctrl-C (here SIGINT sent once the learner has trained two steps) ends `prl run` after
    the step in progress with exit code 130, a checkpoint of that step and the summary; the
    same command then continues from that step."""
    import os
    import signal
    import threading

    from prl.cli import main

    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"

    def trained(n):
        return metrics.exists() and any(json.loads(line).get("learner/loss") is not None and json.loads(line)["step"] >= n
                                        for line in metrics.read_text().splitlines() if line.endswith("}"))

    def interrupt():
        wait_until(lambda: trained(2), timeout_s=120, what="two learner steps")
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    argv = ["run", "--run-dir", str(run_dir), "--max-steps", "500", "--no-progress", "--max-minutes", "3", "--set", "learner.checkpoint_every=1000", "--set", "learner.eval_every=0"]
    assert main(argv) == 130
    sender.join(timeout=5)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted_by"] == "SIGINT" and 2 <= summary["steps"] < 500
    assert (run_dir / "checkpoints" / checkpoint_name(summary["steps"])).exists()
    assert "prl run stopped by SIGINT" in capsys.readouterr().err
    assert main(argv[:3] + ["--max-steps", str(summary["steps"] + 2)] + argv[5:]) == 0
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["first_step"] == summary["steps"] and again["steps"] == summary["steps"] + 2
    capsys.readouterr()  # nothing left to train: one line, and the finished run's summary is kept
    assert main(argv[:3] + ["--max-steps", str(summary["steps"])] + argv[5:]) == 2
    assert "raise --max-steps" in capsys.readouterr().err
    assert json.loads((run_dir / "summary.json").read_text()) == again


class WrittenWhenWaitedOn(Future):
    """A write that finishes only when someone waits for it: a policy writer that never keeps up."""

    def __init__(self, write):
        super().__init__()
        self.write = write

    def exception(self, timeout=None):
        if not self.done():
            self.set_result(self.write())
        return super().exception(timeout)

    def result(self, timeout=None):
        self.exception()
        return super().result(timeout)


def test_a_learner_faster_than_its_writer_waits_rather_than_hold_more_unwritten_versions(tmp_path):
    """On a GPU a step can outrun writing a version on the host. Each version taken holds a
    snapshot of the weights, so the learner holds at most UNWRITTEN_VERSIONS of them and waits for
    the oldest; every version is still announced, in order."""
    from prl.learner.service import UNWRITTEN_VERSIONS, Learner
    from prl.learner.sources import write_batches
    from prl.policy import flat_weights
    from prl.schemas import PolicyVersion, TrainBatch
    from prl.schemas.topics import POLICY
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    write_batches(str(tmp_path / "a.arrow"), [TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i)) for i in range(6)])
    learner = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))
    writer, held = learner.writer, []

    def publish_async(version, tensors, adapter, last_seq):  # the snapshot now, the writing when waited on
        spec, flat = [[n, list(t.shape)] for n, t in tensors.items()], flat_weights(tensors, list(tensors), writer.dtype)
        return WrittenWhenWaitedOn(lambda: writer.write(version, [flat], spec, adapter, last_seq))

    writer.publish_async = publish_async
    while learner.version < 6:
        learner.step()
        held.append(len(learner.outgoing))
    assert max(held) == UNWRITTEN_VERSIONS
    learner.announce_written(wait=True)
    sub = transport.subscriber([topic_name(cfg.run.name, POLICY)], group=None, from_beginning=True)
    assert [decode(m.value, PolicyVersion).version for m in sub.poll(0.0)] == [0, 1, 2, 3, 4, 5, 6]


def test_a_run_directory_alone_is_enough_for_every_command_that_takes_it(tmp_path, capsys):
    """`prl run` keeps its resolved configuration in the run directory (here one that is not the
    default: the label as the prior's group, no replay); explain, replay report, inspect report
    and continuing the run are then given --run-dir alone, and flags still override it."""
    from prl.cli import main

    run_dir = str(tmp_path / "run")
    args = ["--set", 'task.group_field="difficulty"', "--set", "scheduler.replay.ratio=0", "--set", "learner.eval_every=0"]
    assert main(["run", "--run-dir", run_dir, "--max-steps", "2", "--no-progress", *args]) == 0
    assert main(["explain", "add2:74+31", "--run-dir", run_dir]) == 0
    assert "from its group" in capsys.readouterr().out  # the label's prior: the stored config, not the default
    assert main(["replay", "report", "--run-dir", run_dir]) == 0
    assert main(["inspect", "report", "--run-dir", run_dir]) == 0
    assert main(["run", "--run-dir", run_dir, "--max-steps", "3", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["first_step"], summary["steps"]) == (2, 3)
    stored = load_config(tmp_path / "run" / "config.toml")
    assert (stored.task.group_field, stored.scheduler.replay.ratio, stored.learner.max_steps) == ("difficulty", 0.0, 3)


def test_the_exported_model_loads_and_answers_as_the_runs_last_evaluation(tmp_path, capsys):
    """`prl run` then `prl model export`: the directory loads in transformers on its own, and its
    greedy held-out accuracy is the one the fleet measured for the run's last version. An older
    version, rebuilt from a base and deltas, exports too; a torn checkpoint is refused."""
    from prl.cli import main
    from prl.evaluation import encode_heldout, heldout_accuracy
    from prl.generation import TransformersBackend
    from prl.tasks import heldout_problems
    from prl.tasks.addition import exact_match

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "12", "--no-progress", "--set", "learner.eval_every=12"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert main(["model", "export", str(run_dir), str(tmp_path / "model")]) == 0
    assert "version 12 from the checkpoint, verified" in capsys.readouterr().out
    cfg = load_config(run_dir / "config.toml")
    backend = TransformersBackend.from_path(str(tmp_path / "model"), "bfloat16")
    problems = heldout_problems(cfg.task)
    ids = encode_heldout(backend, problems, cfg.sampling.max_tokens)
    assert heldout_accuracy(backend, problems, ids, exact_match, cfg.sampling.max_tokens)["accuracy"] == summary["accuracy_end"]
    assert main(["model", "export", str(run_dir), str(tmp_path / "v11"), "--version", "11", "--dtype", "float32"]) == 0
    assert "version 11 from the policy versions, verified" in capsys.readouterr().out
    (run_dir / "checkpoints" / "step-00000012" / "model.safetensors").write_bytes(b"torn")
    assert main(["model", "export", str(run_dir), str(tmp_path / "torn")]) == 2
    assert "checkpoint of step 12 does not verify" in capsys.readouterr().err


def test_a_lora_run_exports_merged_or_as_a_peft_adapter(tmp_path, capsys):
    """A LoRA run's version is its adapter: merged into the base it loads in transformers alone;
    as an adapter directory peft puts it on the base, and both answer the same logits."""
    import torch
    from peft import PeftModel

    from prl.cli import main
    from prl.models import load_model

    run_dir = tmp_path / "run"
    assert main(["run", "--run-dir", str(run_dir), "--max-steps", "2", "--no-progress", "--set", "learner.eval_every=0",
                 "--set", "learner.lora_rank=4", "--set", "learner.lr=1e-2"]) == 0
    assert main(["model", "export", str(run_dir), str(tmp_path / "merged"), "--dtype", "float32"]) == 0
    assert main(["model", "export", str(run_dir), str(tmp_path / "adapter"), "--lora", "adapter", "--dtype", "float32"]) == 0
    assert "a peft adapter directory" in capsys.readouterr().out
    merged = load_model(str(tmp_path / "merged"))
    adapted = PeftModel.from_pretrained(load_model("builtin:tiny-adder"), str(tmp_path / "adapter")).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        base, one, other = (m(input_ids=ids).logits for m in (load_model("builtin:tiny-adder"), merged, adapted))
    assert torch.allclose(one, other, atol=1e-4) and not torch.allclose(one, base, atol=1e-4)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "builtin:tiny-adder"  # model.path as the run's config names it


def test_an_announcement_the_broker_did_not_take_is_made_again_in_order(tmp_path):
    """A policy announcement whose publish is not acknowledged (the network failed) stays queued:
    the step that trained it goes on, the next step announces it first, and every version reaches
    the topic in order; before, the learner dropped it and the fleet waited for it for ever."""
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from prl.schemas import PolicyVersion, TrainBatch
    from prl.schemas.topics import POLICY
    from prl.transport import TransportError
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0, "learner.max_steps": 4})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    write_batches(str(tmp_path / "a.arrow"), [TrainBatch(f"b{i}", i, i, 0, random_rollouts(8, seed=i)) for i in range(4)])
    learner = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))
    flush, failures = learner.publisher.flush, iter([False, True, True])  # the 2nd and 3rd flushes after start fail

    def flaky_flush(*args, **kwargs):
        if next(failures, False):
            raise TransportError("publish not acknowledged: KafkaTimeoutError")
        return flush(*args, **kwargs)

    learner.publisher.flush = flaky_flush
    done, errors = False, 0
    while not done:
        try:
            done = learner.step()
        except TransportError:  # what Service.run does: count, back off, step again
            errors += 1
    sub = transport.subscriber([topic_name(cfg.run.name, POLICY)], group=None, from_beginning=True)
    versions = [decode(m.value, PolicyVersion).version for m in sub.poll(0.0)]
    assert errors + learner.counters.get("announcements_retried", 0) == 2  # both failures met a retry
    assert set(versions) == {0, 1, 2, 3, 4}  # none dropped (one may arrive twice: at least once)
    assert versions == sorted(versions)  # in order: a version is never announced before an older one


def test_a_learner_whose_state_exceeds_its_device_stops_at_the_start_in_one_line(tmp_path, monkeypatch, capsys):
    """Weights, gradients and AdamW state that cannot fit would run out of memory in the first
    step, after the producers had worked for it: `prl learner` says so before anything else."""
    import prl.learner.service as learner_service
    from prl.cli import main
    from prl.learner.sources import write_batches
    from prl.schemas import TrainBatch
    from tests.unit.test_grpo import random_rollouts

    config = tmp_path / "learner.toml"
    config.write_text(f'[run]\nrun_dir = "{tmp_path / "run"}"\n')
    write_batches(str(tmp_path / "a.arrow"), [TrainBatch("b0", 0, 0, 0, random_rollouts(4, seed=0))])
    monkeypatch.setattr(learner_service, "memory_bytes", lambda device: 1 << 20)
    assert main(["learner", "--config", str(config), "--batches-from", str(tmp_path / "a.arrow")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "prl learner: the learner's weights, gradients and AdamW state take 0.0 GiB (16 bytes a trained " \
                      "parameter) and cpu has 0.0 GiB: train a LoRA adapter (learner.lora_rank), or shard the learner " \
                      "over more GPUs (torchrun, deploy/k8s/README)"
    assert not (tmp_path / "run" / "policy").exists()  # nothing announced or written


def test_a_step_out_of_device_memory_stops_the_learner_with_what_to_change(tmp_path, monkeypatch):
    import torch

    import prl.learner.service as learner_service
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from prl.schemas import TrainBatch
    from prl.service import ServiceStopped
    from tests.unit.test_grpo import random_rollouts

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0})
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    write_batches(str(tmp_path / "a.arrow"), [TrainBatch("b0", 0, 0, 0, random_rollouts(6, seed=0))])
    learner = Learner(cfg, transport, batches_from=str(tmp_path / "a.arrow"))

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.27 GiB")

    monkeypatch.setattr(learner_service, "train_step", out_of_memory)
    with pytest.raises(ServiceStopped) as stopped:
        learner.step()
    assert str(stopped.value).startswith("the learner ran out of cpu memory in step 1 (6 rollouts, the longest ")
    assert "lower learner.micro_batch_tokens (16384), set learner.activation_checkpointing = true, or train a LoRA" \
           in str(stopped.value)
    assert learner.version == 0


def test_a_start_that_fails_leaves_the_run_directorys_config_as_it_was(tmp_path, capsys):
    """A typo in a --set stops `prl run` in one line; it used to be kept as the directory's
    config.toml first, so the same command without the typo failed on it again, and the run's
    summary and curves were removed."""
    from prl.cli import main

    argv = ["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--max-steps", "1", "--set", "learner.eval_every=0"]
    assert main(argv + ["--set", 'producer.reward="prl.rewards:typo"']) == 2
    assert "prl.rewards has no typo" in capsys.readouterr().err
    assert main(argv) == 0
    kept = {name: (tmp_path / "run" / name).read_bytes() for name in ("config.toml", "summary.json", "priority_histogram.png")}
    assert main(argv[:-4] + ["--max-steps", "2", "--set", 'model.path="/nowhere"']) == 2
    assert kept == {name: (tmp_path / "run" / name).read_bytes() for name in kept}


@pytest.mark.parametrize("change", ["learner.lora_rank=8", "learner.lora_rank=0"])
def test_a_run_continued_with_a_checkpoint_that_does_not_fit_is_one_line(tmp_path, capsys, change):
    """Continued with another learner.lora_rank (or model.path), the learner's checkpoint does not
    fit its model or optimizer: that was a traceback from load_state or from torch's optimizer."""
    from prl.cli import main

    argv = ["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--set", "learner.eval_every=0"]
    first = "learner.lora_rank=0" if change.endswith("=8") else "learner.lora_rank=8"
    assert main(argv + ["--max-steps", "2", "--set", first]) == 0
    capsys.readouterr()
    assert main(argv + ["--max-steps", "4", "--set", change]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"prl run: {tmp_path / 'run'}/checkpoints/step-00000002 does not fit this model (")
    assert err.endswith("continue the run with the model.path and learner.lora_rank it started with, or give a new run_dir")


def test_a_run_directory_started_with_relative_paths_serves_every_command_from_anywhere(tmp_path, monkeypatch, capsys):
    """`prl run` started in a project directory with a relative model.path: continuing the run
    and exporting its model from another directory found no model (config.toml kept the path as
    given, which names the model only from where the run started)."""
    import shutil

    from prl.cli import main
    from prl.models import BUILTIN

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    shutil.copytree(BUILTIN["builtin:tiny-adder"], project / "models" / "adder")
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    argv = ["--no-progress", "--set", "learner.eval_every=0"]
    assert main(["run", "--run-dir", "runs/a", "--max-steps", "1", "--set", 'model.path="models/adder"', *argv]) == 0
    monkeypatch.chdir(elsewhere)
    run_dir = str(project / "runs" / "a")
    assert main(["run", "--run-dir", run_dir, "--max-steps", "2", *argv]) == 0
    assert main(["model", "export", run_dir, "exported"]) == 0, capsys.readouterr().err
    assert (elsewhere / "exported" / "config.json").exists()


def test_a_run_that_fails_still_draws_the_curves_of_what_it_did(tmp_path, monkeypatch):
    """A service failing after some steps stops `prl run` with its error; the learning curve of
    the steps before it is drawn (it was not, and a continued run had removed the earlier one)."""
    from prl.cli import main
    from prl.scheduler.service import Scheduler

    publish = Scheduler.publish_batch

    def failing_later(self, batch):
        if batch.seq >= 3 and self.evaluator.done():  # after steps and an evaluation to draw
            raise RuntimeError("a bug in the scheduler")
        publish(self, batch)

    monkeypatch.setattr(Scheduler, "publish_batch", failing_later)
    with pytest.raises(RuntimeError, match="a bug in the scheduler"):
        main(["run", "--run-dir", str(tmp_path / "run"), "--max-steps", "50", "--no-progress"])
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 0
