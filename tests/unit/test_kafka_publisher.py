"""How the Kafka publisher comes back from a producer that can no longer send, without a broker:
kafka-python's producer is replaced by a stand-in that fails as a fatally broken one does."""

from types import SimpleNamespace

import kafka
import pytest
from kafka.errors import KafkaError
from structlog.testing import capture_logs

from prl.transport.base import TransportError
from prl.transport.kafka import KafkaPublisher


class StandInProducer:
    """Sends until told it is broken; then, as kafka-python's idempotent producer in its fatal
    state, every send and every flush fails, and its transaction manager says why."""

    made: list["StandInProducer"] = []

    def __init__(self, **settings):
        self.settings, self.sent, self.closed, self.fatal = settings, [], False, None
        self._transaction_manager = SimpleNamespace(has_fatal_error=lambda: self.fatal is not None, last_error=None)
        StandInProducer.made.append(self)

    def break_(self, error: Exception) -> None:
        self.fatal = error
        self._transaction_manager.last_error = error

    def send(self, topic, value, key=None, headers=()):
        if self.fatal:
            raise KafkaError(f"Cannot perform send because at least one previous transactional or idempotent "
                             f"request has failed with errors: {self.fatal}")
        self.sent.append((topic, value))
        return SimpleNamespace(get=lambda timeout: None)

    def flush(self, timeout=None):
        if self.fatal:
            raise KafkaError("Unexpected error in InitProducerIdResponse: [Error -1] UnknownError")

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
def test_a_producer_in_a_fatal_state_is_replaced_and_the_retried_publish_goes_through(publisher, breaks):
    first, fatal = StandInProducer.made[0], KafkaError("Unexpected error in InitProducerIdResponse: [Error -1] UnknownError")
    publisher.publish("run.rollouts", b"a")
    publisher.flush()
    with capture_logs() as logs, pytest.raises(TransportError):
        if breaks == "before the send":
            first.break_(fatal)
        publisher.publish("run.rollouts", b"b")
        first.break_(fatal)
        publisher.flush()
    assert first.closed and len(StandInProducer.made) == 2
    assert [e["event"] for e in logs] == ["producer_renewed"] and "UnknownError" in logs[0]["reason"]
    publisher.publish("run.rollouts", b"b")  # the caller's retry
    publisher.flush()
    assert StandInProducer.made[1].sent == [("run.rollouts", b"b")]
    assert StandInProducer.made[1].settings == first.settings  # the same client settings: acks, idempotence


def test_a_failure_that_is_not_fatal_keeps_the_producer(publisher, monkeypatch):
    first = StandInProducer.made[0]
    monkeypatch.setattr(first, "flush", lambda timeout=None: (_ for _ in ()).throw(KafkaError("broker away")))
    publisher.publish("run.rollouts", b"a")
    with pytest.raises(TransportError, match="broker away"):
        publisher.flush()
    assert len(StandInProducer.made) == 1 and not first.closed
