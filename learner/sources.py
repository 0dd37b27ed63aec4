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
