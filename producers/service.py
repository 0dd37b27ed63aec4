"""A producer: turn dispatched problems into scored, versioned rollout groups.

Loop, top to bottom:
  1. load the newest valid policy version the learner announced (at start: read the policy
     topic to its end first), rebuilt from storage and checked against the announcement's
     checksum before it is served; announcements that fail a check are dead-lettered;
  2. poll up to ``max_dispatches_per_call`` dispatches, lingering ``LINGER_S`` to fill the call
     (consumer group: producers share them);
  3. generate G completions for each in one engine call;
  4. score each completion with the reward function (with ``task.environment``: 3 and 4 are G
     episodes of the environment per dispatch instead, one engine call per round of turns,
     prl/episodes.py);
  5. publish one RolloutGroup per dispatch, carrying the loaded policy version (a group
     without a signal as its rewards only, with producer.drop_zero_signal_completions; one too
     big for a message as an error that says so);
  6. wait for the broker's acknowledgement, then commit the dispatch offsets (a step whose
     publish failed is delivered by the next before it takes new dispatches, or at a stop).

EvalRequests come on the same topic: each is answered greedily by the version it names and no
other, the one served or that version rebuilt from storage and swapped in for the call, and the
answers go back as an EvalResult (or one saying why it cannot). A producer finishes once it
serves the learner's last version and no evaluation of it can come any more: at once when
evaluations are off (``learner.eval_every = 0``), else once the scheduler has declared the run
finished (prl/ending.py), which it does when that version's evaluation is answered.
"""

from __future__ import annotations

import json
import os
import socket
import time
import zlib
from functools import partial

from prl import epochs
from prl.devices import choose_device
from prl.ending import finished_version
from prl.environments import Guard, environment_class
from prl.episodes import close_episodes, run_episodes, start_episodes
from prl.formulas import has_signal
from prl.generation import Request, make_backend
from prl.logs import Recurring
from prl.rewards import RewardRunner, load_reward
from prl.models import base_weight_shapes, resolve_model_dir
from prl.plugins import FailingFromTheStart, PluginError
from prl.policy import PolicyReader, VersionRejected, newest_version, version_whole
from prl.service import Service, TooBig
from prl.storage import unreachable
from prl.transport import TransportError
from prl.trust import version_problem
from prl.evaluation import greedy_rewards
from prl.schemas import Dispatch, EvalRequest, EvalResult, PolicyVersion, Rollout, RolloutGroup, Sampling
from prl.schemas.topics import POLICY, PROBLEMS, ROLLOUTS

CATCH_UP_S = 30.0  # at start, read the policy topic to its end (at most this long) before generating
LINGER_S = 0.05  # after the first dispatch arrives, wait this long for more to fill the generation call
END_CHECK_S = 2.0  # at the last version, look this often whether the scheduler has declared the run finished
ANNOUNCED_KEPT = 8  # recent announcements remembered, to rebuild a version an evaluation names


def rewards_only(rollouts: list[Rollout]) -> list[Rollout]:
    """The rollouts without their completions: what the scheduler reads of a group it will not train."""
    return [Rollout([], [], r.reward, r.finish_reason) for r in rollouts]


def default_producer_id() -> str:
    """The host name and process id: a pod's name on Kubernetes, unique on one machine."""
    return f"{socket.gethostname()}-{os.getpid()}"


def sampling_seed(run_seed: int, producer_id: str) -> int:
    """The engine's sampling seed: the run's seed and the producer's name, so no two producers
    of a run, and no two runs of different seeds, draw the same random stream."""
    return zlib.crc32(f"{run_seed}/{producer_id}".encode())


class Producer(Service):
    name = "producer"
    reads, writes = (PROBLEMS, POLICY), (ROLLOUTS,)
    evaluations_only = False  # the run's training ended (prl run, its budget spent): dispatches are dropped

    def __init__(self, cfg, transport, metrics=None, backend=None, producer_id: str | None = None,
                 beside_learner: bool = False):
        """``producer_id``: the name in rollouts and logs (`prl producer --id`; default the host
        name and process id, a pod's name on Kubernetes). ``beside_learner``: the producer shares
        its GPU with the learner (`prl run`), so a vLLM engine takes a smaller share of it."""
        super().__init__(cfg, transport, metrics)
        if cfg.run.threads:
            import torch

            torch.set_num_threads(cfg.run.threads)
        self.producer_id = producer_id or default_producer_id()
        self.backend = backend or make_backend(cfg.producer.backend, cfg.model.path, cfg.model.dtype, cfg.learner.lora_rank,
                                               choose_device(cfg.run.device), cfg.producer.vllm, beside_learner,
                                               seed=sampling_seed(cfg.run.seed, self.producer_id))
        self.log = self.log.bind(producer_id=self.producer_id)
        self.reward = RewardRunner(load_reward(cfg.producer.reward), log=self.log, workers=cfg.producer.reward_workers)
        self.environment = environment_class(cfg.task.environment) if cfg.task.environment else None
        self.guard = Guard(workers=cfg.producer.reward_workers)  # environment calls, each with a time limit
        self.episode_failed = Recurring(self.log, "episode_failed")  # an environment's faults, warned of
        self.episodes_health = FailingFromTheStart()  # an environment that fails every episode alike is broken
        self.versions = PolicyReader(base_weight_shapes(resolve_model_dir(cfg.model.path)))
        self.serving: tuple[str, dict | None] = ("base", None)  # what is loaded: its kind and tensors
        self.announced: dict[int, PolicyVersion] = {}  # recent announcements of the run's own versions
        self.base: dict | None = None  # the base model's weights, once an evaluation needs them back
        self.rebuilt: tuple[int, tuple[str, dict]] | None = None  # the last version rebuilt for an evaluation
        self.end_checked_at = float("-inf")  # when finished.json was last looked for
        self.policy = transport.subscriber([self.topic(POLICY)], group=None, from_beginning=True)
        self.unloaded: list[tuple] = []  # (message, announcement) read, not yet tried (the object store was away)
        self.maybe_reload(wait_s=CATCH_UP_S)  # the newest policy before the first generation
        self.dispatches = transport.subscriber([self.topic(PROBLEMS)], group=f"{cfg.run.name}.producers")

    def step(self) -> bool:
        self.maybe_reload()
        if self.publisher.unacknowledged:  # a step the broker failed: deliver its work before taking more
            self.deliver(self.dispatches)
        if self.finished():
            self.log.info("learner_finished", policy_version=self.backend.version)
            return True  # the last policy is served and its evaluation answered: nothing more to do
        msgs = self.poll_dispatches()
        records = [r for r in (self.decode_or_dead_letter(m, (Dispatch, EvalRequest)) for m in msgs) if r is not None]
        for request in (r for r in records if isinstance(r, EvalRequest)):
            self.send(ROLLOUTS, self.evaluate(request), key=request.request_id.encode())
        dispatches = [r for r in records if isinstance(r, Dispatch)]
        if dispatches and self.evaluations_only:
            self.count("dispatches_dropped_at_end", len(dispatches))
            dispatches = []
        if dispatches:
            groups = self.rollout_groups(dispatches)
            for i, group in enumerate(groups):
                try:
                    self.send(ROLLOUTS, group, key=group.problem_id.encode())
                except TooBig as exc:  # answered with why: the scheduler retires the problem, not dispatch it for ever
                    groups[i] = self.too_big(group, str(exc))
                    self.send(ROLLOUTS, groups[i], key=group.problem_id.encode())
            self.emit(self.call_metrics(groups), policy_version=self.backend.version)
        if msgs:
            self.deliver(self.dispatches)
        return False

    def answer_evaluations_only(self) -> None:
        """The run took its last training step (thread-safe: `prl run`, whose budget ended):
        answer evaluations, drop dispatches, so that the final evaluation does not queue behind
        groups no one will train on, nor the run's end behind generating them."""
        self.evaluations_only = True

    def finished(self) -> bool:
        """The learner's last version is served and no evaluation of it will be asked: none are
        (evaluations off), or the scheduler has declared the run finished (looked for every
        END_CHECK_S)."""
        if self.backend.version < (last := self.cfg.learner.max_steps):
            return False
        if not self.cfg.learner.eval_every:
            return True
        if time.monotonic() - self.end_checked_at < END_CHECK_S:
            return False
        self.end_checked_at = time.monotonic()
        return finished_version(self.cfg.run.run_dir) >= last

    def too_big(self, group: RolloutGroup, size: str) -> RolloutGroup:
        """The error group that answers a dispatch whose group is too big for one message."""
        self.count("groups_too_big")
        self.log.error("group_too_big", problem_id=group.problem_id, size=size)
        return RolloutGroup(group.dispatch_id, group.problem_id, group.policy_version, group.producer_id, [],
                            group.temperature, [], created_at=time.time(),
                            error=f"GroupTooBig: {size}; lower sampling.max_tokens or sampling.group_size, or raise the limit "
                                  "(the broker's too)")

    def evaluate(self, request: EvalRequest) -> EvalResult:
        """Greedy answers with ``request.version`` and no other: the weights served, or that
        version rebuilt from storage (verified) and swapped in for the call, then swapped back."""
        if request.version > self.backend.version and request.version not in self.announced:
            self.maybe_reload()  # the scheduler can see an announcement before this producer does
        version, served = request.version, self.backend.version
        try:
            swap = None if version == served else self.weights_of(version)
            prompts = [] if self.environment else [self.backend.encode(p.prompt, chat=p.chat) for p in request.problems]
        except Exception as exc:  # not rebuildable here, or a prompt the model cannot take
            self.count("evaluations_refused")
            return EvalResult(request.request_id, version, self.producer_id, [], [], [],
                              f"cannot answer with version {version} (serving {served}): {type(exc).__name__}: {exc}"[:400])
        if swap is not None:
            self.load(*swap, version)
        try:
            if self.environment:
                rewards, texts = self.greedy_episodes(request)
            else:
                rewards, texts = greedy_rewards(self.backend, prompts, [p.answer for p in request.problems], self.reward,
                                                request.max_tokens)
        finally:
            if swap is not None:
                self.load(*self.serving, served)
        self.count("evaluations_answered")
        return EvalResult(request.request_id, version, self.producer_id, [p.problem_id for p in request.problems],
                          rewards, texts, created_at=time.time())

    def greedy_episodes(self, request: EvalRequest) -> tuple[list[float], list[str]]:
        """(reward, transcript) of one greedy episode per held-out problem; a problem whose
        environment cannot start scores 0, with the reason as its text."""
        started: dict[int, object] = {}
        texts = [""] * len(request.problems)
        for i, p in enumerate(request.problems):
            try:
                [started[i]] = start_episodes(self.backend, self.guard, partial(self.make_env, p), 1)
            except Exception as exc:
                texts[i] = f"{type(exc).__name__}: {exc}"[:400]
        run_episodes(self.backend, list(started.values()), Sampling(max_tokens=request.max_tokens), self.guard, greedy=True)
        close_episodes(list(started.values()), self.guard)
        for i, e in started.items():
            texts[i] = self.backend.decode(e.tokens)
        return [started[i].reward if i in started else 0.0 for i in range(len(texts))], texts

    def weights_of(self, version: int) -> tuple[str, dict]:
        """(kind, tensors) of a version this producer does not serve: the base model, or an
        announced version rebuilt from storage and checked against its announcement."""
        if version == 0:
            return "base", None
        if self.rebuilt is not None and self.rebuilt[0] == version:  # the set's next request: read once
            return self.rebuilt[1]
        record = self.announced.get(version)
        if record is None:
            raise LookupError(f"no announcement of version {version} seen")
        tensors = PolicyReader(self.versions.expected).read(record.uri, version, record.kind, record.weights_checksum)
        self.rebuilt = (version, (record.kind, tensors))
        return self.rebuilt[1]

    def load(self, kind: str, tensors: dict | None, version: int) -> None:
        """Serve ``tensors`` of ``kind`` as ``version`` (``base``: the model as it was loaded)."""
        if kind == "adapter":
            self.backend.load_adapter(tensors, version)
            return
        if kind == "base":
            self.backend.load_base(self.base_weights)
            return
        self.backend.load_state(tensors, version)

    def base_weights(self) -> dict:
        """The base model's weights as the backend serves them at start (rounded to model.dtype),
        read once, for a backend that keeps no copy of its own."""
        if self.base is None:
            import torch

            from prl.models import export_state, load_model

            dtype = getattr(torch, self.cfg.model.dtype)
            self.base = {k: v.to(dtype) for k, v in export_state(load_model(self.cfg.model.path)).items()}
        return self.base

    def poll_dispatches(self) -> list:
        """Up to max_dispatches_per_call dispatches: wait for the first, then linger briefly
        for more, since one engine call with many prompts costs little more than one with a few."""
        limit = self.cfg.producer.max_dispatches_per_call
        msgs = self.dispatches.poll(self.poll_s, max_records=limit)
        deadline = time.monotonic() + LINGER_S
        while msgs and len(msgs) < limit and (left := deadline - time.monotonic()) > 0:
            msgs += self.dispatches.poll(left, max_records=limit - len(msgs))
        return msgs

    def maybe_reload(self, wait_s: float = 0.0) -> None:
        """Load the newest valid policy the learner announced: read every announcement there
        is (up to ``wait_s`` to reach the end of the topic), then try them newest first; the
        first that passes every check is loaded, so a superseded version is never loaded
        after a newer one. Announcements that fail a check are dead-lettered."""
        deadline = time.monotonic() + wait_s
        while True:
            msgs = self.policy.poll(0.0 if not wait_s else 0.2)
            records = [(m, r) for m, r in ((m, self.decode_or_dead_letter(m, PolicyVersion)) for m in msgs)
                       if r is not None and r.uri]
            self.remember(r for _, r in records)
            self.unloaded += [(m, r) for m, r in records if r.version > self.backend.version]
            if not msgs and (self.policy.caught_up() or time.monotonic() >= deadline):
                break
        announced, self.unloaded = sorted(self.unloaded, key=lambda mr: mr[1].version, reverse=True), []
        for i, (msg, record) in enumerate(announced):
            try:
                loaded = self.try_load(msg, record)
            except Exception:
                self.unloaded = announced[i:]  # the object store away: tried again by the next step
                raise
            if loaded:
                return

    def remember(self, records) -> None:
        """Keep the newest announcements of the run's own versions (an evaluation may name one)."""
        for r in records:
            if version_problem(r.uri, self.cfg.run.run_dir, r.version) is None:
                self.announced[r.version] = r
        for old in sorted(self.announced)[:-ANNOUNCED_KEPT]:
            del self.announced[old]

    def try_load(self, msg, record: PolicyVersion) -> bool:
        """Serve ``record``'s version if it is this run's version of that number and rebuilds
        to the checksum it announces (a delta onto the version held, or from the last full base
        for a producer that joins late); otherwise dead-letter the announcement (or skip it
        quietly if the learner has pruned it after newer ones) and return False."""
        if problem := version_problem(record.uri, self.cfg.run.run_dir, record.version):
            self.reject(msg, "version_outside_run", problem)
            return False
        if problem := epochs.fenced(self.cfg.run.run_dir, "learner", record.epoch):
            self.reject(msg, "fenced_epoch", problem)
            return False
        t0 = time.perf_counter()
        try:
            tensors = self.versions.read(record.uri, record.version, record.kind, record.weights_checksum)
            self.load(record.kind, tensors, record.version)
            self.serving = (record.kind, tensors)
        except Exception as exc:
            if unreachable(exc):  # not the version's fault: the step is tried again, and a newer version is loaded
                raise
            if self.superseded(record):
                self.count("superseded_versions_skipped")  # the learner keeps the last chains only
                self.log.info("version_superseded", policy_version=record.version, uri=record.uri)
                return False
            reason = exc.reason if isinstance(exc, VersionRejected) else "unloadable_version"
            self.reject(msg, reason, f"{type(exc).__name__}: {exc}"[:400])
            return False
        self.count(f"versions_loaded/{record.kind}")
        self.log.info("weights_loaded", policy_version=record.version, kind=record.kind,
                      seconds=round(time.perf_counter() - t0, 3))
        return True

    def superseded(self, record: PolicyVersion) -> bool:
        """A version (partly) gone from storage was pruned by the learner only if newer ones exist."""
        return not version_whole(record.uri) and newest_version(self.cfg.run.run_dir) > record.version

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
        if self.environment is not None:
            return self.episode_groups(dispatches)
        t0 = time.perf_counter()
        prepared = [self.prepare(d) for d in dispatches]
        groups = []
        for d, p in zip(dispatches, prepared):
            if isinstance(p, str):
                groups.append(self.unservable(d, p))
        ok = [(d, p) for d, p in zip(dispatches, prepared) if not isinstance(p, str)]
        if not ok:
            return groups
        results = self.backend.generate([Request(p, d.group_size, d.sampling) for d, p in ok])
        gen_s = (time.perf_counter() - t0) / len(ok)
        t1 = time.perf_counter()
        texts = [[self.backend.decode(c.token_ids) for c in completions] for completions in results]
        answers = [d.answer for (d, _), ts in zip(ok, texts) for _ in ts]
        rewards = iter(self.reward.many([t for ts in texts for t in ts], answers))
        reward_s = (time.perf_counter() - t1) / len(ok)
        for (d, prompt_ids), completions, ts in zip(ok, results, texts):
            rollouts = [Rollout(c.token_ids, c.logprobs, next(rewards), c.finish_reason, t) for c, t in zip(completions, ts)]
            if self.cfg.producer.drop_zero_signal_completions and not has_signal([r.reward for r in rollouts]):
                rollouts = rewards_only(rollouts)
            groups.append(RolloutGroup(d.dispatch_id, d.problem_id, self.backend.version, self.producer_id, prompt_ids,
                                       d.sampling.temperature, rollouts, gen_s, reward_s, time.time()))
        self.count("groups_published", len(groups))
        self.counters["reward_errors"] = self.reward.errors
        self.counters["reward_timeouts"] = self.reward.timeouts
        return groups

    def unservable(self, d: Dispatch, error: str) -> RolloutGroup:
        """The error group that answers a dispatch this producer cannot serve (the scheduler retires the problem)."""
        self.count("problem_errors")
        self.log.error("problem_unservable", problem_id=d.problem_id, error=error)
        return RolloutGroup(d.dispatch_id, d.problem_id, self.backend.version, self.producer_id, [],
                            d.sampling.temperature, [], created_at=time.time(), error=error)

    def make_env(self, problem):
        """A new environment for ``problem`` (a Dispatch or an EvalProblem): ``task.environment``
        with its prompt, answer, the run's reward function and its env_args."""
        cls, extra = self.environment
        args = json.loads(problem.env_args) if problem.env_args else {}
        return cls(problem.prompt, problem.answer, self.reward.fn, problem.chat, **extra, **args)

    def episode_groups(self, dispatches: list[Dispatch]) -> list[RolloutGroup]:
        """One RolloutGroup per dispatch from G episodes of its environment, all dispatches'
        episodes in one engine call per round of turns; a problem whose environment cannot
        start is answered with an error group, an episode's fault counted by its reason."""
        t0 = time.perf_counter()
        started, groups = [], []
        for d in dispatches:
            try:
                episodes = start_episodes(self.backend, self.guard, partial(self.make_env, d), d.group_size)
                self.backend.check(episodes[0].prompt_ids, d.sampling)
                started.append((d, episodes))
            except Exception as exc:  # a bad problem or environment must not stop the producer
                groups.append(self.unservable(d, f"{type(exc).__name__}: {exc}"[:400]))
        if started:
            run_episodes(self.backend, [e for _, es in started for e in es], started[0][0].sampling, self.guard)
        seconds = (time.perf_counter() - t0) / max(1, len(started))
        for d, episodes in started:
            close_episodes(episodes, self.guard)
            for e in episodes:
                self.follow_episode(e)
            rollouts = [e.rollout(self.backend) for e in episodes]
            if self.cfg.producer.drop_zero_signal_completions and not has_signal([r.reward for r in rollouts]):
                rollouts = rewards_only(rollouts)
            groups.append(RolloutGroup(d.dispatch_id, d.problem_id, self.backend.version, self.producer_id,
                                       episodes[0].prompt_ids, d.sampling.temperature, rollouts, seconds, 0.0, time.time()))
        self.count("groups_published", len(groups))
        return groups

    def follow_episode(self, e) -> None:
        """Count and warn of an episode's fault; stop (PluginError) once the environment has
        failed every episode alike from the first on, BROKEN_AFTER of them (time-outs aside)."""
        if e.finish in ("stop", "length"):
            self.episodes_health.succeeded()
            return
        self.count(f"episode_faults/{e.finish}")
        self.episode_failed(e.finish, error=e.fault)
        if e.finish != "env_timeout":
            self.episodes_health.failed(e.fault)
        if self.episodes_health.broken():
            raise PluginError(f"task.environment {self.cfg.task.environment} failed each of its first "
                              f"{self.episodes_health.same} episodes and never ended one: {self.episodes_health.first}")

    def call_metrics(self, groups: list[RolloutGroup]) -> dict:
        """One generation call: its groups, completions and tokens, and the engine's time."""
        served = [g for g in groups if not g.error]
        tokens = sum(len(r.completion_ids) for g in served for r in g.rollouts)
        seconds = sum(g.generate_seconds for g in served)
        return {"groups": len(groups), "completions": sum(len(g.rollouts) for g in served), "completion_tokens": tokens,
                "generate_seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
                "mean_reward": sum(r.reward for g in served for r in g.rollouts) / max(1, sum(len(g.rollouts) for g in served)),
                **self.counters}

    def progress(self):
        return self.counters.get("groups_published", 0), self.counters.get("evaluations_answered", 0), self.backend.version

    def waiting_for(self) -> dict:
        return {"waits_for": "dispatches", "policy_version": self.backend.version, "topic": self.topic(PROBLEMS)}

    def gauges(self) -> dict:
        return {**self.counters, "policy_version": self.backend.version}

    def stopped(self) -> None:
        """Deliver what a failed step left unacknowledged and commit its dispatches: else they
        would be generated again by another producer. With the broker still away they stay
        uncommitted, as after a kill."""
        if not self.publisher.unacknowledged:
            return
        try:
            self.deliver(self.dispatches)
        except TransportError as exc:
            self.log.warning("groups_not_delivered_at_stop", error=str(exc)[:300],
                             why="their dispatches stay uncommitted: another producer generates them again")

    def close(self) -> None:
        self.reward.close()
        self.guard.close()
        self.dispatches.close()
        self.policy.close()
        super().close()
