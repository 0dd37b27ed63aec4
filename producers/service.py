"""A producer: turn dispatched problems into scored, versioned rollout groups.

Loop, top to bottom:
  1. load newer weights if the learner announced a checkpoint (the policy topic);
  2. poll up to ``max_dispatches_per_call`` dispatches, lingering ``linger_ms`` to fill the call
     (consumer group: producers share them);
  3. generate G completions for each in one engine call;
  4. score each completion with the reward function;
  5. publish one RolloutGroup per dispatch, carrying the loaded policy version;
  6. wait for the broker's acknowledgement, then commit the dispatch offsets.
"""

from __future__ import annotations

import time

from prl.generation import Request, make_backend
from prl.rewards import RewardRunner, load_reward
from prl.models import weights_exist
from prl.service import Service
from schemas import Dispatch, PolicyVersion, Rollout, RolloutGroup, encode, headers
from schemas.topics import POLICY, PROBLEMS, ROLLOUTS


class Producer(Service):
    name = "producer"

    def __init__(self, cfg, transport, metrics=None, backend=None):
        super().__init__(cfg, transport, metrics)
        if cfg.producer.threads:
            import torch

            torch.set_num_threads(cfg.producer.threads)
        self.backend = backend or make_backend(cfg.producer.backend, cfg.model.path, cfg.model.dtype)
        self.reward = RewardRunner(load_reward(cfg.producer.reward), cfg.producer.reward_timeout_s)
        self.producer_id = cfg.producer.producer_id
        self.log = self.log.bind(producer_id=self.producer_id)
        self.dispatches = transport.subscriber([self.topic(PROBLEMS)], group=f"{cfg.run.name}.producers")
        self.policy = transport.subscriber([self.topic(POLICY)], group=None, from_beginning=True)

    def step(self) -> bool:
        self.maybe_reload()
        msgs = self.poll_dispatches()
        dispatches = [d for d in (self.decode_or_dead_letter(m, Dispatch) for m in msgs) if d is not None]
        if dispatches:
            for group in self.rollout_groups(dispatches):
                self.publisher.publish(self.topic(ROLLOUTS), encode(group), key=group.problem_id.encode(), headers=headers(group))
            self.publisher.flush()
        if msgs:
            self.dispatches.commit()
        return False

    def poll_dispatches(self) -> list:
        """Up to max_dispatches_per_call dispatches: wait for the first, then linger briefly
        for more, since one engine call with many prompts costs little more than one with a few."""
        limit = self.cfg.producer.max_dispatches_per_call
        msgs = self.dispatches.poll(self.poll_s, max_records=limit)
        deadline = time.monotonic() + self.cfg.producer.linger_ms / 1000
        while msgs and len(msgs) < limit and (left := deadline - time.monotonic()) > 0:
            msgs += self.dispatches.poll(left, max_records=limit - len(msgs))
        return msgs

    def maybe_reload(self) -> None:
        newest = None
        for msg in self.policy.poll(0.0):
            record = self.decode_or_dead_letter(msg, PolicyVersion)
            if record is not None and record.checkpoint_uri and (newest is None or record.version > newest.version):
                newest = record
        if newest is not None and newest.version > self.backend.version:
            t0 = time.perf_counter()
            try:
                self.backend.load_weights(newest.checkpoint_uri, newest.version)
            except Exception:
                if weights_exist(newest.checkpoint_uri):
                    raise
                # The learner keeps its last few checkpoints only: this one was superseded and
                # deleted before we read it. The newer one's announcement follows.
                self.count("superseded_checkpoints_skipped")
                self.log.info("checkpoint_superseded", policy_version=newest.version, uri=newest.checkpoint_uri)
                return
            self.log.info("weights_loaded", policy_version=newest.version, seconds=round(time.perf_counter() - t0, 3))

    def prepare(self, d: Dispatch) -> list[int] | str:
        """The prompt's token ids, or why this problem cannot be served."""
        try:
            prompt_ids = self.backend.encode(d.prompt, chat=d.chat)
            self.backend.check(prompt_ids, d.sampling)
            return prompt_ids
        except Exception as exc:  # a bad problem must not stop the producer
            return f"{type(exc).__name__}: {exc}"

    def rollout_groups(self, dispatches: list[Dispatch]) -> list[RolloutGroup]:
        """One RolloutGroup per dispatch: every servable prompt in one engine call; an
        unservable one answered with an error group (the scheduler retires the problem)."""
        t0 = time.perf_counter()
        prepared = [self.prepare(d) for d in dispatches]
        groups = []
        for d, p in zip(dispatches, prepared):
            if isinstance(p, str):
                self.count("problem_errors")
                self.log.error("problem_unservable", problem_id=d.problem_id, error=p)
                groups.append(RolloutGroup(d.dispatch_id, d.problem_id, self.backend.version, self.producer_id, [],
                                           d.sampling.temperature, [], created_at=time.time(), error=p))
        ok = [(d, p) for d, p in zip(dispatches, prepared) if not isinstance(p, str)]
        if not ok:
            return groups
        results = self.backend.generate([Request(p, d.group_size, d.sampling) for d, p in ok])
        gen_s = (time.perf_counter() - t0) / len(ok)
        for (d, prompt_ids), completions in zip(ok, results):
            t1 = time.perf_counter()
            rollouts = []
            for c in completions:
                text = self.backend.decode(c.token_ids)
                reward = self.reward(text, d.answer)
                rollouts.append(Rollout(c.token_ids, c.logprobs, reward, c.finish_reason, text))
            groups.append(
                RolloutGroup(
                    d.dispatch_id, d.problem_id, self.backend.version, self.producer_id, prompt_ids,
                    d.sampling.temperature, rollouts, gen_s, time.perf_counter() - t1, time.time(),
                )
            )
        self.count("groups_published", len(groups))
        self.counters["reward_errors"] = self.reward.errors
        self.counters["reward_timeouts"] = self.reward.timeouts
        return groups

    def gauges(self) -> dict:
        return {**self.counters, "policy_version": self.backend.version}

    def close(self) -> None:
        self.reward.close()
        self.dispatches.close()
        self.policy.close()
        super().close()
