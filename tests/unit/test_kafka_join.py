"""keep_finished_joins, without a broker: kafka-python's group coordinator is replaced by a
recorder with the internals the wrapper reads (the broker-backed test is in
tests/integration/test_transport.py)."""

import asyncio
import threading
from types import SimpleNamespace

from kafka.coordinator.base import MemberState
from kafka.future import Future

from prl.transport.kafka_internals import keep_finished_joins


def coordinator(join_task):
    calls = []

    async def join_group_async(timeout_ms=None):
        calls.append("join again")
        return False

    async def on_join_complete(generation, member, protocol, assignment):
        calls.append(("complete", generation, member, protocol, assignment))

    c = SimpleNamespace(_join_task=join_task, _lock=threading.Lock(), rejoining=True, rejoin_needed=True,
                        state=MemberState.REBALANCING, _generation=SimpleNamespace(generation_id=3, member_id="m", protocol="range"),
                        _enable_heartbeat=lambda: calls.append("heartbeat on"), _on_join_complete_async=on_join_complete,
                        join_group_async=join_group_async)
    assert keep_finished_joins(c)
    return c, calls


def test_a_join_that_finished_unawaited_is_completed_not_repeated():
    task = Future().success(b"assignment")
    c, calls = coordinator(task)
    assert asyncio.run(c.join_group_async(timeout_ms=100)) is True
    assert calls == ["heartbeat on", ("complete", 3, "m", "range", b"assignment")]
    assert (c._join_task, c.rejoining, c.rejoin_needed, c.state) == (None, False, False, MemberState.STABLE)


def test_a_pending_or_failed_join_goes_to_kafka_python():
    for task in (None, Future(), Future().failure(RuntimeError("rebalance"))):
        c, calls = coordinator(task)
        assert asyncio.run(c.join_group_async(timeout_ms=100)) is False
        assert calls == ["join again"] and c.rejoin_needed


def test_a_client_without_the_internals_is_left_alone():
    assert keep_finished_joins(None) is False
    assert keep_finished_joins(SimpleNamespace(join_group_async=None)) is False
