"""What every service shares: a transport, a dead-letter path, a metrics sink, a loop.

A service does one bounded unit of work per ``step()`` (waiting at most ``poll_s`` for
input) and says whether it is finished; ``run`` repeats that until it is, or until
``stop`` is set (SIGTERM in a pod, the end of ``prl run``).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import structlog

from prl.deadletter import dead_letter
from prl.metrics import MetricsSink
from prl.transport import Message, Transport, TransportError
from prl.trust import SIGNATURE_HEADER, KeyMissing, Signer
from prl.schemas import DecodeError, decode, encode, headers, topic_name


class ServiceStopped(RuntimeError):
    """A service cannot go on (not a passing fault): the message says why and what to do.
    Commands print it as one line and exit non-zero."""


class Service:
    name = "service"
    poll_s = 0.5
    reads: tuple[str, ...] = ()  # topic kinds this service consumes
    writes: tuple[str, ...] = ()  # topic kinds it publishes (dead letters aside)

    def __init__(self, cfg, transport: Transport, metrics: MetricsSink | None = None):
        self.cfg = cfg
        self.transport = transport
        self.metrics = metrics
        self.log = structlog.get_logger(self.name).bind(service=self.name)
        self.signer = Signer(cfg.transport.signed_kinds)
        for kind in set(self.reads + self.writes) & set(cfg.transport.signed_kinds):
            try:
                self.signer.require(kind)
            except KeyMissing as exc:
                raise ServiceStopped(str(exc)) from None
        self.publisher = transport.publisher()
        self.counters: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # time per phase (decode, encode, kafka_io, ...), see timed()
        self.last_step_at = time.monotonic()

    def topic(self, kind: str) -> str:
        return topic_name(self.cfg.run.name, kind)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    @contextmanager
    def timed(self, phase: str):
        """Add the time spent in the block to ``seconds[phase]`` (where a service's time goes)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def send(self, kind: str, record, key: bytes | None = None) -> None:
        """Publish a record to this run's topic of ``kind``, signed when that kind is."""
        topic = self.topic(kind)
        with self.timed("encode"):
            value = encode(record)
            hdrs = headers(record) + self.signer.headers(kind, topic, value)
        with self.timed("kafka_io"):
            self.publisher.publish(topic, value, key=key, headers=hdrs)

    def decode_or_dead_letter(self, msg: Message, expected: type | tuple[type, ...]):
        """The record in ``msg``, or None after sending ``msg`` to the dead-letter topic: too
        big, unsigned or badly signed (for a signed kind), or not a valid record of ``expected``
        (a kind, or a tuple of kinds)."""
        try:
            limit = self.cfg.transport.kafka.max_message_bytes
            if len(msg.value) > limit:
                raise DecodeError("oversized", f"{len(msg.value)} bytes > {limit}")
            kind = msg.topic.rsplit(".", 1)[-1]
            if problem := self.signer.problem(kind, msg.topic, msg.value, msg.header(SIGNATURE_HEADER)):
                raise DecodeError(problem, f"{kind} messages must carry a valid signature")
            with self.timed("decode"):
                if not isinstance(expected, tuple):
                    return decode(msg.value, expected)
                record = decode(msg.value)
            if not isinstance(record, expected):
                raise DecodeError("wrong_kind", f"expected {' or '.join(c.KIND for c in expected)}, got {record.KIND}")
            return record
        except DecodeError as exc:
            self.dead_letter(msg, exc)
            return None

    def reject(self, msg: Message, reason: str, detail: str) -> None:
        """A message that decodes but must not be acted on: dead-lettered with the reason."""
        self.dead_letter(msg, DecodeError(reason, detail))

    def dead_letter(self, msg: Message, error: DecodeError) -> None:
        self.count(f"dead_lettered/{error.reason}")
        dead_letter(self.publisher, self.cfg.run.name, msg, error, self.name, self.cfg.transport.kafka.max_message_bytes)

    def emit(self, values: dict, **context) -> None:
        if self.metrics is not None:
            self.metrics.write(self.name, values, **context)

    def emit_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        if self.metrics is not None:
            self.metrics.table(f"{self.name}/{name}", columns, rows, step)

    def step(self) -> bool:
        """One unit of work; True when the service has finished."""
        raise NotImplementedError

    def gauges(self) -> dict:
        """Counters and current values for /metrics."""
        return dict(self.counters)

    def close(self) -> None:
        self.publisher.close()

    def run(self, stop: threading.Event | None = None, http: str = "") -> None:
        """Step until finished or ``stop``; serve /health and /metrics on ``http`` (host:port) if given."""
        from prl.status import StatusServer

        stop = stop or threading.Event()
        host, _, port = http.rpartition(":")
        status = StatusServer(self, int(port), host=host.strip("[]")) if http else None
        backoff = 0.5
        try:
            while not stop.is_set():
                try:
                    done = self.step()
                except TransportError as exc:  # broker away: wait, retry; unacknowledged work is redelivered
                    self.count("transport_errors")
                    self.log.warning("transport_error", error=str(exc)[:300], retry_in_s=backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = 0.5
                self.last_step_at = time.monotonic()
                if done:
                    break
        finally:
            if status is not None:
                status.close()
            self.close()
