"""The learner: consume TrainBatches in order, re-check staleness, take a GRPO step, publish
the new policy version to object storage and announce it; checkpoint every few steps.

Loop, top to bottom:
  1. poll the batch topic (one batch at a time; under torchrun rank 0 polls and broadcasts);
     a claim-check batch has its rollouts fetched from the rollouts topic;
  2. dead-letter a batch it must not train (beyond its window, a rollout from a version it has
     not made, every rollout too old, a token outside the vocabulary, a rollout past the
     context); skip one whose sequence number was already trained (at-least-once delivery);
  3. drop rollouts older than tau_max and fresh rollouts already trained (both counted),
     train on the rest;
  4. publish the new version (the weights in ``model.dtype``, as a sparse delta where that is
     smaller, or the LoRA adapter alone; prl/policy.py) and announce it with a PolicyVersion
     carrying its checksum;
  5. every ``checkpoint_every`` steps checkpoint (float32 weights, optimizer state, counters):
     on a GPU copied to host memory in the step and written on a background thread while
     training goes on, made the latest at a step boundary once whole; then the batch offsets it
     covers are committed (so a restarted learner neither skips nor repeats a batch). A
     learner that ends short of a failure (its last step, its batch file's end, SIGTERM
     between steps) checkpoints the step it ended at.

The learner only learns: held-out evaluation is the generation fleet's (scheduler/evaluation.py).

A restarted learner resumes from its last checkpoint and trains again the batches after it
(after a kill, not after a stop).
The versions it makes again are not announced: a version number names one set of weights for
good, so numbering resumes past the newest version in storage (``policy.newest_version``), and
until the learner passes it, its weights go nowhere. That newest version is announced at the start,
as it was written: the learner before may have been killed between writing and announcing it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from prl import epochs
from prl.learner import checkpoint, distributed
from prl.learner.sources import FileSource, GroupCache, TopicSource, resolve_batch
from prl.learner.train import make_optimizer, train_step
from prl import storage
from prl.errors import one_line
from prl.devices import bf16_autocast_on, choose_device, memory_bytes, native_bf16
from prl.formulas import rollout_age
from prl.models import context_length, export_state, load_model, load_state, load_tokenizer, lora_config, resolve_model_dir
from prl.policy import PolicyWriter, VersionRejected, newest_version, read_meta
from prl.trust import policy_root, version_name
from prl.service import Service, ServiceStopped
from prl.transport import TransportError
from prl.schemas import DecodeError, PolicyVersion, TrainBatch, TrainBatchRefs, decode, encode
from prl.schemas.topics import BATCHES, POLICY, ROLLOUTS


TRAINED_MEMORY = 20_000  # fresh rollout ids remembered (and checkpointed) to refuse a second training
FETCH_CACHE_BYTES = 256 << 20  # claim-check batches: rollout groups kept so a replayed one is not fetched again
KEEP_CHECKPOINTS = 3
# Versions taken but not yet written, at most. Each holds a snapshot of the weights (on the GPU
# when the learner trains there), and on a GPU a step can be faster than encoding and writing a
# version on the host: past this the learner waits (its publish_seconds say how long).
UNWRITTEN_VERSIONS = 2
# Checkpoints are written in the background on these devices (a GPU trains while the host's cores
# write; on a CPU the cores that would write are the ones training: RESULTS, "Checkpoints"), where
# their copy in host memory takes at most this share of it.
BACKGROUND_DEVICES = ("cuda",)
HOST_SHARE_FOR_CHECKPOINTS = 0.5
# Under torchrun, rank 0's word to the other ranks, waiting in their step: stop here (a batch, an
# Arrow stream, is never these bytes). They stop when rank 0 does, at the same step, whenever
# SIGTERM reached each, so that they can checkpoint it together.
STOPPING = b"stop"


@dataclass
class Checkpointing:
    """A checkpoint whose files a background thread is writing."""

    step: int
    files: Future  # -> {file name: checksum} of this rank's files
    positions: dict | None  # the batch offsets it covers (the main rank's), committed once it is the latest
    started: float


@contextmanager
def fitting(ckpt):
    """Loading ``ckpt`` into this learner's model and optimizer: a checkpoint that does not fit
    them (the run continued with another model.path or learner.lora_rank) is one line."""
    try:
        yield
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ServiceStopped(f"{ckpt.uri} does not fit this model ({one_line(exc)[:200]}): continue the run with the "
                             "model.path and learner.lora_rank it started with, or give a new run_dir") from None


MEMORY_FIX = "train a LoRA adapter (learner.lora_rank), or shard the learner over more GPUs (torchrun, deploy/k8s/README)"


class Learner(Service):
    name = role = "learner"
    reads, writes = (BATCHES, ROLLOUTS), (POLICY,)  # rollouts: claim-check batches are fetched from it
    retries_storage = False  # a step is not repeated after it trained: its writes wait out the object store (storage.retried)
    checkpoint_seconds = 0.0  # what the last checkpoint cost the step (prl run's budget keeps that for the last one)

    def __init__(self, cfg, transport, metrics=None, batches_from: str | None = None):
        """``batches_from``: train from a file of TrainBatch records (path or fsspec URI) instead
        of the batch topic (`prl learner --batches-from`, `prl replay train`)."""
        self.device = choose_device(cfg.run.device)  # model, optimizer state, batches and loss live there
        self.dist = distributed.setup(self.device)
        self.is_main = self.dist is None or self.dist.is_main
        super().__init__(cfg, transport, metrics if self.is_main else None)
        self.answers_http = self.is_main  # the ranks of a pod share its port; one that stalls stalls rank 0 with it
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        torch.manual_seed(cfg.run.seed)
        self.model = load_model(cfg.model.path, "float32")  # master weights; versions go out in model.dtype
        self.lora = cfg.learner.lora_rank > 0
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.version, self.last_seq, self.rollouts_generated, self.checkpoint_uri = 0, -1, 0, ""
        self.saved_version = 0  # the version of the last checkpoint (0: the base model)
        self.trained: OrderedDict[str, None] = OrderedDict()  # fresh rollout ids, newest last
        self.resume_and_shard()
        self.published = newest_version(cfg.run.run_dir)  # numbers up to it are never announced again
        self.writer = PolicyWriter(cfg.run.run_dir, cfg.model.dtype)
        self.outgoing: deque = deque()  # (version, last batch seq, future of its write), oldest first
        self.unacknowledged_announcement = False
        report = distributed.memory_report(self.model, self.dist)
        self.stop_unless_it_fits(report)
        self.checkpoints_in_background = self.writes_checkpoints_in_background(report)
        self.checkpoint_writer = ThreadPoolExecutor(1, thread_name_prefix="prl-checkpoint")
        self.checkpointing: Checkpointing | None = None
        if self.is_main:
            self.log_precision()
        self.source, self.exhausted, self.groups = None, False, None  # groups: claim-check batches' rollouts, made on first use
        self.told_to_stop = False  # a rank other than 0, by rank 0 (STOPPING)
        self.epoch = epochs.claim(cfg.run.run_dir, "learner") if self.is_main else 0  # a learner before this one is fenced
        if self.is_main:
            self.source = FileSource(batches_from) if batches_from else \
                TopicSource(transport.subscriber([self.topic(BATCHES)], group=f"{cfg.run.name}.learner"))
            self.announce_start()

    def stop_unless_it_fits(self, report: dict) -> None:
        """Log what the weights, gradients and AdamW state take on this rank's device, and stop
        now, in one line, where that alone exceeds the device's memory: the first step would run
        out of it, after the producers had worked for it."""
        self.log.info("memory", **report)
        have = memory_bytes(self.device)
        if report["total_bytes"] > have:
            raise ServiceStopped(f"the learner's weights, gradients and AdamW state take {report['total_bytes'] / 2**30:.1f} "
                                 f"GiB (16 bytes a trained parameter) and {self.device} has {have / 2**30:.1f} GiB: "
                                 f"{MEMORY_FIX}")

    def writes_checkpoints_in_background(self, report: dict) -> bool:
        """On a device of BACKGROUND_DEVICES whose host can hold a checkpoint's copy (float32
        weights and AdamW's moments; on a CPU besides the learner's own state) in at most
        HOST_SHARE_FOR_CHECKPOINTS of its memory; else checkpoints are written in the step."""
        whole = report["parameter_bytes"] * report["world"]  # under FSDP rank 0 gathers the whole model's weights
        weights = report["gradient_bytes"] if self.lora else whole if self.is_main else 0
        copy = weights + report["optimizer_bytes"] + (report["total_bytes"] if self.device.type == "cpu" else 0)
        host = memory_bytes(torch.device("cpu"))
        background = self.device.type in BACKGROUND_DEVICES and copy <= HOST_SHARE_FOR_CHECKPOINTS * host
        self.log.info("checkpoint_writes", where="background" if background else "in the step", device=self.device.type,
                      host_copy_gib=round(copy / 2**30, 2), host_gib=round(host / 2**30, 1))
        return background

    def log_precision(self) -> None:
        """Say once where and in what precision training runs (float32 master weights and AdamW
        state, bf16 autocast or not); warn when bf16 was asked for where it is emulated (a CPU with
        AVX2 alone: 16x slower than fp32, measured), and when a GPU that computes bf16 trains in
        float32."""
        setting, native = self.cfg.learner.bf16_autocast, native_bf16(self.device.type)
        self.log.info("precision", device=str(self.device), bf16_autocast=bf16_autocast_on(setting, native),
                      native_bf16=native, master_weights="float32")
        if setting is True and not native:
            self.log.warning("bf16_autocast_emulated", fix="this device computes bf16 only by emulation (no GPU, AVX512-BF16 "
                             "or AMX), far slower than fp32: set learner.bf16_autocast = \"auto\" or false")
        if setting is False and native and self.device.type == "cuda":
            self.log.warning("float32_on_gpu", fix="this GPU computes bf16 natively and training runs in float32: set "
                             "learner.bf16_autocast = \"auto\" for bf16 compute (master weights stay float32)")

    def resume_and_shard(self) -> None:
        """Weights from the latest checkpoint (into the whole model), then FSDP sharding, then
        the optimizer and its state (re-sharded for this run's ranks)."""
        ckpt = checkpoint.newest_checkpoint(self.cfg.run.run_dir)
        with fitting(ckpt):
            if self.lora:
                self.wrap_lora(ckpt)
            elif ckpt is not None:
                load_state(self.model, ckpt.weights)
        self.model.to(self.device)  # before sharding and the optimizer: both follow the parameters
        if self.dist is not None:
            distributed.shard(self.model, self.dist, self.cfg.learner.activation_checkpointing)
        elif self.cfg.learner.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.optimizer = make_optimizer(self.model, self.cfg.learner)
        if ckpt is not None:
            with fitting(ckpt):
                checkpoint.load_optimizer(ckpt, self.optimizer, self.dist)
            for group in self.optimizer.param_groups:  # the configured rate, whatever the checkpoint's was
                group["lr"] = self.cfg.learner.lr
            state = ckpt.state
            self.version, self.last_seq = state["step"], state["last_batch_seq"]
            self.rollouts_generated = state.get("rollouts_generated", 0)
            self.trained = OrderedDict.fromkeys(state.get("trained_rollouts", []))
            self.checkpoint_uri, self.saved_version = ckpt.uri, self.version
            self.log.info("resumed", version=self.version, last_batch_seq=self.last_seq, uri=ckpt.uri,
                          from_world=state.get("world_size", 1))

    def wrap_lora(self, ckpt) -> None:
        """learner.lora_rank: train a LoRA adapter on the frozen base (peft), from the checkpoint's
        adapter if there is one."""
        if self.dist is not None:
            raise ServiceStopped("learner.lora_rank is not supported under torchrun: run the LoRA learner as one process")
        try:
            from peft import get_peft_model, set_peft_model_state_dict
        except ImportError:
            raise ServiceStopped("learner.lora_rank needs peft: pip install -e '.[lora]'") from None
        self.model = get_peft_model(self.model, lora_config(self.cfg.learner.lora_rank))
        if ckpt is not None:
            set_peft_model_state_dict(self.model, ckpt.weights)

    def policy_tensors(self) -> dict:
        """What a version holds: the adapter (LoRA), else every weight in Hugging Face layout
        (gathered on rank 0 under FSDP; {} on the other ranks)."""
        if self.lora:
            from peft import get_peft_model_state_dict

            return {k: v.detach() for k, v in get_peft_model_state_dict(self.model).items()}
        weights = distributed.full_weights(self.model, self.dist)
        return export_state(self.model, weights) if weights else {}

    def publish(self) -> dict:
        """Write this version (unless it was written before a restart) and announce it; return
        its figures for the step's metrics."""
        tensors = self.policy_tensors()
        if self.version <= self.published:  # trained again after a restart: its number names other weights
            self.count("versions_not_announced_again")
            return {}
        if not self.is_main:
            return {}
        self.stop_if_replaced()
        t0 = time.perf_counter()
        while sum(not f.done() for _, _, f in self.outgoing) >= UNWRITTEN_VERSIONS:  # the writer is behind
            next(f for _, _, f in self.outgoing if not f.done()).exception()  # wait for its oldest version
        self.outgoing.append((self.version, self.last_seq, self.writer.publish_async(self.version, tensors, self.lora, self.last_seq)))
        self.published = self.version
        try:
            self.announce_written()
        except TransportError as exc:  # kept by the publisher, sent again by the next step; this one is trained
            self.count("announcements_retried")
            self.log.warning("announcement_not_acknowledged", error=str(exc)[:200])
        return {"publish_seconds": time.perf_counter() - t0}  # the learner's own time; the writing is the writer's

    def announce_written(self, wait: bool = False) -> None:
        """Announce, in order, the versions whose writing has finished (with ``wait``, all of
        them, once written), each with a metrics line of its bytes and writing time. An
        announcement the broker does not acknowledge is kept by the publisher and sent again,
        before anything newer, at the next flush."""
        while self.outgoing and (wait or self.outgoing[0][2].done()):
            version, last_seq, future = self.outgoing.popleft()
            written = future.result()  # a write that failed stops the learner: nothing unwritten is announced
            self.emit({"version_bytes": written.bytes, "write_seconds": written.seconds, f"version_kind/{written.kind}": 1},
                      step=version)
            self.announce(PolicyVersion(version, written.uri, last_seq, time.time(), written.kind, written.checksum, self.epoch))

    def announce_start(self) -> None:
        """Say where the learner starts: the base model (a fresh run), or the version of the
        checkpoint it resumed from, as it was written then (the same number, the same weights),
        so a scheduler that restarted with it knows which batches it has trained. Then the
        newest whole version in storage past it, which the learner before this one may have
        written and not announced: a scheduler that waits for it to send more batches would
        otherwise wait for good, since this learner never announces that number."""
        if self.version == 0:
            self.announce(PolicyVersion(0, "", -1, time.time(), epoch=self.epoch))
        else:
            self.announce_stored(self.version, self.last_seq)
        for version in range(self.published, self.version, -1):
            if self.announce_stored(version):
                break

    def stored_meta(self, version: int) -> dict | None:
        """``version``'s version.json as storage holds it; None if it is pruned or was cut off mid-write."""
        try:
            return read_meta(f"{policy_root(self.cfg.run.run_dir)}/{version_name(version)}", version)
        except VersionRejected:
            return None  # pruned (older than the kept chains) or half-written: later versions will say it

    def announce_stored(self, version: int, last_seq: int | None = None) -> bool:
        """Announce ``version`` as storage holds it, trained on the batches up to ``last_seq``
        (None: as its version.json says); False if it is pruned or was cut off mid-write."""
        uri = f"{policy_root(self.cfg.run.run_dir)}/{version_name(version)}"
        if (meta := self.stored_meta(version)) is None:
            return False
        last_seq = meta.get("last_batch_seq") if last_seq is None else last_seq
        if not isinstance(last_seq, int) or last_seq < self.last_seq:
            return False
        self.announce(PolicyVersion(version, uri, last_seq, time.time(), meta["kind"], meta["checksum"], self.epoch))
        return True

    def pass_over_batches_through(self, seq: int) -> None:
        """Batches up to ``seq`` will never come (`prl run` continued: they went to a broker gone
        with the earlier process, untrained): take the next from ``seq + 1`` on. Among them are
        those that made the versions an earlier learner wrote past this one's checkpoint (killed
        between checkpoints): go on from the newest whole one, at the batch it was trained to, as
        the scheduler and producers, which saw it, do (made again, those versions would be
        announced to nobody, and the scheduler would wait for them with batches in hand). The
        first is what every continued `prl run` meets (logged); the second loses steps (warned of)."""
        if seq > self.last_seq:
            self.log.info("batches_passed_over", seqs=f"{self.last_seq + 1}..{seq}", why="lost with an earlier broker")
            self.last_seq = seq
        for version in range(self.published, self.version, -1):
            if (meta := self.stored_meta(version)) is not None and isinstance(meta.get("last_batch_seq"), int):
                self.log.warning("versions_passed_over", versions=f"{self.version + 1}..{version}",
                                 why="the earlier learner's, past its checkpoint; their batches are lost")
                self.version, self.last_seq = version, max(self.last_seq, meta["last_batch_seq"])
                break

    def announce(self, record: PolicyVersion) -> None:
        self.send(POLICY, record, key=self.cfg.run.name.encode())
        self.unacknowledged_announcement = True  # until a flush succeeds: the next step tries again first
        self.flush_announcements()

    def flush_announcements(self) -> None:
        """Wait for the broker to take every announcement sent (and what was published before it)."""
        self.publisher.flush()
        self.unacknowledged_announcement = False

    def step(self) -> bool:
        if self.version >= self.cfg.learner.max_steps or self.exhausted:
            self.announce_written(wait=True)
            self.publisher.flush()  # again, if the broker did not take the last ones before
            return True
        self.announce_written()
        if self.unacknowledged_announcement:  # it goes first (dead letters wait for the next flush)
            self.flush_announcements()
        data = None
        if self.is_main:
            msg, self.exhausted = self.source.next(self.poll_s)
            batch = self.resolve(msg) if msg is not None else None
            if batch is not None and (problem := self.batch_problem(batch)):
                self.reject(msg, *problem)
                self.commit_if_checkpointed()  # a restart does not read it again
                batch = None
            data = encode(batch) if batch is not None else (b"" if self.exhausted else None)
        if self.dist is not None:
            data = distributed.broadcast_bytes(data, self.dist)
        if data == STOPPING:
            self.told_to_stop = True
            return False
        if data == b"":
            self.exhausted = True
        elif data is not None:
            self.train_on(decode(data, TrainBatch))
        done = self.version >= self.cfg.learner.max_steps or self.exhausted
        if done and self.saved_version != self.version:  # the batch file ended between checkpoints
            self.save()
        self.complete_checkpoint(wait=done)
        if done:
            self.announce_written(wait=True)  # the last versions go out before the learner is done
            self.publisher.flush()
        return done

    def resolve(self, msg) -> TrainBatch | None:
        """The batch in ``msg`` (a claim-check batch with its rollouts fetched), or None after
        dead-lettering it."""
        record = self.decode_or_dead_letter(msg, (TrainBatch, TrainBatchRefs))
        if record is None:
            return None
        if isinstance(record, TrainBatchRefs) and self.groups is None:
            self.groups = GroupCache(self.transport.reader(), FETCH_CACHE_BYTES)
        try:
            with self.timed("fetch"):
                batch, fetched, cached = resolve_batch(record, self.groups, self.topic(ROLLOUTS),
                                               oldest_version=self.version - self.cfg.scheduler.tau_max)
        except DecodeError as exc:
            self.dead_letter(msg, exc)
            return None
        self.count("fetched_bytes", fetched)
        self.count("fetch_cache_bytes", cached)
        return batch

    def batch_problem(self, batch: TrainBatch) -> tuple[str, str] | None:
        """(reason, detail) if ``batch`` must not be trained: outside the window the
        scheduler can be ahead, a rollout from a version this learner has not made, every
        rollout too old, or a token the model has no embedding for. A batch already trained
        (a redelivery) is not a problem: train_on skips it."""
        if batch.seq <= self.last_seq:
            return None
        window = self.last_seq + self.cfg.scheduler.max_batches_ahead
        if batch.seq > window:
            return "outside_window", f"seq {batch.seq}: the scheduler is at most at {window} (last trained {self.last_seq})"
        if (newest := max(r.policy_version for r in batch.rollouts)) > self.version:
            return "future_rollout", f"a rollout of policy version {newest}, the learner is at {self.version}"
        if all(rollout_age(self.version, r.policy_version) > self.cfg.scheduler.tau_max for r in batch.rollouts):
            return "stale_batch", f"every rollout is older than tau_max at version {self.version}"
        if problem := self.unfit(batch):
            return "invalid_value", problem
        if isinstance(self.source, TopicSource) and (problem := epochs.fenced(self.cfg.run.run_dir, "scheduler", batch.epoch)):
            return "fenced_epoch", problem
        return None

    def commit_if_checkpointed(self) -> None:
        """Commit the batch offsets now if nothing trained is missing from the last checkpoint."""
        if self.source is not None and self.saved_version == self.version:
            self.deliver(self.source)  # its dead letter first

    def unfit(self, batch: TrainBatch) -> str | None:
        """Why this batch cannot go through the model: a token id it has no embedding for, or a
        rollout longer than its context (no producer samples past it; one of a million tokens
        would only run the learner out of memory, again after each restart)."""
        vocab = self.model.get_input_embeddings().num_embeddings
        context = context_length(self.model.config)
        for r in batch.rollouts:
            ids = np.concatenate([r.prompt_ids, r.completion_ids])
            if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                return f"rollout {r.rollout_id}: token id outside [0, {vocab})"
            if len(ids) > context:
                return f"rollout {r.rollout_id}: {len(ids)} tokens, over the model's context of {context}"
        return None

    def train_on(self, batch: TrainBatch) -> None:
        """One optimizer step on what is usable in ``batch``; then publish and announce the
        version, checkpoint every checkpoint_every steps, record metrics."""
        if batch.seq <= self.last_seq:
            self.count("duplicate_batches")
            self.log.info("duplicate_batch_skipped", seq=batch.seq, last_seq=self.last_seq)
            return
        usable, stale, repeats = self.usable_rollouts(batch)
        self.rollouts_generated = max(self.rollouts_generated, batch.rollouts_generated)
        if not usable:
            self.last_seq = batch.seq
            return
        self.remember_trained(usable)
        t0 = time.perf_counter()
        try:
            stats = train_step(self.model, self.optimizer, usable, self.cfg.learner, self.pad_id, self.dist, self.device,
                               version=self.version)
        except torch.OutOfMemoryError:
            longest = max(r.num_tokens for r in usable)
            raise ServiceStopped(f"the learner ran out of {self.device} memory in step {self.version + 1} ({len(usable)} "
                                 f"rollouts, the longest {longest} tokens): lower learner.micro_batch_tokens "
                                 f"({self.cfg.learner.micro_batch_tokens}), set learner.activation_checkpointing = true, "
                                 f"or {MEMORY_FIX}") from None
        stats.update(lr=self.optimizer.param_groups[0]["lr"], train_seconds=time.perf_counter() - t0,
                     **self.age_metrics(usable), mean_reward=sum(r.reward for r in usable) / len(usable),
                     stale_dropped=self.counters.get("stale_dropped", 0))
        self.warn_of_the_step(stats, batch.seq)
        self.version += 1
        self.last_seq = batch.seq
        if self.is_main:  # logged before the checkpoint: a step that is durable is always in the log
            self.log.info("step", step=self.version, loss=round(stats["loss"], 4), reward=round(stats["mean_reward"], 3),
                          rollouts=len(usable), batch_seq=batch.seq, batch_id=batch.batch_id, stale=stale, repeats=repeats)
        stats.update(self.publish())
        if self.version % self.cfg.learner.checkpoint_every == 0 or self.version >= self.cfg.learner.max_steps:
            t1 = time.perf_counter()
            self.save()
            self.checkpoint_seconds = stats["checkpoint_seconds"] = time.perf_counter() - t1
        self.last_stats = stats
        self.emit(stats, step=self.version, rollouts_generated=self.rollouts_generated, batch_seq=batch.seq)

    def warn_of_the_step(self, stats: dict, seq: int) -> None:
        """A step whose gradient overflowed moved no weight: say so. A step that takes more than
        half of the consumer group's poll interval risks the learner's partitions being taken
        away mid-step: say which setting to raise."""
        if stats["skipped"] and self.is_main:
            self.log.warning("step_skipped", step=self.version + 1, grad_norm=stats["grad_norm"], batch_seq=seq,
                             why="the gradient is not finite: the weights stay as they were (the version repeats them)")
        limit_s = self.cfg.transport.kafka.max_poll_interval_ms / 1000
        if stats["train_seconds"] > limit_s / 2:
            self.log.warning("step_near_poll_interval", seconds=round(stats["train_seconds"], 1), max_poll_interval_s=limit_s,
                             fix="raise transport.kafka.max_poll_interval_ms above twice the slowest step")

    def usable_rollouts(self, batch: TrainBatch) -> tuple[list, int, int]:
        """(rollouts to train on, stale dropped, repeats dropped): older than tau_max at this
        version, or a fresh rollout already trained, is dropped and counted."""
        tau_max = self.cfg.scheduler.tau_max
        fresh_enough = [r for r in batch.rollouts if rollout_age(self.version, r.policy_version) <= tau_max]
        usable = [r for r in fresh_enough if r.is_replay or r.rollout_id not in self.trained]
        stale, repeats = len(batch.rollouts) - len(fresh_enough), len(fresh_enough) - len(usable)
        self.count("stale_dropped", stale)
        self.count("repeat_dropped", repeats)
        return usable, stale, repeats

    def age_metrics(self, rollouts) -> dict:
        ages = [rollout_age(self.version, r.policy_version) for r in rollouts]
        return {"age_mean": sum(ages) / len(ages), "age_max": max(ages),
                **{f"age_hist/{a}": ages.count(a) for a in sorted(set(ages))}}

    def remember_trained(self, rollouts) -> None:
        for r in rollouts:
            if not r.is_replay:
                self.trained[r.rollout_id] = None
        while len(self.trained) > TRAINED_MEMORY:
            self.trained.popitem(last=False)

    def save(self) -> None:
        """Checkpoint this step: its state copied to host memory now and written by a background
        thread while training goes on (on a CPU, or where the host cannot hold the copy, written
        now from the state itself); it becomes the latest at a step boundary once whole
        (``complete_checkpoint``). One at a time: one still being written is waited for first."""
        self.complete_checkpoint(wait=True)
        if self.saved_version == self.version:
            return
        if self.is_main:
            self.stop_if_replaced()
        state = {"last_batch_seq": self.last_seq, "rollouts_generated": self.rollouts_generated, "counters": self.counters,
                 "trained_rollouts": list(self.trained)}
        files = checkpoint.checkpoint_files(self.version, self.policy_tensors(), self.optimizer, state,
                                            resolve_model_dir(self.cfg.model.path), *self.rank_and_world(),
                                            copy=self.checkpoints_in_background)
        self.checkpointing = Checkpointing(self.version, self.checkpoint_writer.submit(
            checkpoint.write_files, self.cfg.run.run_dir, self.version, files), self.source.positions() if self.is_main else None,
            time.perf_counter())
        if not self.checkpoints_in_background:
            self.complete_checkpoint(wait=True)

    def complete_checkpoint(self, wait: bool = False) -> None:
        """Make the checkpoint being written the latest once every rank's files are written
        (``wait``: wait for this rank's; under torchrun the ranks agree here, at the same point of
        the same step), then commit the batch offsets it covers: a restart re-reads what the
        latest checkpoint lacks. A write that failed raises here; the checkpoint before stays the latest."""
        pending = self.checkpointing
        if pending is None:
            return
        if wait or pending.files.done():
            self.checkpointing = None if pending.files.exception() else pending  # exception() waits for it
            written = pending.files.result()
        else:
            written = {}
        shards = [written.get(checkpoint.optimizer_shard_name(*self.rank_and_world()), "")]
        if self.dist is not None:
            shards = distributed.all_gather_strings(shards[0], self.dist)  # "" from a rank still writing
        if not all(shards):
            return
        self.checkpointing = None
        if self.is_main:
            self.stop_if_replaced()
            written.update({checkpoint.optimizer_shard_name(r, len(shards)): digest for r, digest in enumerate(shards)})
            checkpoint.complete_checkpoint(self.cfg.run.run_dir, pending.step, written, KEEP_CHECKPOINTS)
            self.emit({"checkpoint_write_seconds": time.perf_counter() - pending.started}, step=pending.step)
        self.checkpoint_uri, self.saved_version = checkpoint.checkpoint_uri(self.cfg.run.run_dir, pending.step), pending.step
        if self.is_main:
            self.deliver(self.source, pending.positions)

    def stop_requested(self, stop) -> bool:
        """``stop`` (SIGTERM) on rank 0; under torchrun the other ranks wait for its word."""
        return stop.is_set() if self.is_main else self.told_to_stop

    def stopped(self) -> None:
        """Stopped between steps (SIGTERM): checkpoint the last step trained, so that the next
        learner goes on from it instead of training the steps since the last checkpoint again
        (whose versions it could not announce). Its offsets not committed (the broker away),
        the next learner reads those batches again and skips them."""
        if self.dist is not None and self.is_main:
            distributed.broadcast_bytes(STOPPING, self.dist)
        if self.saved_version != self.version:
            if self.is_main:
                self.log.info("checkpointing_before_stop", step=self.version)
            self.save()
        try:
            self.complete_checkpoint(wait=True)
        except TransportError as exc:
            self.log.warning("checkpoint_offsets_not_committed", step=self.saved_version, error=str(exc)[:300])

    def rank_and_world(self) -> tuple[int, int]:
        return (self.dist.rank, self.dist.world) if self.dist is not None else (0, 1)

    def progress(self):
        return self.version, self.last_seq

    def waiting_for(self) -> dict:
        return {"waits_for": "a batch", "batch_seq": self.last_seq + 1, "topic": self.topic(BATCHES)}

    def gauges(self) -> dict:
        return {**self.counters, "version": self.version, "last_batch_seq": self.last_seq,
                "rollouts_generated": self.rollouts_generated}

    def close(self) -> None:
        try:
            if self.dist is None:
                self.complete_checkpoint(wait=True)
            elif self.checkpointing is not None:  # ranks stop at different points: no collective, and the
                self.checkpointing.files.result()  # next learner starts from the checkpoint before
        finally:
            self.checkpoint_writer.shutdown()
        if self.is_main:
            self.announce_written(wait=True)
        if self.source is not None:
            self.source.close()
        if self.groups is not None:
            self.groups.close()
        storage.wait_for_pruning()  # old checkpoints are deleted in the background
        super().close()
        if self.dist is not None:
            import torch.distributed as tdist

            tdist.destroy_process_group()
