"""The transport: small interfaces (prl/transport/base.py: publisher, subscriber, and a reader
by position for claim-check batches) and this factory.

Implementations: prl/transport/memory.py (in-process: `prl run` and tests) and
prl/transport/kafka.py (services started alone, a deployment). Both import the interfaces;
only the factory here knows them both.
"""

from prl.transport.base import Message, Publisher, Reader, Subscriber, Transport, TransportError


def make_transport(cfg=None, *, memory_broker=None) -> Transport:
    """Kafka as ``cfg`` (a TransportConfig) sets it up; with no config, an in-process transport
    (on ``memory_broker``, shared by the services of one process)."""
    if cfg is None:
        from prl.transport.memory import MemoryBroker, MemoryTransport

        return MemoryTransport(memory_broker or MemoryBroker())
    from prl.transport.kafka import KafkaTransport

    return KafkaTransport(cfg.kafka)


__all__ = ["Message", "Publisher", "Reader", "Subscriber", "Transport", "TransportError", "make_transport"]
