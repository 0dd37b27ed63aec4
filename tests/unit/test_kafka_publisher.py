"""What the Kafka publisher does when the broker does not acknowledge, without a broker:
kafka-python's producer is replaced by a stand-in whose futures succeed, fail or stay pending
as told, and which can fall into the fatal state of kafka-python's idempotent producer."""

from types import SimpleNamespace

import kafka
import pytest
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.future import Future
from structlog.testing import capture_logs

from prl.transport.base import TransportError
from prl.transport.kafka import FORGET_EVERY, KafkaPublisher

FATAL = KafkaError("Unexpected error in InitProducerIdResponse: [Error -1] UnknownError")


class StandInProducer:
    """Sends until told it is broken; a flush settles every pending future as ``outcome`` says
    (``ok``, ``fail``: the broker refused, ``hang``: nothing came back in time). Broken, as
    kafka-python's idempotent producer in its fatal state, every send and flush fails, and its
    transaction manager says why."""

    made: list["StandInProducer"] = []

    def __init__(self, **settings):
        self.settings, self.sent, self.closed, self.fatal, self.outcome = settings, [], False, None, "ok"
        self.pending: list[Future] = []
        self._transaction_manager = SimpleNamespace(has_fatal_error=lambda: self.fatal is not None, last_error=None)
        StandInProducer.made.append(self)

    def break_(self, error: Exception) -> None:
        self.fatal = error
        self._transaction_manager.last_error = error

    def send(self, topic, value, key=None, headers=()):
        if self.fatal:
            raise KafkaError(f"Cannot perform send because at least one previous transactional or idempotent "
                             f"request has failed with errors: {self.fatal}")
        self.sent.append(value)
        self.pending.append(Future())
        return self.pending[-1]

    def flush(self, timeout=None):
        if self.fatal:
            raise FATAL
        if self.outcome == "hang":
            raise KafkaTimeoutError("Timeout after waiting for 30 secs.")
        for future in (f for f in self.pending if not f.is_done):
            future.success(None) if self.outcome == "ok" else future.failure(KafkaError("NotLeaderForPartitionError"))
        self.pending = []

    def close(self, timeout=None):
        self.closed = True


@pytest.fixture
def publisher(monkeypatch):
    StandInProducer.made = []
    monkeypatch.setattr(kafka, "KafkaProducer", StandInProducer)
    cfg = SimpleNamespace(bootstrap_servers="127.0.0.1:9", security_protocol="PLAINTEXT", ssl_cafile=None,
                          compression="zstd", max_message_bytes=1 << 20)
    return KafkaPublisher(cfg)


@pytest.mark.parametrize("breaks", ["before the send", "before the flush"])
def test_a_producer_in_a_fatal_state_is_replaced_and_what_it_did_not_deliver_goes_again(publisher, breaks):
    first = StandInProducer.made[0]
    publisher.publish("run.rollouts", b"a")
    publisher.flush()
    with capture_logs() as logs, pytest.raises(TransportError):
        if breaks == "before the send":
            first.break_(FATAL)
        publisher.publish("run.rollouts", b"b")
        first.break_(FATAL)
        publisher.flush()
    assert first.closed and len(StandInProducer.made) == 2
    assert [e["event"] for e in logs] == ["producer_renewed"] and "UnknownError" in logs[0]["reason"]
    assert publisher.unacknowledged == 1
    publisher.flush()  # the service's next step: no publish of its own needed
    assert StandInProducer.made[1].sent == [b"b"] and publisher.unacknowledged == 0
    assert StandInProducer.made[1].settings == first.settings  # the same client settings: acks, idempotence


def test_a_refused_message_is_kept_and_sent_again_before_newer_ones(publisher):
    producer = StandInProducer.made[0]
    producer.outcome = "fail"
    publisher.publish("run.batches", b"batch 7")
    with pytest.raises(TransportError, match="NotLeaderForPartitionError"):
        publisher.flush()
    assert publisher.unacknowledged == 1 and len(StandInProducer.made) == 1 and not producer.closed
    producer.outcome = "ok"
    publisher.publish("run.batches", b"batch 8")
    publisher.flush()
    assert producer.sent == [b"batch 7", b"batch 7", b"batch 8"] and publisher.unacknowledged == 0


def test_a_message_still_in_flight_when_the_flush_gave_up_is_not_sent_twice(publisher):
    producer = StandInProducer.made[0]
    producer.outcome = "hang"
    publisher.publish("run.rollouts", b"group")
    with pytest.raises(TransportError, match="KafkaTimeoutError"):
        publisher.flush()
    assert publisher.unacknowledged == 1
    producer.outcome = "ok"  # the broker answers late: kafka-python's own retry delivered it
    publisher.flush()
    assert producer.sent == [b"group"] and publisher.unacknowledged == 0


def test_a_message_whose_send_failed_is_kept_behind_the_older_ones(publisher):
    producer = StandInProducer.made[0]
    producer.outcome = "fail"
    publisher.publish("run.rollouts", b"group 1")
    with pytest.raises(TransportError):
        publisher.flush()
    real_send = producer.send
    producer.send = lambda *a, **k: (_ for _ in ()).throw(KafkaTimeoutError("Failed to update metadata after 10.0 secs."))
    with pytest.raises(TransportError, match="send failed"):
        publisher.publish("run.rollouts", b"group 2")  # the broker is still away
    assert publisher.unacknowledged == 2
    producer.send, producer.outcome = real_send, "ok"
    publisher.flush()
    assert producer.sent == [b"group 1", b"group 1", b"group 2"] and publisher.unacknowledged == 0


def test_a_failure_reported_between_flushes_goes_again_with_the_next_publish_ahead_of_it(publisher):
    """Publishing does not look through every kept message (that made n publishes cost n^2):
    kafka-python's report of a failure marks a resend due, and the next publish sends first."""
    producer = StandInProducer.made[0]
    publisher.publish("run.problems", b"dispatch 1")
    publisher.publish("run.problems", b"dispatch 2")
    assert producer.sent == [b"dispatch 1", b"dispatch 2"]  # each sent once
    producer.pending[0].failure(KafkaError("NotLeaderForPartitionError"))  # its sender thread gave up on it
    publisher.publish("run.problems", b"dispatch 3")
    assert producer.sent == [b"dispatch 1", b"dispatch 2", b"dispatch 1", b"dispatch 3"]
    publisher.flush()
    assert publisher.unacknowledged == 0


def test_without_a_flush_the_publisher_keeps_only_what_the_broker_has_not_acknowledged(publisher):
    """A learner dead-letters a flood of bad batches and flushes at its next checkpoint: what
    the publisher holds in between stays bounded by what is in flight, and a message the broker
    refused is still kept and sent again."""
    producer = StandInProducer.made[0]
    for i in range(10 * FORGET_EVERY):
        publisher.publish("run.deadletter", b"dead %d" % i)
        producer.pending[-1].success(None)  # kafka-python's sender thread: acknowledged
        assert publisher.unacknowledged <= FORGET_EVERY
    publisher.publish("run.deadletter", b"refused")
    producer.pending[-1].failure(KafkaError("NotLeaderForPartitionError"))
    for i in range(2 * FORGET_EVERY):
        publisher.publish("run.deadletter", b"later %d" % i)
        producer.pending[-1].success(None)
    assert producer.sent.count(b"refused") == 2  # sent again by the publish after the failure
    publisher.flush()
    assert publisher.unacknowledged == 0
