"""Fuzz: 10,000 malformed messages into every consumed topic over a real broker (2,000 on the
in-memory transport, which runs the same services' code without one). No service crashes, every
message is dead-lettered with its reason and source offset, and training goes on."""

import json
import os
import random
import threading
import time
import uuid
from collections import Counter

import pytest

from tests.support.addition import small_addition
from prl.learner.service import Learner
from prl.producers.service import Producer
from prl.transport.kafka import KafkaTransport
from prl.transport.memory import MemoryBroker, MemoryTransport
from prl.scheduler.service import Scheduler
from prl.schemas import (DeadLetter, DecodeError, Dispatch, PolicyVersion, Rollout, RolloutGroup, Sampling, TrainBatch,
                     TrainRollout, decode, encode, topic_name)
from prl.schemas.config import load_config
from prl.schemas.records import encode_table, to_table
from prl.schemas.topics import BATCHES, DEADLETTER, POLICY, PROBLEMS, ROLLOUTS
from tests.support.servers import wait_until

pytestmark = pytest.mark.slow
PER_TOPIC = {"kafka": 10_000, "memory": 2_000}  # PRL_FUZZ_PER_TOPIC sets both
MAX_BYTES = 16384
EXPECTED = {PROBLEMS: Dispatch, ROLLOUTS: RolloutGroup, BATCHES: TrainBatch, POLICY: PolicyVersion}


def rollout_group(problem_id="add1:1+1", version=0, reward=1.0):
    return RolloutGroup("d", problem_id, version, "x", [1], 1.0, [Rollout([3], [-0.1], reward, "stop")])


GOOD = {
    PROBLEMS: Dispatch("d", "p", "1+1=", "2", 4, Sampling(), 0),
    ROLLOUTS: rollout_group(),
    BATCHES: TrainBatch("b", 0, 0, 0, [TrainRollout("r", "p", 0, False, 1.0, 1.0, 1.0, [1], [3], [-0.1])]),
    POLICY: PolicyVersion(1, "", 0),
}
BAD_VALUES = {  # decode as Arrow, fail validation (or name a problem the scheduler does not have)
    PROBLEMS: [Dispatch("d", "p", "x", "y", 0, Sampling(), 0)],
    ROLLOUTS: [rollout_group(reward=float("nan")), rollout_group(version=-3), rollout_group(problem_id="no-such-problem")],
    BATCHES: [TrainBatch("b", -2, 0, 0, [])],
    POLICY: [PolicyVersion(-1, "", 0)],
}


def with_schema_version(record, version: str) -> bytes:
    table = to_table([record], type(record))
    return encode_table(table.replace_schema_metadata({**table.schema.metadata, b"schema_version": version.encode()}))


def bit_flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def rejected(data: bytes, kind: str) -> bool:
    if len(data) > MAX_BYTES:
        return True
    try:
        record = decode(data, EXPECTED[kind])
    except DecodeError:
        return True
    return kind == ROLLOUTS and record.problem_id == "no-such-problem"


def malformed(kind: str, rng: random.Random, n: int) -> list[bytes]:
    """Garbage, truncations, wrong kind, wrong schema version, bad values, bit flips, oversized;
    each candidate kept only if the consumer must reject it (a truncation that stops right
    after the record, or a flip inside free text, is still a valid message)."""
    good = encode(GOOD[kind])
    makers = [
        lambda: rng.randbytes(rng.randint(0, 300)),
        lambda: good[: rng.randint(0, len(good) - 1)],
        lambda: encode(DeadLetter("t", 0, 0, "r", "", "s", None, b"", 0.0)),
        lambda: encode(rng.choice(BAD_VALUES[kind])),
        lambda: bit_flip(good, rng),
        lambda: b"\xff" * (MAX_BYTES + 1),
        lambda: with_schema_version(GOOD[kind], rng.choice(["0", "2", "", "x"])),
    ]
    out = []
    for i in range(n):
        while not rejected(candidate := makers[i % len(makers)](), kind):
            pass
        out.append(candidate)
    return out


def messages_per_topic(transport: str) -> int:
    return int(os.environ.get("PRL_FUZZ_PER_TOPIC", PER_TOPIC[transport]))


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def transport_cfg(request, tmp_path):
    overrides = [
        f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "scheduler.groups_per_batch=4", "scheduler.max_in_flight=8",
        "learner.eval_every=0", *small_addition(tmp_path / "data"), f"transport.kafka.max_message_bytes={MAX_BYTES}",
        "learner.max_steps=1000000", "scheduler.replay.warmup_updates=0", f"run.name=\"fuzz{uuid.uuid4().hex[:8]}\"",
    ]  # max_steps out of reach: every service serves until the test has its three steps and every dead letter
    # (at 1,000 the tiny model's learner finished first once, in a CI run where the dead letters took 8 minutes)
    if request.param == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        overrides += [f"transport.kafka.bootstrap_servers=\"{broker.bootstrap}\"",
                      "transport.kafka.session_timeout_ms=3000"]
    cfg = load_config(overrides=overrides)
    if request.param == "kafka":
        # The injector may send what the services' own limit forbids (that is the oversized case).
        injector = KafkaTransport(cfg.transport.kafka.model_copy(update={"max_message_bytes": 1 << 20}))
        yield cfg, KafkaTransport(cfg.transport.kafka), injector, messages_per_topic("kafka")
        injector.close()
    else:
        transport = MemoryTransport(MemoryBroker())
        yield cfg, transport, transport, messages_per_topic("memory")


def test_fuzzed_topics_are_dead_lettered_and_training_goes_on(transport_cfg):
    cfg, transport, injector, per_topic = transport_cfg
    transport.ensure_topics(cfg.run.name)
    injected = inject(cfg, injector, per_topic)
    services = [Scheduler(cfg, transport), Producer(cfg, transport), Learner(cfg, transport)]
    stop = threading.Event()
    threads = [threading.Thread(target=svc.run, args=(stop,), daemon=True) for svc in services]
    for t in threads:
        t.start()
    consumers = 5  # problems: producer; rollouts: scheduler; batches: learner; policy: scheduler and producer
    reader = DeadLetters(transport, topic_name(cfg.run.name, DEADLETTER))
    letters = reader.values  # decoded once the services stop: not while they share this process

    def done():
        assert all(t.is_alive() for t in threads[:2]), f"a service stopped (the learner at step {services[2].version})"
        reader.poll()
        return services[2].version >= 3 and len(letters) >= consumers * per_topic

    try:
        try:
            wait_until(done, 900, "three training steps and every malformed message dead-lettered", 0)
        except TimeoutError as exc:  # say where it stopped (one run in CI stalled here, cause not found)
            seen = Counter((d.service, d.source_topic.rsplit(".", 1)[-1]) for d in (decode(v, DeadLetter) for v in letters))
            raise TimeoutError(f"{exc}: learner at step {services[2].version}; dead letters by (service, topic) "
                               f"{dict(seen)}, each consumer should reach {per_topic}") from None
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        reader.close()
    assert services[2].version >= 3 and not any(t.is_alive() for t in threads)
    assert_each_dead_lettered_once_with_its_bytes([decode(v, DeadLetter) for v in letters], injected)


class DeadLetters:
    """The dead-letter topic read from its start. A reader that has had nothing new for
    STUCK_S reads it again from the start: in one CI run this test's reader stopped 2 short of
    50,000 while the topic held all of them (a fresh consumer read every one; the tansu broker's
    end offset said 49,999), and the test timed out though every service had done its part."""

    STUCK_S = 60.0

    def __init__(self, transport, topic: str):
        self.transport, self.topic, self.values = transport, topic, []
        self.start()

    def start(self) -> None:
        self.subscriber = self.transport.subscriber([self.topic], group=None)
        self.values.clear()
        self.grew_at = time.monotonic()

    def poll(self) -> None:
        new = [m.value for m in self.subscriber.poll(0.2, max_records=5000)]
        self.values.extend(new)
        if new:
            self.grew_at = time.monotonic()
        elif time.monotonic() - self.grew_at > self.STUCK_S:
            self.subscriber.close()
            self.start()

    def close(self) -> None:
        self.subscriber.close()


def inject(cfg, injector, per_topic: int) -> dict[str, list[bytes]]:
    """Malformed messages on every consumed topic, all there before any service starts
    (offsets 0..N-1 of one partition); returns them by topic kind."""
    rng = random.Random(0)
    pub = injector.publisher()
    injected = {kind: malformed(kind, rng, per_topic) for kind in EXPECTED}
    for kind, messages in injected.items():
        for m in messages:
            pub.publish(topic_name(cfg.run.name, kind), m, key=b"fuzz")
    pub.flush()
    return injected


def assert_each_dead_lettered_once_with_its_bytes(dead: list, injected: dict) -> None:
    by_consumer = Counter((d.source_topic.rsplit(".", 1)[1], d.service) for d in dead)
    n = len(injected[PROBLEMS])
    assert by_consumer == {(PROBLEMS, "producer"): n, (ROLLOUTS, "scheduler"): n, (BATCHES, "learner"): n,
                           (POLICY, "scheduler"): n, (POLICY, "producer"): n}
    for d in dead:  # each kept byte for byte (an oversized one: its head), with where it came from and why
        original = injected[d.source_topic.rsplit(".", 1)[1]][d.offset]
        assert d.reason and (d.original == original or (d.reason == "oversized" and original.startswith(d.original)))
    assert len({(d.source_topic, d.service, d.offset) for d in dead}) == len(dead)
    reasons = Counter(d.reason for d in dead)
    assert {"not_arrow", "wrong_kind", "wrong_schema_version", "invalid_value", "oversized", "unknown_problem"} <= set(reasons)
    print(f"\nfuzz: {sum(by_consumer.values())} dead-lettered, reasons {dict(reasons)}")
