"""The learner: consume TrainBatches in order, re-check staleness, take a GRPO step,
checkpoint to object storage, announce the new policy version.

Loop, top to bottom:
  1. poll the batch topic (one batch at a time);
  2. skip a batch whose sequence number was already trained (at-least-once delivery);
  3. drop rollouts older than tau_max (counted), train on the rest;
  4. every ``checkpoint_every`` steps write a checkpoint, then publish PolicyVersion;
  5. commit the batch offset; evaluate on the held-out set every ``eval_every`` steps.
"""

from __future__ import annotations

import time

from learner import checkpoint
from learner.evaluate import heldout_accuracy
from learner.train import make_optimizer, train_step
from prl.models import export_state, load_model, load_tokenizer, resolve_model_dir
from prl.service import Service
from producers.backends import TransformersBackend
from producers.rewards import load_reward
from prl.tasks import heldout_problems
from schemas import PolicyVersion, TrainBatch, encode, headers
from schemas.topics import BATCHES, POLICY


class Learner(Service):
    name = "learner"

    def __init__(self, cfg, transport, metrics=None):
        super().__init__(cfg, transport, metrics)
        import torch

        if cfg.learner.threads:
            torch.set_num_threads(cfg.learner.threads)
        torch.manual_seed(cfg.run.seed)
        self.model = load_model(cfg.model.path, cfg.model.dtype)
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.optimizer = make_optimizer(self.model, cfg.learner)
        self.version = 0
        self.last_seq = -1
        self.checkpoint_uri = ""
        self.rollouts_generated = 0
        self.heldout = heldout_problems(cfg.task)
        self.reward_fn = load_reward(cfg.producer.reward)
        self.eval_backend = TransformersBackend(self.model, self.tokenizer)
        self._resume()
        self.batches = transport.subscriber([self.topic(BATCHES)], group=f"{cfg.run.name}.learner")
        self.announce()
        if cfg.learner.eval_every and self.heldout and self.version == 0:
            self.evaluate()

    def _resume(self) -> None:
        uri = checkpoint.latest_uri(self.cfg.run.run_dir)
        if uri is None:
            return
        state = checkpoint.load_checkpoint(uri, self.model, self.optimizer)
        self.version, self.last_seq = state["step"], state["last_batch_seq"]
        self.rollouts_generated = state.get("rollouts_generated", 0)
        self.checkpoint_uri = uri
        self.log.info("resumed", version=self.version, last_batch_seq=self.last_seq)

    def announce(self) -> None:
        record = PolicyVersion(self.version, self.checkpoint_uri, self.last_seq, time.time())
        self.publisher.publish(self.topic(POLICY), encode(record), key=self.cfg.run.name.encode(), headers=headers(record))
        self.publisher.flush()

    def step(self) -> bool:
        if self.version >= self.cfg.learner.max_steps:
            return True
        for msg in self.batches.poll(self.poll_s, max_records=1):
            batch = self.decode_or_dead_letter(msg, TrainBatch)
            if batch is not None:
                self.train_on(batch)
            self.batches.commit()
        return self.version >= self.cfg.learner.max_steps

    def train_on(self, batch: TrainBatch) -> None:
        if batch.seq <= self.last_seq:
            self.count("duplicate_batches")
            self.log.info("duplicate_batch_skipped", seq=batch.seq, last_seq=self.last_seq)
            return
        tau_max = self.cfg.scheduler.tau_max
        usable = [r for r in batch.rollouts if self.version - r.policy_version <= tau_max]
        self.count("stale_dropped", len(batch.rollouts) - len(usable))
        self.rollouts_generated = max(self.rollouts_generated, batch.rollouts_generated)
        if not usable:
            self.last_seq = batch.seq
            return
        t0 = time.perf_counter()
        stats = train_step(self.model, self.optimizer, usable, self.cfg.learner, self.pad_id)
        ages = [self.version - r.policy_version for r in usable]
        self.version += 1
        self.last_seq = batch.seq
        for a in sorted(set(ages)):
            stats[f"age_hist/{a}"] = ages.count(a)
        stats.update(
            train_seconds=time.perf_counter() - t0,
            age_mean=sum(ages) / len(ages),
            age_max=max(ages),
            mean_reward=sum(r.reward for r in usable) / len(usable),
            stale_dropped=self.counters.get("stale_dropped", 0),
        )
        if self.version % self.cfg.learner.checkpoint_every == 0 or self.version >= self.cfg.learner.max_steps:
            self.save()
        self.announce()
        self.emit(stats, step=self.version, rollouts_generated=self.rollouts_generated, batch_seq=batch.seq)
        self.log.info("step", step=self.version, loss=round(stats["loss"], 4), reward=round(stats["mean_reward"], 3), rollouts=len(usable))
        every = self.cfg.learner.eval_every
        if every and self.heldout and (self.version % every == 0 or self.version >= self.cfg.learner.max_steps):
            self.evaluate()

    def save(self) -> None:
        state = {"last_batch_seq": self.last_seq, "rollouts_generated": self.rollouts_generated, "counters": self.counters}
        self.checkpoint_uri = checkpoint.write_checkpoint(
            self.cfg.run.run_dir, self.version, export_state(self.model), self.optimizer, state,
            resolve_model_dir(self.cfg.model.path), self.cfg.learner.keep_checkpoints,
        )

    def evaluate(self) -> dict:
        t0 = time.perf_counter()
        acc = heldout_accuracy(self.eval_backend, self.heldout, self.reward_fn, self.cfg.sampling.max_tokens)
        acc["eval_seconds"] = time.perf_counter() - t0
        self.emit({f"eval/{k}": v for k, v in acc.items()}, step=self.version, rollouts_generated=self.rollouts_generated)
        self.log.info("heldout", step=self.version, **{k: round(v, 3) for k, v in acc.items()})
        self.last_eval = acc
        return acc

    def gauges(self) -> dict:
        return {**self.counters, "version": self.version, "last_batch_seq": self.last_seq,
                "rollouts_generated": self.rollouts_generated}

    def close(self) -> None:
        self.batches.close()
        super().close()
