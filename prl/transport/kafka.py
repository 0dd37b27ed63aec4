"""Kafka transport on kafka-python (>= 3): idempotent acks=all producer with zstd
compression, group consumers with manual commit, topic creation from schemas/topics.py.

SASL credentials are read from PRL_KAFKA_USERNAME and PRL_KAFKA_PASSWORD, never from the
config file, and never logged.
"""

from __future__ import annotations

import os
import time
import uuid

import structlog

from prl.transport.base import Message, Publisher, Reader, Subscriber, Transport, TransportError
from prl.transport.kafka_internals import fatal_error, keep_finished_joins, stay_in_group_on_close
from prl.schemas.topics import PROBLEMS, ROLLOUTS, TOPICS

log = structlog.get_logger("transport.kafka")
UNASSIGNED_WARN_S = 60.0  # a group member without partitions this long is warned about
USERNAME_ENV, PASSWORD_ENV = "PRL_KAFKA_USERNAME", "PRL_KAFKA_PASSWORD"
# Longest a fetch waits at the broker for new messages. Kafka answers as soon as one arrives;
# tansu 0.6 (the tests' broker) holds each fetch for most of the wait, so it sets every hop's
# latency there (publish -> consume p99: 250 ms at 500, 54 ms at 100, 8 ms at 20; measured).
FETCH_MAX_WAIT_MS = 100
# Every blocking call into kafka-python is bounded, so a service cut off from the broker fails
# its step (and says so) instead of hanging: a send waits at most BLOCK_MS for metadata or buffer
# room, a request at most kafka-python's request_timeout_ms (30 s), flush and poll take timeouts.
BLOCK_MS = 10_000
# After failed connections kafka-python waits up to this long before trying a broker again. Its
# default, 30 s, let a pipeline sit idle for up to 30 s after a network fault had healed.
RECONNECT_BACKOFF_MAX_MS = 2_000
# A publisher keeps each message until a flush sees it acknowledged; between flushes (a learner
# dead-letters a flood of bad batches and flushes at its next checkpoint) it forgets the
# acknowledged ones once it keeps this many, so what it holds is bounded by what is in flight.
FORGET_EVERY = 1024


def client_settings(cfg) -> dict:
    """Connection settings shared by producer, consumer and admin clients."""
    out = {"bootstrap_servers": cfg.bootstrap_servers.split(","), "security_protocol": cfg.security_protocol,
           "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, "bootstrap_timeout_ms": BLOCK_MS}
    if cfg.ssl_cafile:
        out["ssl_cafile"] = cfg.ssl_cafile
    if cfg.security_protocol.startswith("SASL"):
        out["sasl_mechanism"] = cfg.sasl_mechanism
        out["sasl_plain_username"] = os.environ.get(USERNAME_ENV, "")
        out["sasl_plain_password"] = os.environ.get(PASSWORD_ENV, "")
    return out


def kafka_client(kind, cfg, **settings):
    """A kafka-python client (``kind``: KafkaProducer, KafkaConsumer or KafkaAdminClient) with the
    connection settings of ``cfg`` and ``settings``. A broker that takes connections but gives the
    client no metadata within BLOCK_MS (it speaks another security_protocol or SASL mechanism,
    or does not know the credentials) is one TransportError that says what to check."""
    from kafka.errors import KafkaTimeoutError

    try:
        return kind(**client_settings(cfg), **settings)
    except KafkaTimeoutError as exc:
        raise TransportError(
            f"the Kafka broker at {cfg.bootstrap_servers} takes connections but gave no metadata within "
            f"{BLOCK_MS // 1000} s ({exc}); check transport.kafka.security_protocol ({cfg.security_protocol}), "
            f"sasl_mechanism and ssl_cafile against the broker's listener, and {USERNAME_ENV} / {PASSWORD_ENV}"
        ) from None


def topic_configs(spec, max_message_bytes: int) -> dict[str, str]:
    return {
        "cleanup.policy": "compact" if spec.compacted else "delete",
        "retention.ms": str(spec.retention_ms),
        "max.message.bytes": str(max_message_bytes),
    }


class KafkaPublisher(Publisher):
    """An idempotent producer that keeps what the broker has not acknowledged.

    A flush that fails raises TransportError and keeps every message not known to be on its
    topic; the next ``publish`` or ``flush`` sends those again first, so they keep their order
    ahead of newer ones. A service that commits its input only after a flush therefore never
    commits past work that is not on a topic, however often the network fails in between (a
    message sent twice is absorbed where state lives, DESIGN.md). A message still in flight when
    the flush gave up is not sent again unless kafka-python reports it failed."""

    def __init__(self, cfg):
        self._cfg = cfg
        self._producer = self._new_producer()
        self._sent: list[list] = []  # [(topic, value, key, headers), future or None], oldest first, not yet acknowledged
        # Set when a kept message may need sending again (a send raised, a future failed, the
        # producer was renewed): only then does a publish walk ``_sent``, so that publishing n
        # messages between flushes costs O(n), not O(n^2). Set by kafka-python's sender thread too.
        self._resend_due = False
        self._forget_at = FORGET_EVERY  # kept messages that make publish forget the acknowledged ones

    def _new_producer(self):
        from kafka import KafkaProducer

        return kafka_client(
            KafkaProducer, self._cfg,
            acks="all",
            enable_idempotence=True,
            compression_type="zstd",
            max_request_size=self._cfg.max_message_bytes,
            linger_ms=5,
            max_block_ms=BLOCK_MS,
        )

    @property
    def unacknowledged(self) -> int:
        return len(self._sent)

    def publish(self, topic, value, *, key=None, headers=()):
        self._sent.append(entry := [(topic, value, key, list(headers)), None])  # kept from here on, whatever fails
        if self._resend_due:
            self._resend_failed()  # the older ones first: they keep their order
        else:
            self._send(entry)
        if len(self._sent) >= self._forget_at:  # many publishes and no flush (a flood of dead letters)
            self._forget_acknowledged()

    def _send(self, entry: list) -> None:
        from kafka.errors import KafkaError

        topic, value, key, headers = entry[0]
        sent = False
        try:
            entry[1] = self._producer.send(topic, value=value, key=key, headers=headers)
            sent = True
        except KafkaError as exc:  # kept: sent again by the next publish or flush
            self._renew_if_fatal()
            raise TransportError(f"send failed: {type(exc).__name__}: {exc}") from None
        finally:
            if not sent:
                self._resend_due = True
        entry[1].add_errback(self._failed)

    def _failed(self, _exc) -> None:
        self._resend_due = True

    def _resend_failed(self) -> None:
        """Send, oldest first, every kept message not sent yet or reported failed."""
        self._resend_due = False  # a failure reported from here on sets it again
        for entry in self._sent:
            if entry[1] is None or (entry[1].is_done and entry[1].failed()):
                self._send(entry)

    def flush(self, timeout_s=30.0):
        self._resend_failed()
        try:
            self._producer.flush(timeout=timeout_s)
        except Exception as exc:  # kafka-python raises many KafkaError subclasses
            self._keep_unacknowledged()
            raise TransportError(f"publish not acknowledged: {type(exc).__name__}: {exc}") from None
        failed = self._keep_unacknowledged()
        if failed:
            raise TransportError(f"publish not acknowledged: {len(self._sent)} of the messages sent "
                                 f"({type(failed).__name__}: {failed})")

    def _keep_unacknowledged(self) -> Exception | None:
        """Forget what the broker acknowledged; keep the rest to send again. Returns the first
        failure kafka-python reported, if any."""
        self._forget_acknowledged()
        self._renew_if_fatal()
        return next((e[1].exception for e in self._sent if e[1] is not None and e[1].is_done), None) or \
            (TimeoutError("not acknowledged in time") if self._sent else None)

    def _forget_acknowledged(self) -> None:
        """Keep only the messages the broker has not acknowledged; the next forgetting comes
        after as many publishes again (amortized O(1) a publish)."""
        self._sent = [e for e in self._sent if e[1] is None or not e[1].is_done or e[1].failed()]
        self._forget_at = max(FORGET_EVERY, 2 * len(self._sent))

    def _renew_if_fatal(self) -> None:
        """Replace a producer that can no longer send. kafka-python's idempotent producer never
        leaves a fatal error state: after a broker restart that lost its producer state, the
        out-of-order sequence makes it bump its epoch, and a broker that answers that with an
        error (tansu on restored storage did, CI 2026-12-01) leaves every later send failing.
        A new producer starts with a new producer id and sends again everything not acknowledged;
        what the old one may have written too is absorbed where state lives (DESIGN.md)."""
        reason = fatal_error(self._producer)
        if reason is None:
            return
        log.warning("producer_renewed", reason=reason[:300], unacknowledged=len(self._sent))
        for entry in self._sent:
            entry[1] = None  # the old producer's futures say nothing more: all go again
        self._resend_due = True
        try:
            self._producer.close(timeout=0)
        except Exception as exc:  # a broken producer may fail to close: it is dropped either way
            log.warning("producer_close_failed", error=str(exc)[:200])
        self._producer = self._new_producer()

    def close(self):
        try:
            self.flush()
        finally:
            self._producer.close(timeout=5)


def assignment_logger(group: str):
    """A rebalance listener that logs a group member's partitions as they change (who reads what)."""
    from kafka import ConsumerRebalanceListener

    def names(tps):
        return sorted(f"{tp.topic}:{tp.partition}" for tp in tps)

    class LogAssignment(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            log.info("partitions_revoked", group=group, partitions=names(revoked))

        def on_partitions_assigned(self, assigned):
            log.info("partitions_assigned", group=group, partitions=names(assigned))

    return LogAssignment()


class KafkaSubscriber(Subscriber):
    def __init__(self, cfg, topics, group, from_beginning):
        from kafka import KafkaConsumer, TopicPartition

        settings = dict(
            enable_auto_commit=False,
            auto_offset_reset="earliest" if from_beginning else "latest",
            max_partition_fetch_bytes=cfg.max_message_bytes,
            fetch_max_bytes=max(cfg.max_message_bytes, 52428800),
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            session_timeout_ms=cfg.session_timeout_ms,
            max_poll_interval_ms=cfg.max_poll_interval_ms,
            heartbeat_interval_ms=max(100, cfg.session_timeout_ms // 4),
            client_id=f"prl-{uuid.uuid4().hex[:8]}",
        )
        self.client_id = settings["client_id"]
        self.leave_group = cfg.leave_group_on_close
        self.group = group
        self._unassigned_since = time.monotonic()  # a group member with no partitions since then
        self._warned_at = 0.0
        if group is not None:
            self._consumer = kafka_client(KafkaConsumer, cfg, group_id=group, **settings)
            self._consumer.subscribe(list(topics), listener=assignment_logger(group))
            if not keep_finished_joins(getattr(self._consumer, "_coordinator", None)):
                log.warning("join_fix_not_applied", group=group,
                            reason="this kafka-python lacks the coordinator internals keep_finished_joins wraps; "
                                   "a join that finishes between polls is repeated")
        else:
            self._consumer = kafka_client(KafkaConsumer, cfg, group_id=None, **settings)
            parts = []
            for t in topics:
                ids = self._consumer.partitions_for_topic(t) or {0}
                parts += [TopicPartition(t, p) for p in sorted(ids)]
            self._consumer.assign(parts)
            (self._consumer.seek_to_beginning if from_beginning else self._consumer.seek_to_end)(*parts)

    def poll(self, timeout_s, max_records=500):
        from kafka.errors import KafkaError

        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            raise TransportError(f"poll failed: {type(exc).__name__}: {exc}") from None
        if self.group is not None:
            self._watch_assignment()
        out = []
        for records in batches.values():
            for r in records:
                out.append(Message(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or []), r.timestamp))
        return out

    def _watch_assignment(self) -> None:
        """Warn, once a minute, while this group member has had no partitions for longer than
        ``UNASSIGNED_WARN_S``: a member that never gets partitions serves nothing, silently."""
        now = time.monotonic()
        if self._consumer.assignment():
            self._unassigned_since = now
        elif now - self._unassigned_since > UNASSIGNED_WARN_S and now - self._warned_at > 60:
            self._warned_at = now
            log.warning("no_partitions_assigned", group=self.group, member=self.client_id, seconds=round(now - self._unassigned_since),
                        hint="the group's rebalance does not complete (a member that does not answer, or "
                             "fewer partitions than members); see the broker's group state")

    def commit(self, offsets=None):
        from kafka import TopicPartition
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        if self.group is not None:
            try:
                self._consumer.commit(None if offsets is None else {
                    TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})
            except KafkaError as exc:
                raise TransportError(f"commit failed: {type(exc).__name__}: {exc}") from None

    def caught_up(self) -> bool:
        """Every assigned partition read up to its high watermark (known after a fetch)."""
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None or self._consumer.position(tp) < high:
                return False
        return True

    def highwater(self, topic: str, partition: int) -> int | None:
        from kafka import TopicPartition

        return self._consumer.highwater(TopicPartition(topic, partition))

    def close(self):
        if self.group is not None and not self.leave_group:
            # kafka-python has no public switch for this (kafka_internals.py); a release without
            # the method it uses leaves the group, and says so.
            if not stay_in_group_on_close(self._consumer):
                log.warning("leaves_group_on_close", group=self.group,
                            reason="this kafka-python has no coordinator.reset_generation; leave_group_on_close=false is not honoured")
        self._consumer.close(autocommit=False)


class KafkaReader(Reader):
    """Messages by position: every wanted partition at once, each sought to its first wanted
    offset and read forward, seeking again over a gap wider than ``SKIP`` messages; a
    partition with nothing left to find is paused."""

    SKIP = 64
    FETCH_BYTES = 1 << 20  # per partition and fetch: a few messages past the wanted one, not max_message_bytes of them

    def __init__(self, cfg):
        from kafka import KafkaConsumer

        # Brokers return a first message larger than the fetch size whole (KIP-74; tansu too), so
        # a small fetch size loses no message and saves reading what follows the wanted offsets.
        self._consumer = kafka_client(KafkaConsumer, cfg, group_id=None, enable_auto_commit=False,
                                      max_partition_fetch_bytes=self.FETCH_BYTES,
                                      fetch_max_bytes=max(cfg.max_message_bytes, 52428800),
                                      fetch_max_wait_ms=FETCH_MAX_WAIT_MS)

    def get_many(self, coords, timeout_s=30.0):
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        pending: dict = {}
        for topic, partition, offset in sorted(coords):
            pending.setdefault(TopicPartition(topic, partition), []).append(offset)
        out: dict = {}
        deadline = time.monotonic() + timeout_s
        try:
            self._consumer.unsubscribe()  # no state kept from an earlier call (paused, high watermark)
            self._consumer.assign(list(pending))
            for tp, offsets in pending.items():
                self._consumer.seek(tp, offsets[0])
            while any(pending.values()) and time.monotonic() < deadline:
                for tp, records in self._consumer.poll(timeout_ms=500, max_records=500).items():
                    wanted = set(pending[tp])
                    out.update({(r.topic, r.partition, r.offset): Message(r.topic, r.partition, r.offset, r.key, r.value,
                                                                          list(r.headers or []), r.timestamp)
                                for r in records if r.offset in wanted})
                for tp in pending:
                    pending[tp] = self._next_wanted(tp, pending[tp], out)
        except KafkaError as exc:
            raise TransportError(f"read failed: {type(exc).__name__}: {exc}") from None
        return out

    def _next_wanted(self, tp, offsets: list[int], found: dict) -> list[int]:
        """The offsets of ``tp`` still to find (not passed without them, below the partition's
        end); seeks over a wide gap, pauses a finished partition."""
        position, end = self._consumer.position(tp), self._consumer.highwater(tp)
        end = 1 << 62 if end is None else end  # unknown until a fetch of this call has answered
        left = [o for o in offsets if (tp.topic, tp.partition, o) not in found and position <= o < end]
        if not left:
            self._consumer.pause(tp)
        elif left[0] - position > self.SKIP:
            self._consumer.seek(tp, left[0])
        return left

    def close(self):
        self._consumer.close(autocommit=False)


REACH_TIMEOUT_S = 10.0


def check_reachable(cfg, timeout_s: float | None = None) -> None:
    """Raise TransportError within ``timeout_s`` (default ``REACH_TIMEOUT_S``) unless some
    bootstrap server accepts a TCP connection (so an unreachable broker is one clear line, not
    half a minute of retries)."""
    import socket

    timeout_s = REACH_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    errors = []
    while time.monotonic() < deadline:
        for server in cfg.bootstrap_servers.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=2.0):
                    return
            except (OSError, ValueError) as exc:
                errors.append(f"{server.strip()}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{server}: {exc}")
        time.sleep(0.5)
    raise TransportError(f"cannot reach a Kafka broker at {cfg.bootstrap_servers} ({errors[-1]}) within {timeout_s:.0f} s; "
                         "check that the broker runs and transport.kafka.bootstrap_servers")


class KafkaTransport(Transport):
    def __init__(self, cfg):
        self.cfg = cfg
        check_reachable(cfg)

    def ensure_topics(self, run):
        """Create the run's missing topics (none where they exist already, e.g. as Strimzi
        KafkaTopic resources; a broker that refuses the creation is logged, not fatal)."""
        from kafka import KafkaAdminClient

        admin = kafka_client(KafkaAdminClient, self.cfg)
        try:
            existing = set(admin.list_topics())
            wanted = {
                f"{run}.{kind}": {
                    "num_partitions": self.cfg.partitions if kind in (PROBLEMS, ROLLOUTS) else spec.partitions,
                    "replication_factor": self.cfg.replication_factor,
                    "configs": topic_configs(spec, self.cfg.max_message_bytes),
                }
                for kind, spec in TOPICS.items()
                if f"{run}.{kind}" not in existing
            }
            if wanted:
                admin.create_topics(wanted, raise_errors=False, wait_for_metadata=True)
                log.info("topics_created", topics=sorted(wanted))
        finally:
            admin.close()

    def publisher(self):
        return KafkaPublisher(self.cfg)

    def subscriber(self, topics, *, group, from_beginning=True):
        return KafkaSubscriber(self.cfg, list(topics), group, from_beginning)

    def reader(self):
        return KafkaReader(self.cfg)
