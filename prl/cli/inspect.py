"""Look into a run's Kafka topics: `prl inspect topics` and `prl inspect tail TOPIC`.

End offsets come from the high watermark in fetch responses (``consumer.highwater``), not
from ListOffsets: some brokers (tansu, the test broker) answer ListOffsets "latest" wrongly
when a batch holds several records. The ListOffsets answer is reported next to it, so a
disagreement is visible.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from prl.episodes import model_turns
from prl.errors import UsageError
from prl.schemas import DecodeError, decode
from prl.schemas.topics import TOPICS, topic_name

HIGHWATER = "fetch high watermark"


def _consumer(cfg):
    from kafka import KafkaConsumer

    from prl.transport.kafka import kafka_client

    return kafka_client(KafkaConsumer, cfg, group_id=None, enable_auto_commit=False,
                        fetch_max_bytes=cfg.max_message_bytes, max_partition_fetch_bytes=cfg.max_message_bytes)


def end_offsets(consumer, tps: list, timeout_s: float = 15.0) -> dict:
    """High watermark of every partition, read from fetch responses (one fetch each)."""
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        known = {tp: consumer.highwater(tp) for tp in tps}
        if all(v is not None for v in known.values()):
            return known
        consumer.poll(timeout_ms=200, max_records=1)
    missing = [f"{tp.topic}[{tp.partition}]" for tp in tps if consumer.highwater(tp) is None]
    raise TimeoutError(f"no fetch response for {missing} within {timeout_s}s")


@dataclass
class TopicRow:
    topic: str
    partitions: int
    messages: int
    end_offsets: list[int]
    list_offsets_end: list[int]
    groups: dict[str, int]  # consumer group -> lag (messages not yet committed)


def topic_report(cfg) -> list[TopicRow]:
    """Every topic of the run: partitions, messages, and each consumer group's lag."""
    from kafka import KafkaAdminClient, TopicPartition

    from prl.transport.kafka import kafka_client

    kcfg = cfg.transport.kafka
    consumer = _consumer(kcfg)
    admin = kafka_client(KafkaAdminClient, kcfg)
    try:
        names = [topic_name(cfg.run.name, kind) for kind in TOPICS]
        existing = consumer.topics()
        if not set(names) & existing:
            runs = sorted({t.rsplit(".", 1)[0] for t in existing if t.rsplit(".", 1)[-1] in TOPICS}) or ["none"]
            raise UsageError(f"no topic of run {cfg.run.name!r} on {cfg_bootstrap(consumer)} (runs there: {', '.join(runs)}): "
                             "check run.name")
        tps = {n: [TopicPartition(n, p) for p in sorted(consumer.partitions_for_topic(n) or [])] for n in names if n in existing}
        all_tps = [tp for group in tps.values() for tp in group]
        ends = end_offsets(consumer, all_tps) if all_tps else {}
        starts = consumer.beginning_offsets(all_tps) if all_tps else {}
        listed = consumer.end_offsets(all_tps) if all_tps else {}
        committed: dict[str, dict] = {}
        for group in sorted(g["group_id"] for g in admin.list_groups()):
            if group.startswith(cfg.run.name + "."):
                offsets = admin.list_group_offsets({group: None}).get(group, {})
                committed[group] = {tp: o.offset for tp, o in offsets.items() if o.offset >= 0}
        rows = []
        for name, parts in tps.items():
            lags = {}  # a partition the group never committed counts from its start
            for group, offsets in committed.items():
                if any(tp in offsets for tp in parts):
                    lags[group] = sum(ends[tp] - max(offsets.get(tp, starts[tp]), starts[tp]) for tp in parts)
            rows.append(TopicRow(name, len(parts), sum(ends[tp] - starts[tp] for tp in parts), [ends[tp] for tp in parts],
                                 [listed[tp] for tp in parts], lags))
        return rows
    finally:
        consumer.close()
        admin.close()


def format_topics(rows: list[TopicRow]) -> str:
    out = [f"end offsets: {HIGHWATER} (ListOffsets shown where it disagrees)", "",
           f"{'topic':<32} {'parts':>5} {'messages':>9}  consumer groups (lag)"]
    for r in rows:
        groups = ", ".join(f"{g} ({lag})" for g, lag in sorted(r.groups.items())) or "-"
        out.append(f"{r.topic:<32} {r.partitions:>5} {r.messages:>9}  {groups}")
        if r.list_offsets_end != r.end_offsets:
            out.append(f"{'':<32} ListOffsets says end offsets {r.list_offsets_end}, fetches say {r.end_offsets}")
    return "\n".join(out)


# -- tail -----------------------------------------------------------------------------------
FOLLOW_SUMMARY_S = 10.0  # --follow --summary: the summary so far, this often


@dataclass
class TailFilter:
    problem: str | None = None
    min_version: int | None = None
    max_version: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    producer: str | None = None

    def keep(self, record) -> bool:
        version = getattr(record, "policy_version", getattr(record, "version", None))
        if self.problem is not None and getattr(record, "problem_id", None) != self.problem:
            return False
        if self.producer is not None and getattr(record, "producer_id", None) != self.producer:
            return False
        if version is not None and self.min_version is not None and version < self.min_version:
            return False
        if version is not None and self.max_version is not None and version > self.max_version:
            return False
        rewards = getattr(record, "rewards", None)
        if rewards is not None and (self.min_reward is not None or self.max_reward is not None):
            mean = sum(rewards) / len(rewards) if len(rewards) else 0.0
            if (self.min_reward is not None and mean < self.min_reward) or (self.max_reward is not None and mean > self.max_reward):
                return False
        return True


BRIEF = {"prompt_ids", "completion_ids", "logprobs", "generate_seconds", "reward_seconds", "created_at", "issued_at",
         "original", "sampling", "problem_ids", "texts"}
# fields named like a row's own keys: a dead letter's source partition and offset, a version's weights
RENAMED = {"kind": "weights", "partition": "source_partition", "offset": "source_offset"}


def describe(record, brief: bool = False) -> dict:
    """A flat, readable view of one record (long token lists summarised; ``brief``: the
    fields people scan for, floats rounded)."""
    out = {"kind": record.KIND}
    for name, value in vars(record).items():
        if brief and (name in BRIEF or value is None or (isinstance(value, str) and not value)):
            continue
        name = RENAMED.get(name, name)
        if isinstance(value, float):
            value = round(value, 4)
        if name == "rollouts":
            rewards = [getattr(r, "reward", None) for r in value]
            out["n"] = len(value)
            out["mean_reward"] = round(sum(rewards) / len(rewards), 4) if rewards else None
            texts = [getattr(r, "text", "") for r in value if getattr(r, "text", "")]
            turns = [model_turns(r.model_mask) for r in value if len(getattr(r, "model_mask", ()))]
            if turns:  # episodes: how many turns the model took, and how each ended
                out["turns"] = round(sum(turns) / len(turns), 2)
                out["finish"] = dict(Counter(r.finish_reason for r in value))
            if texts:
                out["first_text"] = texts[0][: 200 if turns else 40]
        elif name == "problems":  # an evaluation request's held-out problems
            out["problems"] = len(value)
        elif name == "rewards":  # an evaluation's answers: one per held-out problem
            out["answered"] = len(value)
            out["mean_reward"] = round(float(np.mean(value)), 4) if len(value) else None
        elif isinstance(value, bytes):
            out[name] = f"<{len(value)} bytes>"
        elif isinstance(value, (list, np.ndarray)) and len(value) > 8:
            out[name] = f"<{len(value)} items>"
        elif isinstance(value, np.ndarray):
            out[name] = value.tolist()
        elif hasattr(value, "__dataclass_fields__"):
            out[name] = vars(value)
        else:
            out[name] = value
    return out


def decode_for_tail(value: bytes) -> tuple[object | None, str | None]:
    try:
        return decode(value), None
    except DecodeError as exc:
        return None, f"{exc.reason}: {exc.detail}"[:200]


class Summary:
    """Per producer (rollout groups): rate, mean reward, and how many policy versions its groups
    were behind the newest version seen in the same messages (mean); counts otherwise."""

    def __init__(self):
        self.by_producer: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])  # groups, reward sum, rollouts
        self.span: dict[str, list[float]] = defaultdict(lambda: [float("inf"), float("-inf")])  # created_at range
        self.versions: dict[str, list[int]] = defaultdict(list)
        self.newest_version = 0
        self.kinds: dict[str, int] = defaultdict(int)
        self.undecodable = 0

    def add(self, record) -> None:
        self.kinds[record.KIND] += 1
        if record.KIND == "rollout_group" and record.rollouts:
            s = self.by_producer[record.producer_id]
            s[0] += 1
            s[1] += sum(record.rewards)
            s[2] += len(record.rollouts)
            self.versions[record.producer_id].append(record.policy_version)
            span = self.span[record.producer_id]
            span[0], span[1] = min(span[0], record.created_at), max(span[1], record.created_at)
            self.newest_version = max(self.newest_version, record.policy_version)

    def render(self) -> str:
        lines = [f"messages: {dict(self.kinds)}, undecodable: {self.undecodable}"]
        if self.by_producer:
            lines.append(f"{'producer':<16} {'groups':>7} {'groups/s':>9} {'mean reward':>12} {'behind newest':>14}")
            for pid, (groups, rsum, n) in sorted(self.by_producer.items()):
                behind = self.newest_version - sum(self.versions[pid]) / len(self.versions[pid])
                seconds = max(1e-9, self.span[pid][1] - self.span[pid][0])  # by the groups' own timestamps
                lines.append(f"{pid:<16} {groups:>7} {groups / seconds:>9.2f} {rsum / n:>12.3f} {behind:>14.2f}")
        return "\n".join(lines)


def tail(cfg, topic: str, *, flt: TailFilter, from_beginning: bool, follow: bool, as_json: bool, summary: bool,
         limit: int | None, out=sys.stdout) -> int:
    """Print the topic's messages (decoded and filtered); return how many were shown."""
    name = tail_topic(cfg.run.name, topic)
    consumer = _consumer(cfg.transport.kafka)
    shown = 0
    stats, said_at = Summary(), time.monotonic()
    try:
        tps = _position(consumer, name, from_beginning)
        while True:
            batches = consumer.poll(timeout_ms=500, max_records=500)
            for m in (m for tp_msgs in batches.values() for m in tp_msgs):
                row = _tail_row(m, flt, stats, brief=not as_json)
                if row is None:
                    continue
                if not summary:
                    print(json.dumps(row, default=str) if as_json else format_row(row), file=out)
                shown += 1
                if limit is not None and shown >= limit:
                    return shown
            if not follow and all(consumer.position(tp) >= consumer.highwater(tp) for tp in tps
                                  if consumer.highwater(tp) is not None):
                break
            if follow and summary and time.monotonic() - said_at >= FOLLOW_SUMMARY_S:
                print(stats.render(), file=out)
                said_at = time.monotonic()
        return shown
    finally:
        if summary:
            print(stats.render(), file=out)
        consumer.close()


def tail_topic(run: str, topic: str) -> str:
    """The full name of ``topic``: a kind (rollouts, problems, ...) of this run, or a full name."""
    if "." not in topic and topic not in TOPICS:
        raise UsageError(f"unknown topic kind {topic!r}: one of {', '.join(TOPICS)}, or a full topic name")
    return topic if "." in topic else topic_name(run, topic)


def cfg_bootstrap(consumer) -> str:
    return ",".join(consumer.config.get("bootstrap_servers", []))


def _position(consumer, name: str, from_beginning: bool) -> list:
    """Assign every partition of ``name`` and seek to its beginning or its end."""
    from kafka import TopicPartition

    tps = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or [])]
    if not tps:
        raise UsageError(f"no topic {name} on {cfg_bootstrap(consumer)}: check run.name and the broker")
    ends = end_offsets(consumer, tps)
    if from_beginning:
        consumer.seek_to_beginning(*tps)
    else:
        for tp in tps:
            consumer.seek(tp, ends[tp])
    return tps


def _tail_row(m, flt: TailFilter, stats: "Summary", brief: bool) -> dict | None:
    """One message as a row to show (counted in ``stats``), or None if the filter drops it."""
    record, error = decode_for_tail(m.value)
    if record is None:
        stats.undecodable += 1
        return {"partition": m.partition, "offset": m.offset, "undecodable": error}
    if not flt.keep(record):
        return None
    stats.add(record)
    return {"partition": m.partition, "offset": m.offset, **describe(record, brief=brief)}


def format_row(row: dict) -> str:
    head = f"{row['partition']}:{row['offset']:<7}"
    if "undecodable" in row:
        return f"{head} UNDECODABLE {row['undecodable']}"
    rest = {k: v for k, v in row.items() if k not in ("partition", "offset", "kind")}
    return f"{head} {row['kind']:<14} " + " ".join(f"{k}={v}" for k, v in rest.items())


def report(run_dir: str) -> tuple[list[str], list[tuple]]:
    """Every service's metrics under ``run_dir`` (metrics*.jsonl, parts included) drawn as
    learning_curve.png (when held-out evaluations finished) and run_report.png there; returns the
    PNG paths written and the run's trained tokens by rollout age (``plots.by_age``)."""
    from prl.metrics import read_run_metrics
    from prl.plots import by_age, learning_curve, run_report

    rows = read_run_metrics(run_dir)
    if not rows:
        raise UsageError(f"no metrics*.jsonl under {run_dir}: is run.run_dir the run's directory?")
    curve, page = f"{run_dir.rstrip('/')}/learning_curve.png", f"{run_dir.rstrip('/')}/run_report.png"
    run_report(rows, page)
    return ([curve, page] if learning_curve(rows, curve) else [page]), by_age([r for r in rows if "learner/loss" in r])


def format_ages(ages: list[tuple]) -> str:
    """The run's trained tokens by rollout age: how many, the share a clip took the gradient
    from, and their KL to the behaviour policy."""
    lines = [f"{'rollout age':<12} {'tokens':>10} {'clipped':>8} {'KL (k3)':>9}"]
    lines += [f"{age:<12} {tokens:>10,} {clipped:>8.3f} {kl:>9.1e}" for age, tokens, clipped, kl in ages]
    return "\n".join(lines)


def command(args, cfg) -> int:
    """`prl inspect topics|tail|report`."""
    if args.action == "report":
        written, ages = report(cfg.run.run_dir)
        print("wrote " + ", ".join(written) + ("" if len(written) == 2 else
              " (no learning curve: no held-out evaluation in the metrics; learner.eval_every = 0?)"))
        if ages:
            print(format_ages(ages))
        return 0

    from prl.transport.kafka import check_reachable

    if args.action == "tail":
        tail_topic(cfg.run.name, args.topic)  # a wrong argument is named before any connection
    check_reachable(cfg.transport.kafka)  # one line within seconds, not kafka-python's half minute of retries
    if args.action == "topics":
        print(format_topics(topic_report(cfg)))
        return 0
    flt = TailFilter(args.problem, args.min_version, args.max_version, args.min_reward, args.max_reward, args.producer)
    try:
        shown = tail(cfg, args.topic, flt=flt, from_beginning=args.from_beginning, follow=args.follow, as_json=args.json,
                     summary=args.summary, limit=args.limit)
    except KeyboardInterrupt:
        return 0
    if not shown and not args.summary:
        print(nothing_shown(cfg, args), file=sys.stderr)
    return 0


def nothing_shown(cfg, args) -> str:
    """Why a tail printed nothing: the topic is empty, it was read from its end, or the filters
    kept nothing; and what to change."""
    name = tail_topic(cfg.run.name, args.topic)
    held = topic_size(cfg.transport.kafka, name)
    if held == 0:
        return f"{name} is empty: no message has been written to it"
    if not args.from_beginning:
        return (f"no new messages in {name}, read from its end (it holds {held:,}); --from-beginning shows them, "
                "--follow waits for new ones")
    return f"none of the {held:,} messages in {name} passed the filters"


def topic_size(cfg, name: str) -> int:
    """Messages a topic holds now (high watermarks less the first offsets)."""
    from kafka import TopicPartition

    consumer = _consumer(cfg)
    try:
        tps = [TopicPartition(name, p) for p in sorted(consumer.partitions_for_topic(name) or [])]
        ends, starts = end_offsets(consumer, tps), consumer.beginning_offsets(tps)
        return sum(ends[tp] - starts[tp] for tp in tps)
    finally:
        consumer.close()
