"""Where the learner's batches come from: the batch topic, or a file of TrainBatch records
(offline training, replays of stored batches, tests). Both hand out raw bytes, so the
learner decodes, dead-letters and deduplicates in one place."""

from __future__ import annotations

import fsspec
import pyarrow as pa

from schemas import TrainBatch
from schemas.records import encode_table, to_table


class TopicSource:
    def __init__(self, subscriber):
        self.subscriber = subscriber

    def next(self, timeout_s: float):
        """(message or None, exhausted): at most one batch message."""
        msgs = self.subscriber.poll(timeout_s, max_records=1)
        return (msgs[0] if msgs else None), False

    def commit(self) -> None:
        self.subscriber.commit()

    def close(self) -> None:
        self.subscriber.close()


class FileSource:
    """TrainBatch records from an Arrow IPC file written by :func:`write_batches`."""

    def __init__(self, uri: str):
        from prl.transport import Message

        with fsspec.open(uri, "rb") as f:
            table = pa.ipc.open_stream(f.read()).read_all()
        self.messages = [
            Message(uri, 0, i, None, encode_table(table.slice(i, 1)), [])
            for i in range(table.num_rows)
        ]
        self.position = 0

    def next(self, timeout_s: float):
        if self.position >= len(self.messages):
            return None, True
        self.position += 1
        return self.messages[self.position - 1], False

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass


def write_batches(uri: str, batches: list[TrainBatch]) -> None:
    with fsspec.open(uri, "wb") as f:
        f.write(encode_table(to_table(batches, TrainBatch)))


def resolve_batch(record, reader, rollouts_topic: str | None = None) -> tuple[TrainBatch, int]:
    """(the TrainBatch, bytes fetched): a TrainBatch as it is; a claim-check TrainBatchRefs
    with its rollouts fetched from the rollouts topic by position, each checked to be the
    rollout the reference names (its group's dispatch id, index and policy version). A
    reference that cannot be resolved raises DecodeError ``unresolvable_ref``."""
    from schemas import DecodeError, RolloutGroup, TrainBatchRefs, TrainRollout, decode

    if not isinstance(record, TrainBatchRefs):
        return record, 0
    if rollouts_topic is not None and any(r.topic != rollouts_topic for r in record.refs):
        raise DecodeError("unresolvable_ref", f"a reference outside {rollouts_topic}")
    coords = sorted({(r.topic, r.partition, r.offset) for r in record.refs})
    messages = reader.get_many(coords)
    groups = {c: decode(m.value, RolloutGroup) for c, m in messages.items()}
    rollouts = []
    for ref in record.refs:
        g = groups.get((ref.topic, ref.partition, ref.offset))
        if g is None or ref.index >= len(g.rollouts) or ref.rollout_id != f"{g.dispatch_id}/{ref.index}" \
                or g.policy_version != ref.policy_version:
            raise DecodeError("unresolvable_ref", f"{ref.rollout_id} at {ref.topic}:{ref.partition}:{ref.offset}")
        r = g.rollouts[ref.index]
        rollouts.append(TrainRollout(ref.rollout_id, g.problem_id, g.policy_version, ref.is_replay, ref.advantage, r.reward,
                                     g.temperature, g.prompt_ids, r.completion_ids, r.logprobs))
    batch = TrainBatch(record.batch_id, record.seq, record.learner_version, record.rollouts_generated, rollouts,
                       record.created_at)
    batch.validate()
    return batch, sum(len(m.value) for m in messages.values())
