"""The in-process broker keeps each partition's newest ``retain_bytes``, with Kafka's offsets."""

from prl.transport.memory import MemoryBroker, MemoryTransport

KB = b"x" * 1000


def published(retain_bytes: int, n: int) -> MemoryTransport:
    transport = MemoryTransport(MemoryBroker(retain_bytes=retain_bytes))
    transport.broker.create("t", 1)
    pub = transport.publisher()
    for i in range(n):
        pub.publish("t", KB + str(i).encode())
    return transport


def test_a_partition_keeps_its_newest_bytes_and_its_offsets_go_on():
    transport = published(10_000, 100)
    kept = transport.broker.partitions("t")[0]
    assert sum(len(m.value) for m in kept) <= 10_000 and len(kept) >= 7
    assert [m.offset for m in kept] == list(range(100 - len(kept), 100))
    assert transport.broker.end_offsets("t") == [100]


def test_a_consumer_behind_the_oldest_kept_message_goes_on_from_it():
    transport = published(10_000, 100)
    oldest = transport.broker.partitions("t")[0][0].offset
    for group in ("g", None):  # a group that never read, a reader from the beginning
        msgs = transport.subscriber(["t"], group=group, from_beginning=True).poll(0.0)
        assert [m.offset for m in msgs] == list(range(oldest, 100))
        assert [m.value for m in msgs] == [KB + str(i).encode() for i in range(oldest, 100)]


def test_a_consumer_that_keeps_up_misses_nothing():
    transport = MemoryTransport(MemoryBroker(retain_bytes=10_000))
    transport.broker.create("t", 1)
    sub, pub = transport.subscriber(["t"], group="g"), transport.publisher()
    seen = []
    for i in range(100):
        pub.publish("t", KB + str(i).encode())
        seen += [m.offset for m in sub.poll(0.0)]
    assert seen == list(range(100))


def test_a_message_no_longer_kept_is_absent_for_a_reader():
    transport = published(10_000, 100)
    got = transport.reader().get_many([("t", 0, 0), ("t", 0, 99), ("t", 0, 100)])
    assert list(got) == [("t", 0, 99)] and got[("t", 0, 99)].value == KB + b"99"
