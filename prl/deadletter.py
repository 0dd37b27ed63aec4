"""Send what cannot be used to the dead-letter topic, byte for byte, with the reason."""

from __future__ import annotations

import time

import structlog

from prl.transport import Message, Publisher
from schemas import DeadLetter, DecodeError, encode, headers, topic_name
from schemas.topics import DEADLETTER

log = structlog.get_logger("deadletter")


LOG_FIRST = 20  # per (service, reason): every one of the first few is logged, then one in LOG_EVERY
LOG_EVERY = 1000
_seen: dict[tuple[str, str], int] = {}


def dead_letter(publisher: Publisher, run: str, msg: Message, error: Exception, service: str) -> None:
    reason = error.reason if isinstance(error, DecodeError) else type(error).__name__
    detail = getattr(error, "detail", "") or str(error)
    record = DeadLetter(msg.topic, msg.partition, msg.offset, reason, detail[:500], service, msg.key, msg.value, time.time())
    publisher.publish(topic_name(run, DEADLETTER), encode(record), key=msg.topic.encode(), headers=headers(record))
    n = _seen[(service, reason)] = _seen.get((service, reason), 0) + 1
    if n <= LOG_FIRST or n % LOG_EVERY == 0:  # a flood of bad input must not become a flood of logs
        log.warning("dead_lettered", service=service, topic=msg.topic, offset=msg.offset, reason=reason,
                    detail=detail[:200], count_for_reason=n)
