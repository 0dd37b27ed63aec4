"""One writer per role: a second scheduler or learner started while the first still runs
(a rollout's overlap, a zombie back from a partition) fences the first. Nothing the first
publishes afterwards is used, and the first stops at its next write."""

import dataclasses

import pytest

from prl.service import ServiceStopped
from prl.transport.memory import MemoryBroker, MemoryTransport
from prl.schemas import DeadLetter, PolicyVersion, TrainBatch, decode, encode, headers, topic_name
from prl.schemas.topics import BATCHES, DEADLETTER, POLICY
from tests.integration.test_pipeline import small_config
from tests.support.servers import wait_until


def dead_letters(broker, cfg) -> list[tuple[str, str]]:
    return [(d.service, d.reason) for d in (decode(m.value, DeadLetter)
                                            for part in broker.partitions(topic_name(cfg.run.name, DEADLETTER)) for m in part)]


@pytest.fixture
def run(tmp_path):
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    cfg = small_config(tmp_path, **{"scheduler.replay.ratio": 0, "learner.max_steps": 50, "learner.checkpoint_every": 1})
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    transport.ensure_topics(cfg.run.name)
    services = {"scheduler": Scheduler(cfg, transport), "producer": Producer(cfg, transport),
                "learner": Learner(cfg, transport)}
    return cfg, broker, transport, services


def rebalance(broker, group: str) -> None:
    """What Kafka does when a group member goes: the others resume at the committed offsets
    (the in-memory broker shares one cursor per group and would not)."""
    for key in [k for k in broker._handed if k[0] == group]:
        broker._handed[key] = broker.committed.get(key, 0)


def step_until(services, done, what: str) -> None:
    def stepped():
        for svc in services.values():
            svc.step()
        return done()

    wait_until(stepped, 120, what)


def test_a_replaced_scheduler_gets_no_batch_trained_and_stops(run):
    from prl.scheduler.service import Scheduler

    cfg, broker, transport, services = run
    learner, old = services["learner"], services["scheduler"]
    step_until(services, lambda: learner.version >= 2, "two learner steps")
    new = Scheduler(cfg, transport)  # the first one still runs
    assert new.epoch == old.epoch + 1
    batches = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group=None).poll(0.0)
    trained = decode(batches[-1].value, TrainBatch)
    zombie = dataclasses.replace(trained, batch_id="zombie", seq=learner.last_seq + 1,
                                 rollouts=[dataclasses.replace(r, is_replay=True) for r in trained.rollouts])
    old.publish_batch(zombie)  # what the first one sends before it notices: the batch the learner expects next
    version = learner.version
    wait_until(lambda: learner.step() or ("learner", "fenced_epoch") in dead_letters(broker, cfg), 30, "the zombie's batch refused")
    assert learner.version == version
    with pytest.raises(ServiceStopped, match="another scheduler took over"):
        for _ in range(200):
            old.step()
            services["producer"].step()
    services["scheduler"] = new
    rebalance(broker, f"{cfg.run.name}.scheduler")
    step_until(services, lambda: learner.version >= version + 3, "the learner to go on with the new scheduler")


def test_a_replaced_learner_gets_no_version_served_and_stops(run):
    from prl.learner.service import Learner

    cfg, broker, transport, services = run
    old = services["learner"]
    step_until(services, lambda: old.version >= 3, "three learner steps")
    new = Learner(cfg, transport)
    assert new.epoch == old.epoch + 1
    forged = PolicyVersion(old.version + 1, "", old.last_seq, epoch=old.epoch)  # what the zombie announces next
    transport.publisher().publish(topic_name(cfg.run.name, POLICY), encode(forged), headers=headers(forged))
    with pytest.raises(ServiceStopped, match="another learner took over"):
        for _ in range(200):
            old.step()
            services["scheduler"].step()
            services["producer"].step()
    services["learner"] = new
    rebalance(broker, f"{cfg.run.name}.learner")
    step_until(services, lambda: new.version >= old.version + 2, "the new learner to go on")
    assert ("scheduler", "fenced_epoch") in dead_letters(broker, cfg)
