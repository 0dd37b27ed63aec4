from prl.transport.base import Message, Publisher, Subscriber, Transport, TransportError, make_transport

__all__ = ["Message", "Publisher", "Subscriber", "Transport", "TransportError", "make_transport"]
