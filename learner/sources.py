"""Where the learner's batches come from: the batch topic, or a file of TrainBatch records
(offline training, replays of stored batches, tests). Both hand out raw bytes, so the
learner decodes, dead-letters and deduplicates in one place."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import fsspec
import pyarrow as pa

from prl.schemas import RolloutGroup, TrainBatch, decode
from prl.schemas.records import encode_table, to_table


class TopicSource:
    def __init__(self, subscriber):
        self.subscriber = subscriber
        self.consumed: dict[tuple[str, int], int] = {}  # (topic, partition) -> the next offset to read

    def next(self, timeout_s: float):
        """(message or None, exhausted): at most one batch message."""
        msgs = self.subscriber.poll(timeout_s, max_records=1)
        for m in msgs:
            self.consumed[(m.topic, m.partition)] = m.offset + 1
        return (msgs[0] if msgs else None), False

    def positions(self) -> dict[tuple[str, int], int]:
        """What a commit now would acknowledge: every batch handed out so far."""
        return dict(self.consumed)

    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        if offsets is None or offsets:  # {}: nothing handed out, nothing to acknowledge
            self.subscriber.commit(offsets)

    def close(self) -> None:
        self.subscriber.close()


class FileSource:
    """TrainBatch records from an Arrow IPC file written by :func:`write_batches`, read a record
    batch at a time (a file of a long archive's batches need not fit in memory)."""

    def __init__(self, uri: str):
        self.uri, self.position = uri, 0
        self.file = fsspec.open(uri, "rb").open()
        try:
            self.reader = pa.ipc.open_stream(self.file)
        except pa.ArrowInvalid as exc:
            raise self.unreadable(exc) from None
        self.rows: list[pa.Table] = []  # read, not yet handed out

    def next(self, timeout_s: float):
        from prl.transport import Message

        while not self.rows:
            try:
                batch = self.reader.read_next_batch()
            except StopIteration:
                return None, True
            except (pa.ArrowInvalid, OSError) as exc:  # cut short (pyarrow says OSError), or garbage past the batches read
                raise self.unreadable(exc) from None
            table = pa.Table.from_batches([batch], self.reader.schema)
            self.rows = [table.slice(i, 1) for i in range(table.num_rows)]
        self.position += 1
        return Message(self.uri, 0, self.position - 1, None, encode_table(self.rows.pop(0)), []), False

    def unreadable(self, exc: Exception):
        from prl.service import ServiceStopped

        return ServiceStopped(f"--batches-from {self.uri}: not a file of TrainBatch records past the first {self.position} "
                              f"({exc})")

    def positions(self) -> None:
        return None

    def commit(self, offsets=None) -> None:
        pass

    def close(self) -> None:
        self.file.close()


def write_batches(uri: str, batches: Iterable[TrainBatch]) -> int:
    """Write ``batches`` as they come to an Arrow IPC file, a record batch each; how many."""
    written = 0
    with fsspec.open(uri, "wb") as f, pa.ipc.new_stream(f, to_table([], TrainBatch).schema) as writer:
        for b in batches:
            writer.write_table(to_table([b], TrainBatch))
            written += 1
    return written


class GroupCache:
    """The rollout groups that claim-check batches named lately, by message position, so a
    rollout the scheduler replays (its group fetched for an earlier batch) does not come from
    the broker again. A position in a topic never changes content, so a hit is the message as
    fetched: decoded and checked once, when it came. A group leaves once it is older than
    tau_max at the version being trained (no valid batch may name it again) and, oldest first,
    whenever the groups held exceed ``max_bytes`` (0: keep nothing)."""

    def __init__(self, reader, max_bytes: int):
        self.reader, self.max_bytes = reader, max_bytes
        self.groups: OrderedDict[tuple[str, int, int], tuple[RolloutGroup, int]] = OrderedDict()  # -> (group, bytes)
        self.size = 0

    def get_many(self, positions, oldest_version: int = 0) -> tuple[dict, int, int]:
        """({position: RolloutGroup} for the ``positions`` the topic has, bytes fetched from
        the broker for them, bytes taken from the cache instead); first forgets groups older
        than ``oldest_version``."""
        self.drop_older_than(oldest_version)
        held = {p: self.groups[p] for p in positions if p in self.groups}
        messages = self.reader.get_many([p for p in positions if p not in held]) if len(held) < len(positions) else {}
        found = {p: group for p, (group, _) in held.items()}
        for p, m in messages.items():
            found[p] = decode(m.value, RolloutGroup)
            self.keep(p, found[p], len(m.value))
        return found, sum(len(m.value) for m in messages.values()), sum(size for _, size in held.values())

    def keep(self, position, group: RolloutGroup, size: int) -> None:
        if size > self.max_bytes:
            return
        self.groups[position] = (group, size)
        self.size += size
        while self.size > self.max_bytes:
            self.size -= self.groups.popitem(last=False)[1][1]

    def drop_older_than(self, version: int) -> None:
        for p in [p for p, (g, _) in self.groups.items() if g.policy_version < version]:
            self.size -= self.groups.pop(p)[1]

    def close(self) -> None:
        self.reader.close()


def resolve_batch(record, cache: GroupCache, rollouts_topic: str | None = None,
                  oldest_version: int = 0) -> tuple[TrainBatch, int, int]:
    """(the TrainBatch, bytes fetched, bytes the cache saved fetching): a TrainBatch as it
    is; a claim-check TrainBatchRefs with its rollouts taken from the rollouts topic by
    position (through ``cache``; groups older than ``oldest_version`` cannot be named any
    more), each checked to be the rollout the reference names (its group's dispatch id, index
    and policy version). A reference that cannot be resolved raises DecodeError
    ``unresolvable_ref``."""
    from prl.schemas import DecodeError, TrainBatchRefs, TrainRollout

    if not isinstance(record, TrainBatchRefs):
        return record, 0, 0
    if rollouts_topic is not None and any(r.topic != rollouts_topic for r in record.refs):
        raise DecodeError("unresolvable_ref", f"a reference outside {rollouts_topic}")
    groups, fetched, cached = cache.get_many(sorted({(r.topic, r.partition, r.offset) for r in record.refs}), oldest_version)
    rollouts = []
    for ref in record.refs:
        g = groups.get((ref.topic, ref.partition, ref.offset))
        if g is None or ref.index >= len(g.rollouts) or ref.rollout_id != f"{g.dispatch_id}/{ref.index}" \
                or g.policy_version != ref.policy_version:
            raise DecodeError("unresolvable_ref", f"{ref.rollout_id} at {ref.topic}:{ref.partition}:{ref.offset}")
        r = g.rollouts[ref.index]
        rollouts.append(TrainRollout(ref.rollout_id, g.problem_id, g.policy_version, ref.is_replay, ref.advantage, r.reward,
                                     g.temperature, g.prompt_ids, r.completion_ids, r.logprobs, ref.sample_weight,
                                     r.model_mask))
    batch = TrainBatch(record.batch_id, record.seq, record.learner_version, record.rollouts_generated, rollouts,
                       record.created_at, record.epoch)
    batch.validate()
    return batch, fetched, cached
