"""An in-process broker with Kafka's semantics where the pipeline relies on them:
keyed partitions, per-partition offsets, consumer groups whose members share
messages, commits, readers without a group, and retention: a partition keeps its newest
``retain_bytes`` of messages (Kafka keeps days of them on disk; in memory, a long `prl run`
would hold every message it ever sent). A cursor behind the oldest message kept goes on from
it, as Kafka's consumers do. Thread-safe; for `prl run` and tests."""

from __future__ import annotations

import threading
import time
import zlib

from prl.transport.base import Message, Publisher, Reader, Subscriber, Transport
from prl.schemas.topics import TOPICS


RETAIN_BYTES = 128 << 20  # per partition: tens of steps of a GPU run's rollouts, far more than tau_max needs


class MemoryBroker:
    def __init__(self, retain_bytes: int = RETAIN_BYTES):
        self._cond = threading.Condition()
        self.retain_bytes = retain_bytes
        self._logs: dict[str, list[list[Message]]] = {}  # each partition's messages kept, oldest first
        self._first: dict[tuple[str, int], int] = {}  # (topic, partition) -> offset of the oldest message kept
        self._bytes: dict[tuple[str, int], int] = {}  # (topic, partition) -> bytes of the messages kept
        self._handed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> next offset to hand out
        self.committed: dict[tuple[str, str, int], int] = {}

    def create(self, topic: str, partitions: int) -> None:
        with self._cond:
            self._logs.setdefault(topic, [[] for _ in range(partitions)])

    def partitions(self, topic: str) -> list[list[Message]]:
        if topic not in self._logs:
            self.create(topic, 1)
        return self._logs[topic]

    def append(self, topic: str, value: bytes, key: bytes | None, headers) -> None:
        with self._cond:
            parts = self.partitions(topic)
            p = zlib.crc32(key) % len(parts) if key else sum(map(len, parts)) % len(parts)
            log = parts[p]
            log.append(Message(topic, p, self.first(topic, p) + len(log), key, value, list(headers), int(time.time() * 1000)))
            self._bytes[(topic, p)] = self._bytes.get((topic, p), 0) + len(value)
            if self._bytes[(topic, p)] > self.retain_bytes:
                self.trim(topic, p)
            self._cond.notify_all()

    def first(self, topic: str, partition: int) -> int:
        return self._first.get((topic, partition), 0)

    def trim(self, topic: str, partition: int) -> None:
        """Drop the oldest messages of a partition down to 3/4 of ``retain_bytes`` (a trim per
        quarter of it, not per message), keeping the newest one whatever its size."""
        log, size = self._logs[topic][partition], self._bytes[(topic, partition)]
        dropped = 0
        while dropped < len(log) - 1 and size > self.retain_bytes * 3 // 4:
            size -= len(log[dropped].value)
            dropped += 1
        del log[:dropped]
        self._first[(topic, partition)] = self.first(topic, partition) + dropped
        self._bytes[(topic, partition)] = size

    def end_offsets(self, topic: str) -> list[int]:
        with self._cond:
            return [self.first(topic, p) + len(log) for p, log in enumerate(self.partitions(topic))]

    def take(self, positions: dict, topics: list[str], group: str | None, max_records: int, timeout_s: float):
        """Messages after ``positions`` (own cursor) or the group's shared cursor."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                out: list[Message] = []
                for topic in topics:
                    for p, log in enumerate(self.partitions(topic)):
                        cursor_key = (group, topic, p)
                        cursors = self._handed if group is not None else positions
                        if group is not None and cursor_key not in cursors:
                            cursors[cursor_key] = self.committed.get(cursor_key, 0)
                        start = max(cursors.get(cursor_key, 0), self.first(topic, p))  # trimmed: from the oldest kept
                        i = start - self.first(topic, p)
                        batch = log[i : i + max_records - len(out)]
                        cursors[cursor_key] = start + len(batch)
                        out.extend(batch)
                if out or time.monotonic() >= deadline:
                    return out
                self._cond.wait(deadline - time.monotonic())


class MemoryPublisher(Publisher):
    def __init__(self, broker: MemoryBroker):
        self.broker = broker

    def publish(self, topic, value, *, key=None, headers=()):
        self.broker.append(topic, value, key, headers)

    def flush(self, timeout_s=30.0):
        pass


class MemorySubscriber(Subscriber):
    def __init__(self, broker: MemoryBroker, topics: list[str], group: str | None, from_beginning: bool):
        self.broker, self.topics, self.group = broker, topics, group
        self.positions: dict = {}
        self.polled: dict[tuple, int] = {}
        if group is None and not from_beginning:
            for t in topics:
                for p, end in enumerate(broker.end_offsets(t)):
                    self.positions[(None, t, p)] = end

    def poll(self, timeout_s, max_records=500):
        msgs = self.broker.take(self.positions, self.topics, self.group, max_records, timeout_s)
        for m in msgs:
            self.polled[(self.group, m.topic, m.partition)] = m.offset + 1
        return msgs

    def caught_up(self):
        ends = {(t, p): end for t in self.topics for p, end in enumerate(self.broker.end_offsets(t))}
        return all(self.positions.get((None, t, p), 0) >= end for (t, p), end in ends.items())

    def commit(self, offsets=None):
        if self.group is not None:
            with self.broker._cond:
                self.broker.committed.update(self.polled if offsets is None else
                                             {(self.group, t, p): o for (t, p), o in offsets.items()})


class MemoryReader(Reader):
    def __init__(self, broker: MemoryBroker):
        self.broker = broker

    def get_many(self, coords, timeout_s=30.0):
        out = {}
        with self.broker._cond:
            for topic, partition, offset in coords:
                parts = self.broker._logs.get(topic, [])
                i = offset - self.broker.first(topic, partition)
                if 0 <= partition < len(parts) and 0 <= i < len(parts[partition]):  # not sent, or no longer kept: absent
                    out[(topic, partition, offset)] = parts[partition][i]
        return out


class MemoryTransport(Transport):
    def __init__(self, broker: MemoryBroker | None = None):
        self.broker = broker or MemoryBroker()

    def ensure_topics(self, run):
        for kind, spec in TOPICS.items():
            self.broker.create(f"{run}.{kind}", spec.partitions)

    def publisher(self):
        return MemoryPublisher(self.broker)

    def subscriber(self, topics, *, group, from_beginning=True):
        return MemorySubscriber(self.broker, list(topics), group, from_beginning)

    def reader(self):
        return MemoryReader(self.broker)
