"""How a Kafka group member closes, without a broker: kafka-python's consumer is replaced by a
recorder of what close does to it."""

from types import SimpleNamespace

from structlog.testing import capture_logs

from prl.transport.kafka import KafkaSubscriber


def closing(leave_group: bool, coordinator) -> tuple[KafkaSubscriber, list[str]]:
    calls: list[str] = []
    sub = KafkaSubscriber.__new__(KafkaSubscriber)  # no broker: only the fields close reads
    sub.group, sub.leave_group = "run.producers", leave_group
    sub._consumer = SimpleNamespace(_coordinator=coordinator, close=lambda autocommit: calls.append(f"close({autocommit})"))
    return sub, calls


def test_a_member_that_stays_resets_its_generation_so_no_leave_group_is_sent():
    calls: list[str] = []
    sub, closed = closing(False, SimpleNamespace(reset_generation=lambda: calls.append("reset_generation")))
    sub.close()
    assert calls == ["reset_generation"] and closed == ["close(False)"]


def test_a_member_that_leaves_does_not_touch_its_generation():
    calls: list[str] = []
    sub, closed = closing(True, SimpleNamespace(reset_generation=lambda: calls.append("reset_generation")))
    sub.close()
    assert calls == [] and closed == ["close(False)"]


def test_a_kafka_python_without_the_private_method_closes_and_says_it_leaves():
    sub, closed = closing(False, SimpleNamespace())
    with capture_logs() as logs:
        sub.close()
    assert closed == ["close(False)"]
    assert [e["event"] for e in logs] == ["leaves_group_on_close"]
