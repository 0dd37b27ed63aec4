"""Send what cannot be used to the dead-letter topic, byte for byte, with the reason."""

from __future__ import annotations

import time

import structlog

from prl.transport import Message, Publisher
from schemas import DeadLetter, DecodeError, encode, headers, topic_name
from schemas.topics import DEADLETTER

log = structlog.get_logger("deadletter")


def dead_letter(publisher: Publisher, run: str, msg: Message, error: Exception, service: str) -> None:
    reason = error.reason if isinstance(error, DecodeError) else type(error).__name__
    detail = getattr(error, "detail", "") or str(error)
    record = DeadLetter(msg.topic, msg.partition, msg.offset, reason, detail[:500], service, msg.key, msg.value, time.time())
    publisher.publish(topic_name(run, DEADLETTER), encode(record), key=msg.topic.encode(), headers=headers(record))
    log.warning("dead_lettered", service=service, topic=msg.topic, offset=msg.offset, reason=reason, detail=detail[:200])
