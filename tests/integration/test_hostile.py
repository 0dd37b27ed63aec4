"""No single message takes over the producers or stalls the learner.

Each test writes one hostile message to a topic of a run on the in-memory transport (the
same services as over Kafka; tests/integration/test_faults.py has the end-to-end cases on
the test broker), then asserts that it was dead-lettered with its reason, that the service
is still up and serving, and that the weights are still the real, finite ones."""

import dataclasses
import json
import math
import time

import pytest
import torch

from tests.support.addition import small_addition
from prl.learner.service import Learner
from prl.producers.service import Producer
from prl.models import export_state, load_model, resolve_model_dir
from prl.transport.memory import MemoryBroker, MemoryTransport
from prl.scheduler.service import Scheduler
from prl.schemas import (DeadLetter, Dispatch, PolicyVersion, Rollout, RolloutGroup, Sampling, TrainBatch, TrainRollout,
                     decode, encode, headers, topic_name)
from prl.schemas.config import load_config
from prl.schemas.topics import BATCHES, DEADLETTER, POLICY, PROBLEMS, ROLLOUTS


def config(tmp_path, **extra):
    return load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "learner.eval_every=0",
                                  "scheduler.groups_per_batch=2", "scheduler.max_in_flight=4",
                                  *small_addition(tmp_path / "data", (10, 10)), *(f"{k}={v}" for k, v in extra.items())])


class Run:
    """A run's topics on the in-memory transport, with a way in for hostile messages."""

    def __init__(self, cfg):
        self.cfg, self.broker = cfg, MemoryBroker()
        self.transport = MemoryTransport(self.broker)
        self.transport.ensure_topics(cfg.run.name)
        self.publisher = self.transport.publisher()

    def inject(self, kind: str, record_or_bytes, key: bytes = b"x", extra_headers=()) -> None:
        value = record_or_bytes if isinstance(record_or_bytes, bytes) else encode(record_or_bytes)
        hdrs = ([] if isinstance(record_or_bytes, bytes) else headers(record_or_bytes)) + list(extra_headers)
        self.publisher.publish(topic_name(self.cfg.run.name, kind), value, key=key, headers=hdrs)

    def dead(self) -> list[DeadLetter]:
        return [decode(m.value, DeadLetter) for part in self.broker.partitions(topic_name(self.cfg.run.name, DEADLETTER))
                for m in part]


def rollout(version=0, temperature=1.0, logprobs=(-0.5, -0.25), advantage=1.0, rid="r"):
    return TrainRollout(rid, "add1:1+1", version, False, advantage, 1.0, temperature, [1, 4, 14, 4, 15],
                        [5, 2], list(logprobs))


def finite(model) -> bool:
    return all(torch.isfinite(p).all() for p in model.parameters())


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# -- the learner -------------------------------------------------------------------------------
@pytest.mark.parametrize("case, batch, reason", [
    ("NaN behaviour log-prob", TrainBatch("b", 0, 0, 1, [rollout(logprobs=(math.nan, -0.1))]), "invalid_value"),
    ("a behaviour log-prob of -1e30", TrainBatch("b", 0, 0, 1, [rollout(logprobs=(-1e30, -0.1))]), "invalid_value"),
    ("a rollout past the model's context", TrainBatch("b", 0, 0, 1, [dataclasses.replace(
        rollout(), completion_ids=[5] * 10_000, logprobs=[-0.5] * 10_000)]), "invalid_value"),
    ("temperature 0", TrainBatch("b", 0, 0, 1, [rollout(temperature=0.0)]), "invalid_value"),
    ("mixed temperatures", TrainBatch("b", 0, 0, 1, [rollout(rid="a"), rollout(rid="b", temperature=0.7)]), "invalid_value"),
    ("no rollouts", TrainBatch("b", 0, 0, 1, []), "invalid_value"),
    ("seq 2^31-1", TrainBatch("b", 2**31 - 1, 0, 1, [rollout()]), "outside_window"),
    ("a rollout from the future", TrainBatch("b", 0, 0, 1, [rollout(version=5)]), "future_rollout"),
])
def test_learner_refuses_a_poisoned_batch_and_trains_the_next(tmp_path, case, batch, reason):
    """The poisoned batch is dead-lettered before a step: the weights are unchanged and
    finite, the batch window is not moved, and the next good batch is trained."""
    run = Run(config(tmp_path))
    learner = Learner(run.cfg, run.transport)
    before = load_model(run.cfg.model.path)
    run.inject(BATCHES, batch)
    learner.step()
    assert [d.reason for d in run.dead()] == [reason], case
    assert learner.version == 0 and learner.last_seq == -1 and same_weights(learner.model, before)
    run.inject(BATCHES, TrainBatch("good", 0, 0, 1, [rollout(rid="g1", advantage=1.0), rollout(rid="g2", advantage=-1.0)]))
    learner.step()
    assert learner.version == 1 and learner.last_seq == 0 and finite(learner.model)


def test_a_batch_whose_gradient_overflows_is_stepped_over_with_a_warning(tmp_path):
    """Valid on the wire, an advantage of 1e38 (no GRPO group makes one) overflows the
    gradient: the learner keeps its weights, says so, announces the version (the same
    weights) and trains the next batch."""
    import structlog

    run = Run(config(tmp_path))
    learner = Learner(run.cfg, run.transport)
    before = load_model(run.cfg.model.path)
    run.inject(BATCHES, TrainBatch("huge", 0, 0, 1, [rollout(rid="h1", advantage=1e38), rollout(rid="h2", advantage=-1e38)]))
    with structlog.testing.capture_logs() as logs:
        learner.step()
    assert [e["step"] for e in logs if e["event"] == "step_skipped"] == [1]
    assert learner.version == 1 and same_weights(learner.model, before)
    run.inject(BATCHES, TrainBatch("good", 1, 1, 1, [rollout(rid="g1", advantage=1.0), rollout(rid="g2", advantage=-1.0)]))
    learner.step()
    assert learner.version == 2 and finite(learner.model) and not same_weights(learner.model, before)


def test_learner_refuses_an_all_stale_batch_without_moving_its_window(tmp_path):
    run = Run(config(tmp_path, **{"scheduler.tau_max": 1}))
    learner = Learner(run.cfg, run.transport)
    learner.version = 5  # as if it had trained five steps
    run.inject(BATCHES, TrainBatch("old", 0, 0, 1, [rollout(version=0)]))
    learner.step()
    assert [d.reason for d in run.dead()] == ["stale_batch"] and learner.last_seq == -1


# -- the producers -----------------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [Sampling(0.0, 1.0, 4, []), Sampling(math.nan, 1.0, 4, []),
                                      Sampling(1.0, 1.0, 2**30, []), Sampling(1.0, 0.0, 4, [])],
                         ids=["temperature 0", "temperature NaN", "max_tokens 2^30", "top_p 0"])
def test_producer_dead_letters_a_poisoned_dispatch_and_serves_the_next(tmp_path, sampling):
    run = Run(config(tmp_path))
    producer = Producer(run.cfg, run.transport)
    run.inject(PROBLEMS, Dispatch("bad", "add1:1+1", "1+1=", "2", 4, sampling, 0))
    run.inject(PROBLEMS, Dispatch("good", "add1:1+1", "1+1=", "2", 4, Sampling(1.0, 1.0, 4, []), 0))
    producer.step()
    assert [d.reason for d in run.dead()] == ["invalid_value"]
    groups = [decode(m.value, RolloutGroup) for p in run.broker.partitions(topic_name(run.cfg.run.name, ROLLOUTS)) for m in p]
    assert [g.dispatch_id for g in groups] == ["good"]


def version_of(cfg, version: int, model=None) -> PolicyVersion:
    """A real policy version of the run (as the learner writes it) and its announcement."""
    from prl.policy import PolicyWriter

    model = model or load_model(cfg.model.path)
    out = PolicyWriter(cfg.run.run_dir, cfg.model.dtype).publish(version, export_state(model))
    return PolicyVersion(version, out.uri, version - 1, time.time(), out.kind, out.checksum)


@pytest.mark.parametrize("case", ["outside the run", "http", "unknown scheme", "dot-dot", "huge version",
                                  "another model's weights", "empty uri", "unsigned"])
def test_producer_keeps_the_real_policy(tmp_path, case):
    """Announcements the learner did not make are refused (dead-lettered, or ignored when
    they name no version); the producer keeps the real policy and then loads the next
    real one."""
    extra = {"transport.signed_kinds": '["policy"]'} if case == "unsigned" else {}
    env = {"PRL_KEY_POLICY": "k3y"} if case == "unsigned" else {}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        run = Run(config(tmp_path, **extra))
        producer = Producer(run.cfg, run.transport)
        record = version_of(run.cfg, 1)
        hostile = hostile_announcement(case, run.cfg, tmp_path, record)
        run.inject(POLICY, hostile)
        producer.step()
        assert producer.backend.version == 0 and finite(producer.backend.model)
        assert len(run.dead()) == (0 if case == "empty uri" else 1)
        sig = producer.signer.headers(POLICY, topic_name(run.cfg.run.name, POLICY), encode(record))
        run.inject(POLICY, record, key=run.cfg.run.name.encode(), extra_headers=sig)
        producer.step()
        assert producer.backend.version == 1


def hostile_announcement(case: str, cfg, tmp_path, real: PolicyVersion) -> PolicyVersion:
    other = tmp_path / "elsewhere" / "policy" / "v-00000001"
    uri = {
        "outside the run": f"file://{other}",
        "http": "http://evil.example/policy/v-00000001",
        "unknown scheme": "nosuch://bucket/run/policy/v-00000001",
        "dot-dot": real.uri.replace("policy/", "policy/../policy/"),
        "huge version": real.uri.replace("v-00000001", "v-1000000000"),
        "empty uri": "",
        "unsigned": real.uri,
    }.get(case)
    version = 1_000_000_000 if case == "huge version" else 1
    if case == "another model's weights":
        from tests.support.chat_model import make_chat_model

        return version_of(cfg, 2, model=load_model(str(make_chat_model(tmp_path / "other-model"))))
    return PolicyVersion(version, uri, 0, time.time(), real.kind if uri else "", real.weights_checksum if uri else "")


def test_producer_refuses_a_version_that_is_not_what_it_claims(tmp_path):
    """A copy of version 4 announced as version 5 (its version.json says 4), and version 6 with
    torn weights (the manifest's checksum does not match): both refused, the producer keeps
    version 4's weights."""
    import dataclasses
    import shutil

    run = Run(config(tmp_path))
    producer = Producer(run.cfg, run.transport)
    four = version_of(run.cfg, 4)
    run.inject(POLICY, four)
    producer.step()
    assert producer.backend.version == 4
    five = four.uri.replace("v-00000004", "v-00000005")
    shutil.copytree(four.uri.removeprefix("file://"), five.removeprefix("file://"))
    run.inject(POLICY, dataclasses.replace(four, version=5, uri=five))
    six = version_of(run.cfg, 6)
    with open(six.uri.removeprefix("file://") + "/weights.safetensors", "r+b") as f:
        f.seek(-16, 2)
        f.write(b"\xff" * 16)
    run.inject(POLICY, six)
    producer.step()
    assert sorted(d.reason for d in run.dead()) == ["unloadable_version", "version_mismatch"]
    assert producer.backend.version == 4 and finite(producer.backend.model)


# -- the scheduler -----------------------------------------------------------------------------
@pytest.mark.parametrize("record, problem", [
    (PolicyVersion(2**31 - 1, "", 5, 0.0), "batches 0..-1 were published"),
    (PolicyVersion(3, "", -1, 0.0), "more steps than the 0 batches trained since"),
    (PolicyVersion(0, "nosuch://x/policy/v-00000000", -1, 0.0, "full", "crc32c:00000000"), "scheme 'nosuch'"),
])
def test_scheduler_follows_only_announcements_the_learner_can_have_made(tmp_path, record, problem):
    """A huge version or batch number, or a foreign checkpoint, is dead-lettered: the
    scheduler keeps its view of the learner, stays within max_batches_ahead, and its
    snapshot still reads back."""
    from prl.scheduler.snapshot import read_snapshot

    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    run.inject(POLICY, record, key=run.cfg.run.name.encode())
    scheduler.step()
    dead = run.dead()
    assert [d.reason for d in dead] == ["implausible_policy"] and problem in dead[0].detail
    assert (scheduler.learner_version, scheduler.learner_last_seq) == (0, -1)
    scheduler.snapshot()
    assert read_snapshot(run.cfg.run.run_dir)[0]["learner_version"] == 0


def test_scheduler_dead_letters_rollouts_from_a_version_the_learner_has_not_made(tmp_path):
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    pid = scheduler.problems[flight.problem].id
    run.inject(ROLLOUTS, RolloutGroup(did, pid, 999, "p", [1, 3], 1.0, [Rollout([4, 2], [-0.1, -0.1], 1.0, "stop")]))
    scheduler.step()
    assert [d.reason for d in run.dead()] == ["future_version"] and did in scheduler.in_flight


@pytest.mark.parametrize("rewards, reason", [([1.0, 0.0], ["missing_completions"]), ([0.0, 0.0], [])],
                         ids=["a signal without completions", "rewards only, no signal"])
def test_scheduler_trains_no_group_without_completions(tmp_path, rewards, reason):
    """A group that could be trained must carry its completions; a rewards-only group of no
    signal (what producers send with drop_zero_signal_completions) counts in the statistics."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    pid = scheduler.problems[flight.problem].id
    rewards = rewards * (flight.group_size // len(rewards))  # the size the dispatch asked for
    run.inject(ROLLOUTS, RolloutGroup(did, pid, 0, "p", [1, 3], 1.0, [Rollout([], [], r, "stop") for r in rewards]))
    scheduler.step()
    assert [d.reason for d in run.dead()] == reason
    assert (did in scheduler.in_flight) == bool(reason) and scheduler.groups_returned == (not reason)


@pytest.mark.parametrize("size", [1, 9], ids=["fewer", "more"])
def test_scheduler_dead_letters_a_group_of_another_size_than_asked(tmp_path, size):
    """A group of more (or fewer) completions than its dispatch asked for would weigh its
    problem's statistics and the batch by what its producer chose: dead-lettered, and the
    dispatch stays in flight (re-dispatched when it times out)."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    pid = scheduler.problems[flight.problem].id
    rollouts = [Rollout([4, 2], [-0.1, -0.1], float(i % 2), "stop") for i in range(size)]
    run.inject(ROLLOUTS, RolloutGroup(did, pid, 0, "p", [1, 3], 1.0, rollouts))
    scheduler.step()
    dead = run.dead()
    assert [d.reason for d in dead] == ["wrong_group_size"] and "8 were asked for" in dead[0].detail
    assert did in scheduler.in_flight and scheduler.groups_returned == 0


@pytest.mark.parametrize("temperature, tokens, detail", [(0.7, 2, "temperature 0.7"), (1.0, 10_000, "10000 tokens")],
                         ids=["another temperature", "past max_tokens"])
def test_scheduler_dead_letters_a_group_not_sampled_as_asked(tmp_path, temperature, tokens, detail):
    """A group at another temperature, or with a completion longer than sampling.max_tokens,
    would spoil the whole batch it joined (the learner refuses mixed temperatures and rollouts
    past the context): dead-lettered, and the dispatch stays in flight."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    pid = scheduler.problems[flight.problem].id
    rollouts = [Rollout([4] * tokens, [-0.1] * tokens, float(i % 2), "stop") for i in range(flight.group_size)]
    run.inject(ROLLOUTS, RolloutGroup(did, pid, 0, "p", [1, 3], temperature, rollouts))
    scheduler.step()
    dead = run.dead()
    assert [d.reason for d in dead] == ["not_as_asked"] and detail in dead[0].detail
    assert did in scheduler.in_flight and scheduler.groups_returned == 0


@pytest.mark.parametrize("environment, prompt, completion", [("", 60, 8), ("prl.environments:Calculator", 4, 70)],
                         ids=["a prompt past the context", "an episode past the context"])
def test_scheduler_dead_letters_a_group_past_the_models_context(tmp_path, environment, prompt, completion):
    """The model (tiny-adder) takes 64 positions. A group whose prompt and completion, or whose
    multi-turn episode (no sampling.max_tokens bounds it), is longer would make the learner refuse
    the whole batch it joined: dead-lettered, the dispatch stays in flight."""
    run = Run(config(tmp_path, **({"task.environment": json.dumps(environment)} if environment else {})))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    pid = scheduler.problems[flight.problem].id
    rollouts = [Rollout([4] * completion, [-0.1] * completion, float(i % 2), "stop") for i in range(flight.group_size)]
    run.inject(ROLLOUTS, RolloutGroup(did, pid, 0, "p", [1] * prompt, 1.0, rollouts))
    scheduler.step()
    dead = run.dead()
    assert [d.reason for d in dead] == ["not_as_asked"] and "over the model's context of 64" in dead[0].detail
    assert did in scheduler.in_flight and scheduler.groups_returned == 0


def test_scheduler_dead_letters_a_group_for_another_problem_than_its_dispatch(tmp_path):
    """A result is counted and trained under its dispatch's problem: one that names another
    problem (its prompt and rewards are that problem's) is dead-lettered, and the dispatch stays
    in flight."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    did, flight = next(iter(scheduler.in_flight.items()))
    other = next(p.id for i, p in enumerate(scheduler.problems) if i != flight.problem)
    rollouts = [Rollout([4, 2], [-0.1, -0.1], float(i % 2), "stop") for i in range(flight.group_size)]
    run.inject(ROLLOUTS, RolloutGroup(did, other, 0, "p", [1, 3], 1.0, rollouts))
    scheduler.step()
    assert [d.reason for d in run.dead()] == ["wrong_problem"]
    assert did in scheduler.in_flight and scheduler.groups_returned == 0


@pytest.mark.parametrize("rewards, kept", [([0.0] * 4, False), ([1.0, 0.0] * 2, True)], ids=["all wrong", "mixed"])
def test_producer_sends_rewards_only_for_a_group_without_signal(tmp_path, rewards, kept):
    run = Run(config(tmp_path, **{"producer.drop_zero_signal_completions": "true"}))
    producer = Producer(run.cfg, run.transport)
    scores = iter(rewards)
    producer.reward.fn = lambda text, answer: next(scores)
    run.inject(PROBLEMS, Dispatch("d", "add1:1+1", "1+1=", "2", 4, Sampling(1.0, 1.0, 4, []), 0))
    producer.step()
    [group] = [decode(m.value, RolloutGroup) for p in run.broker.partitions(topic_name(run.cfg.run.name, ROLLOUTS)) for m in p]
    assert group.rewards == rewards
    assert all((len(r.completion_ids) > 0 and len(r.logprobs) > 0) == kept for r in group.rollouts)


def test_signed_kinds_need_their_key_at_start(tmp_path, monkeypatch):
    from prl.service import ServiceStopped

    monkeypatch.delenv("PRL_KEY_BATCHES", raising=False)
    run = Run(config(tmp_path, **{"transport.signed_kinds": '["batches"]'}))
    with pytest.raises(ServiceStopped, match="PRL_KEY_BATCHES is not set"):
        Learner(run.cfg, run.transport)


def test_unsigned_and_forged_batches_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PRL_KEY_BATCHES", "scheduler-secret")
    run = Run(config(tmp_path, **{"transport.signed_kinds": '["batches"]'}))
    learner = Learner(run.cfg, run.transport)
    batch = TrainBatch("b", 0, 0, 1, [rollout(rid="a"), rollout(rid="b", advantage=-1.0)])
    run.inject(BATCHES, batch)
    run.inject(BATCHES, batch, extra_headers=[("signature", b"0" * 64)])
    learner.step()
    learner.step()
    assert [d.reason for d in run.dead()] == ["unsigned", "bad_signature"] and learner.version == 0
    topic = topic_name(run.cfg.run.name, BATCHES)
    run.inject(BATCHES, batch, extra_headers=learner.signer.headers(BATCHES, topic, encode(batch)))
    learner.step()
    assert learner.version == 1


def test_a_starting_producer_catches_up_to_the_newest_policy_first(tmp_path, monkeypatch):
    """A producer (re)started after several announcements reads the policy topic to its end
    and loads only the newest valid version, before it takes any dispatch."""
    from prl.generation import TransformersBackend

    run = Run(config(tmp_path))
    for v in (1, 2, 3):
        run.inject(POLICY, version_of(run.cfg, v), key=run.cfg.run.name.encode())
    run.inject(POLICY, PolicyVersion(4, f"file://{tmp_path}/other/policy/v-00000004", 3, 0.0, "full",
                                     "crc32c:00000000"))  # not the run's
    loaded = []
    real = TransformersBackend.load_state
    monkeypatch.setattr(TransformersBackend, "load_state", lambda self, t, v: loaded.append(v) or real(self, t, v))
    producer = Producer(run.cfg, run.transport)
    assert loaded == [3] and producer.backend.version == 3
    assert [d.reason for d in run.dead()] == ["version_outside_run"]
