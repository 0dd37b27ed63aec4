"""Topic names and their settings, in one place.

Every topic is named ``<run>.<kind>`` so several runs can share one Kafka cluster. The
settings here are the ones the services create topics with and the Kubernetes
KafkaTopic resources declare (deploy/k8s checks they agree).
"""

from __future__ import annotations

from dataclasses import dataclass

from prl.schemas import records

PROBLEMS, ROLLOUTS, BATCHES, POLICY, DEADLETTER = "problems", "rollouts", "batches", "policy", "deadletter"

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    kind: str
    record: type
    writer: str
    readers: str
    key: str
    partitions: int
    retention_ms: int
    compacted: bool = False


TOPICS: dict[str, TopicSpec] = {
    PROBLEMS: TopicSpec(PROBLEMS, records.Dispatch, "scheduler", "producers (one group)", "problem id", 4, DAY_MS),
    ROLLOUTS: TopicSpec(ROLLOUTS, records.RolloutGroup, "producers", "scheduler", "problem id", 4, 7 * DAY_MS),
    BATCHES: TopicSpec(BATCHES, records.TrainBatch, "scheduler", "learner", "none", 1, 7 * DAY_MS),
    POLICY: TopicSpec(POLICY, records.PolicyVersion, "learner", "scheduler, producers", "run", 1, -1, compacted=True),
    DEADLETTER: TopicSpec(DEADLETTER, records.DeadLetter, "any service", "operators, prl inspect", "source topic", 1, 28 * DAY_MS),
}


def topic_name(run: str, kind: str) -> str:
    if kind not in TOPICS:
        raise KeyError(f"unknown topic kind {kind!r}; known: {sorted(TOPICS)}")
    return f"{run}.{kind}"
