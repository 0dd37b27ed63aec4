"""What every service shares: a transport, a dead-letter path, a metrics sink, a loop.

A service does one bounded unit of work per ``step()`` (waiting at most ``poll_s`` for
input) and says whether it is finished; ``run`` repeats that until it is, or until
``stop`` is set (SIGTERM in a pod, the end of ``prl run``): then ``stopped`` keeps what a
restart should not do again. Finished, it returns, or (in a pod, whose controller restarts what
exits) waits for ``stop``, its connections closed.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
from contextlib import contextmanager

import structlog

from prl import epochs
from prl.deadletter import dead_letter
from prl.errors import one_line
from prl.metrics import MetricsSink
from prl.transport import Message, Transport, TransportError
from prl.trust import SIGNATURE_HEADER, KeyMissing, Signer
from prl.schemas import DecodeError, decode, encode, headers, topic_name
from prl.storage import unreachable


# Longest wait between two tries of a step that failed on the transport. Short: after a network
# fault heals, a service is back within this (kafka-python reconnects within 2 s, kafka.py).
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.5, 5.0
# A service whose steps have failed on the transport this long says so once and answers /health
# with 503 (Kubernetes restarts it).
STALL_S = 120.0
# A step is hung (/health 503) once it has run HUNG_STEP_S and HUNG_STEP_FACTOR times as long as
# the slowest step before it. RL steps are long (a learner step of 64 groups x 8 x 4k tokens, a
# checkpoint written in it, or a producer's engine call of that size take minutes on a GPU): a
# probe must restart a service that hangs, not one that works.
HUNG_STEP_S, HUNG_STEP_FACTOR = 1800.0, 10
# A service whose steps succeed and move nothing this long says what it waits for, and again
# each time the wait doubles: a pipeline stopped everywhere at once is not silent.
IDLE_S = 60.0
RECORD_OVERHEAD = 128  # bytes Kafka's record batch framing adds to a message's key, value and headers


class ServiceStopped(RuntimeError):
    """A service cannot go on (not a passing fault): the message says why and what to do.
    Commands print it as one line and exit non-zero."""


OUTAGE_FIXES = {  # what a person checks when steps fail on it for STALL_S
    "transport": "check the brokers and transport.kafka.bootstrap_servers",
    "storage": "check that the object store of run.run_dir is up and reachable from here (AWS_ENDPOINT_URL for S3)",
}


class Outage:
    """A run of steps that failed on the ``what`` ("transport": the brokers; "storage": the
    object store): each failure is logged with the wait before the next try (doubling, at most
    MAX_BACKOFF_S); past STALL_S it is said once as ``<what>_stalled``; the first step that
    succeeds logs how long it lasted."""

    def __init__(self, service: "Service", what: str = "transport"):
        self.service, self.what, self.since, self.backoff, self.said = service, what, None, MIN_BACKOFF_S, False

    def failed(self, exc: Exception) -> float:
        """Count and log a failed step; the seconds to wait before the next."""
        svc, now = self.service, time.monotonic()
        svc.count(f"{self.what}_errors")
        self.since = self.since or now
        if not self.said and now - self.since >= STALL_S:
            self.said = True
            svc.log.error(f"{self.what}_stalled", seconds=round(now - self.since), error=one_line(exc)[:300],
                          fix=f"{OUTAGE_FIXES[self.what]}; /health answers 503 until a step succeeds")
        else:
            svc.log.warning(f"{self.what}_error", error=one_line(exc)[:300], retry_in_s=self.backoff)
        wait, self.backoff = self.backoff, min(self.backoff * 2, MAX_BACKOFF_S)
        return wait

    def over(self) -> None:
        """A step succeeded: log the outage's length, if there was one, and start afresh."""
        if self.since is not None:
            self.service.log.info(f"{self.what}_recovered", seconds=round(time.monotonic() - self.since, 1))
            self.service.count(f"{self.what}_recoveries")
        self.since, self.backoff, self.said = None, MIN_BACKOFF_S, False


# A scheduler or learner that waits (for the learner, for batches) writes nothing, so it would not
# learn at a write that a newer one took over its run: while idle it looks this often.
REPLACED_CHECK_S = 30.0
ONE_PER_RUN = {"scheduler": "its Deployment has one replica", "learner": "its StatefulSet has one replica"}


class Idle:
    """Steps that succeed and move nothing (``Service.progress`` unchanged): after IDLE_S the
    service logs ``idle`` with what it waits for (``Service.waiting_for``), again at 2, 4, ...
    times IDLE_S; the first progress after that logs ``idle_over`` with how long it lasted."""

    def __init__(self, service: "Service"):
        self.service, self.mark, self.since, self.say_at = service, None, time.monotonic(), IDLE_S

    def seconds(self, now: float) -> float:
        """Since the last progress (/health's ``seconds_idle``, /metrics' ``prl_<service>_seconds_idle``)."""
        return round(now - self.since, 3)

    def stepped(self, now: float) -> None:
        mark = self.service.progress()
        if mark is None:  # a service that does not say what progress is
            return
        if mark != self.mark:
            if self.say_at > IDLE_S:  # its wait was said
                self.service.log.info("idle_over", seconds=round(now - self.since, 1))
            self.mark, self.since, self.say_at = mark, now, IDLE_S
        elif now - self.since >= self.say_at:
            self.service.log.info("idle", seconds=round(now - self.since), **self.service.waiting_for())
            self.say_at *= 2


def health_status(now: float, ended: bool, outage_since: float | None, step_started_at: float | None,
           slowest_step_s: float) -> str:
    """What /health says: "finished" (waiting to be stopped), "stalled" (steps failing on the
    transport for STALL_S, until one succeeds), "hung" (a step running far longer than any
    before it) or "ok"."""
    if ended:
        return "finished"
    if outage_since is not None and now - outage_since >= STALL_S:
        return "stalled"
    patience = max(HUNG_STEP_S, HUNG_STEP_FACTOR * slowest_step_s)
    if step_started_at is not None and now - step_started_at > patience:
        return "hung"
    return "ok"


class TooBig(ValueError):
    """A record larger than a message may be."""


class Service:
    name = "service"
    poll_s = 0.5
    reads: tuple[str, ...] = ()  # topic kinds this service consumes
    writes: tuple[str, ...] = ()  # topic kinds it publishes (dead letters aside)
    ended = False  # finished and waiting to be stopped (run's when_finished="wait"): /health says so
    answers_http = True  # serves run's /health and /metrics (under torchrun, the learner's rank 0 alone)
    role = ""  # "scheduler" or "learner": one per run, the newest claim's epoch fencing the others (prl/epochs.py)
    epoch = 0  # the epoch this one claimed (0: none: not a role, or a learner's rank other than 0)
    retries_storage = True  # a step that found the object store unreachable is tried again (not the learner's)

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
        self.step_started_at: float | None = None  # while a step runs
        self.slowest_step_s = 0.0  # of the steps that succeeded
        self.hung_step_said: float | None = None  # the start of the step whose hang was logged
        self.outage = Outage(self)
        self.storage_outage = Outage(self, "storage")
        self.idle = Idle(self)
        self.replaced_checked_at = time.monotonic()

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
        """Publish a record to this run's topic of ``kind``, signed when that kind is; TooBig
        where it exceeds ``transport.kafka.max_message_bytes`` (the broker would refuse it on
        every retry)."""
        topic = self.topic(kind)
        with self.timed("encode"):
            value = encode(record)
            hdrs = headers(record) + self.signer.headers(kind, topic, value)
        size = len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in hdrs) + RECORD_OVERHEAD
        if size > (limit := self.cfg.transport.kafka.max_message_bytes):
            raise TooBig(f"{size:,} bytes > transport.kafka.max_message_bytes {limit:,}")
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

    def progress(self):
        """What changes when the service gets work done (compared after every step; None: not
        followed)."""
        return None

    def waiting_for(self) -> dict:
        """What it waits for while no work comes (logged with ``idle``)."""
        return {}

    def stop_requested(self, stop: threading.Event) -> bool:
        """Whether to stop before the next step (a learner's ranks take rank 0's word)."""
        return stop.is_set()

    def stopped(self) -> None:
        """Stopped between steps: keep what a restart should not do again (nothing, by default)."""

    def close(self) -> None:
        self.publisher.close()

    def deliver(self, subscriber, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Wait for the broker to acknowledge everything published (dead letters included), then
        commit what ``subscriber`` has polled (or ``offsets``, where the work done covers less):
        an offset is never committed past work that is not on a topic. A TransportError keeps the
        unacknowledged messages; the step that retries sends them again."""
        self.publisher.flush()
        subscriber.commit(offsets)

    def run(self, stop: threading.Event | None = None, http: str = "", when_finished: str = "exit") -> None:
        """Step until finished or ``stop``; serve /health and /metrics on ``http`` (host:port) if given.
        Finished, return (``when_finished="exit"``) or close the connections and wait for ``stop``
        (``"wait"``: a pod's controller would restart a container that exits, again and again).

        A TransportError (the broker away, a publish not acknowledged) ends the step, and the
        step is tried again after a growing wait: what it published and was not acknowledged is
        kept by the publisher and sent again, what it polled and did not commit stays
        uncommitted. A transport that makes no progress for ``STALL_S`` is said once
        in one line, and /health answers 503 from then, so Kubernetes restarts the pod; so it
        does while a step hangs (``health_status``)."""
        from prl.status import StatusServer

        stop = stop or threading.Event()
        host, _, port = http.rpartition(":")
        try:
            status = StatusServer(self, int(port), host=host.strip("[]")) if http and self.answers_http else None
        except OSError as exc:  # the port taken, or an address this host does not have
            raise ServiceStopped(f"--http {http}: {exc.strerror or exc}; give a free port on an address of this host") from None
        try:
            try:
                finished = self.loop(stop)
                if not finished:
                    self.stopped()
            finally:
                self.close()
            if finished and when_finished == "wait":
                self.ended = True
                self.log.info("waiting_to_be_stopped", reason="the run is finished", health="finished")
                stop.wait()
        finally:
            if status is not None:
                status.close()

    def loop(self, stop: threading.Event) -> bool:
        """Step until a step says finished (True) or ``stop`` is set (False), trying a step that
        failed on the transport again after a growing wait."""
        while not self.stop_requested(stop):
            self.step_started_at = started = time.monotonic()
            try:
                done = self.step()
            except Exception as exc:
                outage = self.outage_of(exc)
                if outage is None:
                    raise
                self.step_started_at = None
                stop.wait(outage.failed(exc))
                continue
            self.outage.over()
            self.storage_outage.over()
            self.last_step_at, self.step_started_at = time.monotonic(), None
            self.idle.stepped(self.last_step_at)
            self.check_replaced_while_idle(self.last_step_at)
            self.slowest_step_s = max(self.slowest_step_s, self.last_step_at - started)
            if done:
                return True
        return False

    def outage_of(self, exc: Exception) -> Outage | None:
        """The outage a failed step belongs to, if its error is a passing fault: the transport's,
        or the object store's for a service whose steps can be repeated after one."""
        if isinstance(exc, TransportError):
            return self.outage
        if self.retries_storage and unreachable(exc):
            return self.storage_outage
        return None

    def stop_if_replaced(self) -> None:
        """ServiceStopped once a newer one of this role has claimed the run: this one writes nothing more."""
        if not self.epoch:
            return
        try:
            newer = epochs.fenced(self.cfg.run.run_dir, self.role, self.epoch)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self.log.warning("replacement_unchecked", error=one_line(exc)[:300],
                             why="the object store is unreachable; looked for again before the next write")
            return
        if newer:
            raise ServiceStopped(f"another {self.role} took over this run ({newer}): this one stops without writing "
                                 f"(one {self.role} per run: check that {ONE_PER_RUN[self.role]}, and that no second "
                                 "`prl run` uses its directory)")

    def check_replaced_while_idle(self, now: float) -> None:
        if self.epoch and self.idle.seconds(now) >= REPLACED_CHECK_S and now - self.replaced_checked_at >= REPLACED_CHECK_S:
            self.replaced_checked_at = now
            self.stop_if_replaced()

    def health(self) -> dict:
        """/health's answer (prl/status.py): its status (``health_status``) and the seconds since the last step."""
        now = time.monotonic()
        outage_since = min((o.since for o in (self.outage, self.storage_outage) if o.since is not None), default=None)
        status = health_status(now, self.ended, outage_since, self.step_started_at, self.slowest_step_s)
        if status == "hung" and self.hung_step_said != self.step_started_at:
            self.hung_step_said = self.step_started_at
            self.log.error("step_hung", seconds=round(now - self.step_started_at), stacks="on stderr, below")
            faulthandler.dump_traceback(sys.__stderr__, all_threads=True)  # where it hangs, before the probe restarts it
        return {"status": status, "service": self.name, "seconds_since_step": round(now - self.last_step_at, 3),
                "seconds_idle": self.idle.seconds(now)}
