"""The real scheduler on the in-memory transport, its dispatches answered by hand (no
producer, no learner): for tests of what given results make the scheduler do."""

import json

import numpy as np

from prl.transport.memory import MemoryBroker, MemoryTransport
from tests.support.addition import small_addition
from prl.schemas import Dispatch, Rollout, RolloutGroup, decode, encode, headers, topic_name
from prl.schemas.config import load_config
from prl.schemas.topics import PROBLEMS, ROLLOUTS


def desk_config(tmp_path, **extra):
    """A small unlabelled priority run without replay, 4 groups of 8 per batch; ``extra``: KEY=VALUE overrides."""
    overrides = [
        f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "sampling.group_size=8",
        "scheduler.strategy='priority'", "scheduler.replay.ratio=0",
        "scheduler.groups_per_batch=4", "scheduler.max_in_flight=4", *small_addition(tmp_path / "data"),
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(overrides=overrides)


class Desk:
    """The scheduler's counterpart: reads its dispatches and answers them with given rewards."""

    def __init__(self, cfg, transport):
        self.cfg, self.transport = cfg, transport
        self.dispatches = transport.subscriber([topic_name(cfg.run.name, PROBLEMS)], group=None)
        self.publisher = transport.publisher()
        self.unanswered: list[Dispatch] = []  # read by answer_next, not answered yet

    def answer_next(self, rewards: list[float]) -> RolloutGroup:
        """Answer the oldest dispatch not answered yet (reading the new ones)."""
        self.unanswered += self.read()
        return self.answer(self.unanswered.pop(0), rewards)

    def read(self) -> list[Dispatch]:
        return [decode(m.value, Dispatch) for m in self.dispatches.poll(0.0)]

    def answer(self, d: Dispatch, rewards: list[float], version: int = 0, prompt=(1, 2, 3),
               completions: bool = True) -> RolloutGroup:
        tokens, logprobs = ([5, 6], [-0.1, -0.2]) if completions else ([], [])
        rollouts = [Rollout(np.asarray(tokens, dtype=np.int32), np.asarray(logprobs, dtype=np.float32), r, "stop")
                    for r in rewards]
        group = RolloutGroup(d.dispatch_id, d.problem_id, version, "desk", np.asarray(prompt, dtype=np.int32), 1.0,
                             rollouts)
        self.publisher.publish(topic_name(self.cfg.run.name, ROLLOUTS), encode(group), key=d.problem_id.encode(),
                               headers=headers(group))
        return group


def started(tmp_path, **extra):
    from prl.scheduler.service import Scheduler

    cfg = desk_config(tmp_path, **extra)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)
    scheduler.step()
    return cfg, transport, scheduler, Desk(cfg, transport)
