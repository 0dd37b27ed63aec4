"""The transport: a publisher, a subscriber and a factory, nothing more.

Services receive a :class:`Transport` explicitly (never a module global) and use it to
make the two small objects they need. Delivery is at least once: a subscriber's
``commit`` acknowledges everything ``poll`` returned so far, so a service commits only
after its work on those messages is done (published and acknowledged).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int = 0

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


class TransportError(RuntimeError):
    """A publish that was not acknowledged, or a broker that cannot be reached."""


class Publisher(abc.ABC):
    @abc.abstractmethod
    def publish(self, topic: str, value: bytes, *, key: bytes | None = None, headers=()) -> None:
        """Queue one message; ``flush`` waits until every queued message is acknowledged."""

    @abc.abstractmethod
    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until all queued messages are acknowledged; raise TransportError if not, keeping
        the unacknowledged ones to send again at the next publish or flush."""

    @property
    def unacknowledged(self) -> int:
        """Messages published and not yet acknowledged by the broker (kept to send again)."""
        return 0

    def close(self) -> None:
        self.flush()


class Subscriber(abc.ABC):
    @abc.abstractmethod
    def poll(self, timeout_s: float, max_records: int = 500) -> list[Message]:
        """Next messages (possibly none after ``timeout_s``), in offset order per partition."""

    @abc.abstractmethod
    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Acknowledge everything returned by ``poll`` so far, or with ``offsets`` ({(topic,
        partition): the next offset to read}) exactly that much (group subscribers only)."""

    @abc.abstractmethod
    def caught_up(self) -> bool:
        """Whether ``poll`` has returned everything written so far (readers without a group)."""

    def close(self) -> None:
        pass


class Reader(abc.ABC):
    """Random access to messages by position (claim-check batches name the rollouts they train)."""

    @abc.abstractmethod
    def get_many(self, coords: list[tuple[str, int, int]], timeout_s: float = 30.0) -> dict[tuple[str, int, int], Message]:
        """The messages at these (topic, partition, offset); one that is not there (expired,
        never written) is left out."""

    def close(self) -> None:
        pass


class Transport(abc.ABC):
    @abc.abstractmethod
    def ensure_topics(self, run: str) -> None:
        """Create the run's topics if missing, with the settings of schemas/topics.py."""

    @abc.abstractmethod
    def publisher(self) -> Publisher: ...

    @abc.abstractmethod
    def subscriber(self, topics: list[str], *, group: str | None, from_beginning: bool = True) -> Subscriber:
        """A group member (shares partitions, resumes at committed offsets) or, with
        ``group=None``, a reader of every partition from the beginning or the end."""

    @abc.abstractmethod
    def reader(self) -> Reader: ...

    def close(self) -> None:
        pass
