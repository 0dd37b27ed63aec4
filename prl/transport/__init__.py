"""The transport: small interfaces (prl/transport/base.py: publisher, subscriber, and a reader
by position for claim-check batches) and this factory.

Implementations: prl/transport/memory.py (in-process, for `prl run` and tests) and
prl/transport/kafka.py (a deployment). Both import the interfaces; only the factory here
knows them both.
"""

from prl.transport.base import Message, Publisher, Reader, Subscriber, Transport, TransportError


def make_transport(cfg, *, memory_broker=None) -> Transport:
    """The transport a config names. ``memory_broker`` shares one in-process broker."""
    if cfg.type == "memory":
        from prl.transport.memory import MemoryBroker, MemoryTransport

        return MemoryTransport(memory_broker or MemoryBroker())
    from prl.transport.kafka import KafkaTransport

    return KafkaTransport(cfg.kafka)


def require_shared(cfg, hint: str = "") -> None:
    """The command talks to other processes: refuse the in-memory transport (it reaches no one
    outside this process) with one line saying what to set instead, plus ``hint``."""
    if cfg.type == "memory":
        raise TransportError('transport.type is "memory", which reaches no other process; give this command the '
                         'deployment\'s config (--config kafka.toml with [transport] type = "kafka")' + hint)


__all__ = ["Message", "Publisher", "Reader", "Subscriber", "Transport", "TransportError", "make_transport", "require_shared"]
