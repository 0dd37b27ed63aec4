"""Send what cannot be used to the dead-letter topic, byte for byte, with the reason."""

from __future__ import annotations

import time

import structlog

from prl.transport import Message, Publisher
from prl.schemas import DeadLetter, DecodeError, encode, headers, topic_name
from prl.schemas.topics import DEADLETTER

log = structlog.get_logger("deadletter")


LOG_FIRST = 20  # per (service, reason): every one of the first few is logged, then one in LOG_EVERY
LOG_EVERY = 1000
_seen: dict[tuple[str, str], int] = {}


ENVELOPE_BYTES = 4096  # room for the dead-letter record's other fields


def dead_letter(publisher: Publisher, run: str, msg: Message, error: Exception, service: str,
                max_bytes: int) -> None:
    """Publish ``msg`` with the reason to the dead-letter topic. A message too big to fit in
    one (``max_bytes``, the topic limit) keeps its first bytes, and the detail says so."""
    reason = error.reason if isinstance(error, DecodeError) else type(error).__name__
    detail = (getattr(error, "detail", "") or str(error))[:500]
    original = msg.value
    if len(original) > max_bytes - ENVELOPE_BYTES:
        original = original[: max(0, max_bytes // 2)]
        detail += f" (original truncated to its first {len(original)} of {len(msg.value)} bytes)"
    record = DeadLetter(msg.topic, msg.partition, msg.offset, reason, detail, service, msg.key, original, time.time())
    publisher.publish(topic_name(run, DEADLETTER), encode(record), key=msg.topic.encode(), headers=headers(record))
    n = _seen[(service, reason)] = _seen.get((service, reason), 0) + 1
    if n <= LOG_FIRST or n % LOG_EVERY == 0:  # a flood of bad input must not become a flood of logs
        log.warning("dead_lettered", service=service, topic=msg.topic, offset=msg.offset, reason=reason,
                    detail=detail[:200], count_for_reason=n)
