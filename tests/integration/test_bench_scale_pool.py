"""`prl bench scale`'s simulated producers, spread over helper processes, answer dispatches from
a real broker: every process takes its share and the groups it sends are real rollout groups."""

import time
import uuid
from types import SimpleNamespace

import pytest

from benchmarks.scale import ProducerPool, drain, write_config
from tests.support.servers import wait_until
from prl.transport.kafka import KafkaTransport
from prl.schemas import Dispatch, RolloutGroup, Sampling, decode, encode, headers
from prl.schemas.config import load_config
from prl.schemas.topics import PROBLEMS, ROLLOUTS, topic_name

pytestmark = pytest.mark.kafka


def test_producers_in_two_processes_each_answer_their_share_of_the_dispatches(kafka_broker, run_name, tmp_path):
    args = SimpleNamespace(producers=[4], tokens=16, groups_per_batch=4, max_in_flight=64)
    config = write_config(tmp_path / "scale.toml", kafka_broker.bootstrap, run_name, tmp_path / "run", args, "copy")
    transport = KafkaTransport(load_config(config).transport.kafka)
    transport.ensure_topics(run_name)
    pool = ProducerPool(config, processes=2, tokens=16, per_call=2, call_s=0.01)
    try:
        pool.grow(4)  # two producers in each process, one partition each; a new group reads from the start
        pub, sent = transport.publisher(), []
        for i in range(48):  # keys spread over the four partitions
            d = Dispatch(uuid.uuid4().hex, f"add2:{i}+1", "1+2=", "3", 8, Sampling(1.0, 1.0, 16, []), 0, 0, time.time())
            pub.publish(topic_name(run_name, PROBLEMS), encode(d), key=d.problem_id.encode(), headers=headers(d))
            sent.append(d.dispatch_id)
        pub.flush()
        wait_until(lambda: pool.totals()[0] >= 48, 90, "the simulated producers to answer 48 dispatches")
        assert all(sent[0] > 0 for sent in pool.sent), "a process answered nothing"
        taken: list[float] = []  # each dispatch's time until taken (a rebalance may hand one out twice)
        wait_until(lambda: taken.extend(drain(pool.queued)) or len(taken) >= 48, 10, "48 times until taken")
    finally:
        pool.stop()
    assert all(not side.proc.is_alive() for side in pool.sides)
    sub = transport.subscriber([topic_name(run_name, ROLLOUTS)], group=None, from_beginning=True)
    groups: list[RolloutGroup] = []
    wait_until(lambda: groups.extend(decode(m.value, RolloutGroup) for m in sub.poll(0.5))
               or {g.dispatch_id for g in groups} >= set(sent), 30, "a group for every dispatch on the rollouts topic")
    sub.close()
    assert {g.dispatch_id for g in groups} == set(sent) and all(len(g.rollouts) == 8 for g in groups)
    assert all(len(r.completion_ids) == 16 for g in groups for r in g.rollouts)
