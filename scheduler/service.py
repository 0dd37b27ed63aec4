"""The scheduler: choose problems, track what is in flight, accept results, build batches.

Loop, top to bottom:
  1. read the learner's newest PolicyVersion (its version and last trained batch), if the
     learner can have made it; finish when the learner has taken its last step;
  2. accept returned RolloutGroups: dead-letter those for unknown problems or from a version
     the learner has not made, ignore unknown or already-answered dispatch ids, update the
     sampler, keep them as fresh (with dynamic sampling, only those with a signal); with
     screening, a screen with a signal asks for the rest of its group instead, and the rest,
     when it returns, joins its screen as one group;
  3. re-dispatch what timed out;
  4. publish a batch when enough fresh groups wait and the learner is not too far behind
     (the zero-variance filter and tau_max apply as the batch is composed; with claim_check
     the batch names the rollouts' messages instead of copying them);
  5. top up dispatches to the in-flight bound.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from prl.metrics import latency_bucket
from prl.service import Service, ServiceStopped
from prl.trust import checkpoint_problem
from prl.tasks import train_problems
from prl.tasks.likelihood import expected_success, read_groups
from prl.formulas import has_signal
from prl.scheduler.batches import compose_batch
from prl.scheduler.replay import ReplayBuffer
from prl.scheduler.archive import RolloutArchive
from prl.scheduler.archive import root as archive_root
from prl.scheduler.samplers import make_sampler
from prl.scheduler.snapshot import read_snapshot, write_snapshot
from prl.schemas import Dispatch, PolicyVersion, RolloutGroup, RolloutRef, Sampling, TrainBatch, TrainBatchRefs
from prl.schemas.topics import BATCHES, POLICY, PROBLEMS, ROLLOUTS



def problem_groups(cfg, problems) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(group names, each problem's group index, each group's starting rate or None) for the
    sampler's prior: the task's labels, or those of ``groups_path`` (e.g. answer-likelihood
    bins, whose scores give the starting rates with ``score_start``); with ``shuffle_groups``
    the labels are permuted across problems (a control)."""
    pc = cfg.scheduler.priority
    keys, scores = read_groups(pc.groups_path, [p.id for p in problems]) if pc.groups_path else \
        ([p.group_key for p in problems], None)
    names = sorted(set(keys))
    index = {g: i for i, g in enumerate(names)}
    labels = np.asarray([index[k] for k in keys])
    if pc.shuffle_groups:
        labels = np.random.default_rng(cfg.run.seed).permutation(labels)
    start = expected_success(scores, labels, len(names)) if pc.score_start and scores is not None else None
    return names, labels, start


def rollout_sample(groups: list[RolloutGroup], batch: TrainBatch, n: int = 8) -> tuple[list[str], list[list]]:
    """(columns, rows): a few of the batch's fresh rollouts with their text, for the trackers."""
    texts = {f"{g.dispatch_id}/{i}": r.text for g in groups for i, r in enumerate(g.rollouts)}
    rows = [[r.problem_id, r.policy_version, texts.get(r.rollout_id, "")[:300], r.reward, round(r.advantage, 3)]
            for r in batch.rollouts if not r.is_replay][:n]
    return ["problem", "policy_version", "completion", "reward", "advantage"], rows


class NoProblemsLeft(ServiceStopped):
    """Every training problem is retired (or the set is empty): no batch can ever come."""


@dataclass
class InFlight:
    problem: int
    issued_at: float
    attempt: int
    group_size: int  # completions asked for: a group of another size is not this dispatch's answer
    part: str = "group"  # "group": a whole group; with screening, "screen" or "rest" (of a screen with a signal)


class Scheduler(Service):
    name = "scheduler"
    reads, writes = (ROLLOUTS, POLICY), (PROBLEMS, BATCHES)
    poll_s = 0.1

    def __init__(self, cfg, transport, metrics=None):
        super().__init__(cfg, transport, metrics)
        self.problems = train_problems(cfg.task)
        self.index = {p.id: i for i, p in enumerate(self.problems)}
        self.trained = np.zeros(len(self.problems), dtype=np.uint8)  # 1: a fresh group of it with a signal was trained
        self.group_names, labels, start = problem_groups(cfg, self.problems)
        self.sampler = make_sampler(cfg.scheduler, labels, cfg.run.seed, start, cfg.sampling.group_size)
        s = cfg.sampling
        self.sampling = Sampling(s.temperature, s.top_p, s.max_tokens, [])
        self.in_flight: dict[str, InFlight] = {}
        self.unacked: list[float] = []  # when each dispatch sent since the last flush was issued
        self.coords: dict[str, tuple[str, int, int]] = {}  # dispatch id -> its group's message (claim-check)
        self.retired_reasons: dict[str, str] = {}  # error kind -> its latest message
        self.fresh: list[RolloutGroup] = []
        self.screens: dict[str, RolloutGroup] = {}  # a rest's dispatch id -> its screen, until the rest returns
        r = cfg.scheduler.replay
        self.replay = ReplayBuffer(r.capacity, r.alpha, r.eps, cfg.run.seed) if r.enabled else None
        self.learner_version = 0
        self.learner_last_seq = -1
        self.next_seq = 0
        self.rollouts_generated = 0
        self.generate_seconds = 0.0  # producers' engine time for the accepted groups
        self.groups_returned = 0
        self.groups_with_signal = 0
        self.started_at = time.time()
        self.archive = RolloutArchive(archive_root(cfg.run.run_dir), cfg.scheduler.archive_max_rows) if cfg.scheduler.archive else None
        self.restore()
        self.rollouts = transport.subscriber([self.topic(ROLLOUTS)], group=f"{cfg.run.name}.scheduler")
        self.policy = transport.subscriber([self.topic(POLICY)], group=None, from_beginning=True)

    # -- the loop ---------------------------------------------------------------------
    def step(self) -> bool:
        self.read_policy()
        if self.learner_done():
            return True
        self.accept_rollouts()
        self.redispatch_timed_out()
        self.publish_batches()
        self.top_up()
        return False

    def learner_done(self) -> bool:
        """The learner has reached its last step: nothing more to schedule (a snapshot keeps
        the state for a continued run)."""
        if not (self.cfg.run.finish_with_learner and self.learner_version >= self.cfg.learner.max_steps):
            return False
        if self.cfg.scheduler.snapshot_every:
            self.snapshot()
        self.log.info("learner_finished", learner_version=self.learner_version)
        return True

    def read_policy(self) -> None:
        """Follow the learner's announcements (older ones, replayed from the topic's start,
        are passed over); one the learner cannot have made is dead-lettered."""
        for msg in self.policy.poll(0.0):
            record = self.decode_or_dead_letter(msg, PolicyVersion)
            if record is None or record.version < self.learner_version:
                continue
            if problem := self.implausible(record):
                self.reject(msg, "implausible_policy", problem)
                continue
            self.learner_version = record.version
            self.learner_last_seq = max(self.learner_last_seq, record.last_batch_seq)
        self.sampler.on_version(self.learner_version)

    def implausible(self, record: PolicyVersion) -> str | None:
        """Why ``record`` cannot come from this run's learner: it trained a batch not yet
        published, took more steps than it received batches, or names a checkpoint that is
        not the run's own of that version."""
        if record.last_batch_seq >= self.next_seq:
            return f"last_batch_seq {record.last_batch_seq}, but batches 0..{self.next_seq - 1} were published"
        if record.version - self.learner_version > record.last_batch_seq - self.learner_last_seq:
            return (f"version {record.version} after {self.learner_version}: more steps than the "
                    f"{record.last_batch_seq - self.learner_last_seq} batches trained since")
        if record.checkpoint_uri:
            return checkpoint_problem(record.checkpoint_uri, self.cfg.run.run_dir, record.version)
        return None

    def accept_rollouts(self) -> None:
        with self.timed("kafka_io"):
            msgs = self.rollouts.poll(self.poll_s)
        outcomes: list[tuple[int, int, int]] = []  # (problem, solved, attempts), observed together
        for msg in msgs:
            group = self.decode_or_dead_letter(msg, RolloutGroup)
            if group is None or not self.acceptable(msg, group):
                continue
            if self.cfg.scheduler.claim_check:  # where the group is, for batches that reference it
                self.coords[group.dispatch_id] = (msg.topic, msg.partition, msg.offset)
            accepted = self.accept(group)
            if accepted is not None:
                problem, rewards = accepted
                outcomes.append((problem, sum(r > 0 for r in rewards), len(rewards)))
        if outcomes:
            with self.timed("statistics"):
                self.sampler.observe_many(*zip(*outcomes), self.learner_version)
        if msgs and not self.cfg.scheduler.snapshot_every:
            self.rollouts.commit()  # with snapshots, offsets are committed with each snapshot

    def acceptable(self, msg, group: RolloutGroup) -> bool:
        """A group for a problem of this run, made by a version the learner can have made
        (producers load only announced versions), with completions if it could be trained (a
        rest always can: it trains with its screen, whatever its own rewards),
        for the problem and of the size its dispatch asked for; otherwise dead-lettered."""
        if group.problem_id not in self.index:
            self.reject(msg, "unknown_problem", group.problem_id)
            return False
        flight = self.in_flight.get(group.dispatch_id)
        rest = flight is not None and flight.part == "rest"
        if not group.has_completions and (not self.cfg.filters_zero_variance or has_signal(group.rewards) or rest):
            self.reject(msg, "missing_completions", "a group that can be trained has rollouts without completion tokens")
            return False
        newest = self.learner_version + self.cfg.scheduler.max_batches_ahead
        if group.policy_version > newest:
            self.reject(msg, "future_version", f"policy_version {group.policy_version} > {newest}")
            return False
        if flight is not None and group.problem_id != self.problems[flight.problem].id:
            self.reject(msg, "wrong_problem", f"{group.problem_id} answers a dispatch of {self.problems[flight.problem].id}")
            return False
        if flight is not None and not group.error and len(group.rewards) != flight.group_size:
            self.reject(msg, "wrong_group_size", f"{len(group.rewards)} completions, {flight.group_size} were asked for")
            return False
        return True

    def accept(self, group: RolloutGroup) -> tuple[int, list[float]] | None:
        """Take a result in; return its problem index and the rewards the sampler observes, or
        None for a duplicate or unknown one, or a screen whose rest is asked for (observed
        with it)."""
        flight = self.in_flight.pop(group.dispatch_id, None)
        if flight is None:
            self.count("duplicate_or_unknown_results")
            return None
        if self.archive is not None:
            self.archive.add(group, self.learner_version)
        if group.error:
            self.count("problems_retired")
            self.screens.pop(group.dispatch_id, None)
            self.retired_reasons[group.error.split(":", 1)[0]] = group.error
            self.sampler.retire(flight.problem)
            self.log.warning("problem_retired", problem_id=group.problem_id, error=group.error)
            return None
        self.rollouts_generated += len(group.rollouts)
        self.generate_seconds += group.generate_seconds
        signal = has_signal(group.rewards)
        if flight.part == "screen" and signal:  # worth a whole group: the problem stays in flight for the rest
            self.ask_rest(flight.problem, group)
            return None
        if flight.part == "rest":
            group = self.join(group)
            signal = has_signal(group.rewards)
        self.groups_returned += 1  # a look at the problem: a whole group, or a screen without a signal
        self.groups_with_signal += signal
        if not signal:
            self.count("zero_signal_rollouts", len(group.rollouts))
        if flight.part == "screen":
            self.count("screens_without_signal")
        elif self.cfg.dynamic_sampling and not signal:
            self.count("zero_signal_dropped")
        else:
            self.fresh.append(group)
        return flight.problem, group.rewards

    def ask_rest(self, problem: int, screen: RolloutGroup) -> None:
        """Screening: dispatch the rest of a screen's group; the screen waits for it."""
        rest = self.dispatch(problem, 0, self.cfg.sampling.group_size - len(screen.rollouts), "rest")
        self.screens[rest] = screen
        self.count("screens_with_signal")

    def join(self, rest: RolloutGroup) -> RolloutGroup:
        """The screen and its rest as one group (advantages are taken over the whole group; its
        age is the older part's). A rest that does not match its screen's problem, prompt and
        temperature is trained alone."""
        screen = self.screens.pop(rest.dispatch_id, None)
        if screen is None or (screen.problem_id, screen.temperature) != (rest.problem_id, rest.temperature) \
                or not np.array_equal(screen.prompt_ids, rest.prompt_ids):
            self.count("rests_not_joined")
            return rest
        return RolloutGroup(
            rest.dispatch_id, rest.problem_id, min(screen.policy_version, rest.policy_version), rest.producer_id,
            rest.prompt_ids, rest.temperature, screen.rollouts + rest.rollouts,
            screen.generate_seconds + rest.generate_seconds, screen.reward_seconds + rest.reward_seconds,
            min(screen.created_at, rest.created_at),
        )

    def redispatch_timed_out(self) -> None:
        now = time.time()
        for did, flight in list(self.in_flight.items()):
            if now - flight.issued_at > self.cfg.scheduler.dispatch_timeout_s:
                del self.in_flight[did]
                self.count("redispatched")
                again = self.dispatch(flight.problem, flight.attempt + 1, flight.group_size, flight.part)
                if did in self.screens:  # a rest: its screen waits for the new dispatch
                    self.screens[again] = self.screens.pop(did)

    def publish_batches(self) -> None:
        cfg = self.cfg.scheduler
        while len(self.fresh) >= cfg.groups_per_batch and self.batches_ahead() < cfg.max_batches_ahead:
            groups, rest = self.fresh[: cfg.groups_per_batch], self.fresh[cfg.groups_per_batch :]
            comp = self.compose(groups)
            self.fresh = comp.leftover + rest
            self.count_composition(comp)
            batch = comp.batch
            if batch is None:
                continue
            self.next_seq += 1
            every = self.cfg.scheduler.snapshot_every
            if every and self.next_seq % every == 0:
                with self.timed("snapshot"):
                    self.snapshot(pending=batch)  # on storage before it is on the topic
            self.publish_batch(batch)
            self.emit(self.batch_metrics(batch), seq=batch.seq, learner_version=self.learner_version)
            if batch.seq % self.cfg.run.tracker_table_every == 0:
                self.emit_table("rollouts", *rollout_sample(groups, batch), step=self.rollouts_generated)

    def compose(self, groups: list[RolloutGroup]):
        """The next batch from ``groups``. The learner trains it after the batches already
        ahead of it, one version each: ages are counted at that version, so nothing arrives
        older than tau_max."""
        cfg = self.cfg.scheduler
        with self.timed("compose_and_replay"):
            return compose_batch(
                groups, seq=self.next_seq, learner_version=self.learner_version + self.batches_ahead(),
                rollouts_generated=self.rollouts_generated, tau_max=cfg.tau_max, max_tokens=cfg.max_batch_tokens,
                buffer=self.replay, replay_ratio=cfg.replay.ratio, warmup_updates=cfg.replay.warmup_updates,
                drop_zero_signal=self.cfg.filters_zero_variance, advantage_std=cfg.advantage_std,
            )

    def count_composition(self, comp) -> None:
        """What a composition dropped, and the completion lengths of what it trained and
        dropped as too old (does the age rule favour short answers?)."""
        if comp.zero_signal_dropped:
            self.count("zero_signal_dropped", comp.zero_signal_dropped)
        for band, n in comp.stale_by_band.items():
            if n:
                self.count(f"stale_groups_dropped/{band}", n)
        self.count("stale_completion_tokens", comp.stale_completion_tokens[0])
        self.count("stale_fresh_rollouts", comp.stale_completion_tokens[1])
        if comp.batch is not None:
            fresh = [r for r in comp.batch.rollouts if not r.is_replay]
            # How broadly it trains, not only how much: a group whose rewards are all equal has
            # zero advantages and teaches nothing, filtered or not.
            self.trained[[self.index[r.problem_id] for r in fresh if r.advantage != 0]] = 1
            self.count("trained_fresh_rollouts", len(fresh))
            self.count("trained_completion_tokens", sum(len(r.completion_ids) for r in fresh))

    def publish_batch(self, batch: TrainBatch) -> None:
        self.send(BATCHES, self.claim_check(batch) if self.cfg.scheduler.claim_check else batch)
        self.flush()

    def flush(self) -> None:
        """Wait for the broker to acknowledge what was sent; count each dispatch's time from
        issue to acknowledgement (this service's share of dispatch latency), re-dispatches
        included: their sum, and a histogram for its percentiles (prl/metrics.py)."""
        with self.timed("kafka_io"):
            self.publisher.flush()
        acked = time.time()
        if self.unacked:
            waited_ms = [1e3 * (acked - t) for t in self.unacked]
            self.count("dispatch_to_ack_ms", round(sum(waited_ms)))
            for ms in waited_ms:
                self.count(f"dispatch_to_ack_ms_bucket/{latency_bucket(ms)}")
            self.unacked.clear()

    def claim_check(self, batch: TrainBatch) -> TrainBatchRefs:
        """The batch as references to its rollouts' group messages (the learner fetches them)."""
        refs = []
        for r in batch.rollouts:
            dispatch_id, index = r.rollout_id.rsplit("/", 1)
            topic, partition, offset = self.coords[dispatch_id]
            refs.append(RolloutRef(r.rollout_id, topic, partition, offset, int(index), r.policy_version, r.is_replay,
                                   r.advantage))
        self.prune_coords()
        return TrainBatchRefs(batch.batch_id, batch.seq, batch.learner_version, batch.rollouts_generated, refs,
                              batch.created_at)

    def prune_coords(self) -> None:
        """Forget where groups are once no fresh group or replayable rollout needs them."""
        live_limit = 2 * (self.cfg.scheduler.replay.capacity + self.cfg.scheduler.max_in_flight)
        if len(self.coords) <= live_limit:
            return
        live = {g.dispatch_id for g in self.fresh}
        if self.replay is not None:
            live |= {r.rollout_id.rsplit("/", 1)[0] for r in self.replay.state_dict()[1]}
        self.coords = {d: c for d, c in self.coords.items() if d in live}

    def batches_ahead(self) -> int:
        return self.next_seq - (self.learner_last_seq + 1)

    def top_up(self) -> None:
        room = self.cfg.scheduler.max_in_flight - len(self.in_flight) - len(self.fresh)
        if room > 0:
            busy = {f.problem for f in self.in_flight.values()}
            with self.timed("statistics"):
                chosen = self.sampler.next(room, busy)
            screen = self.cfg.scheduler.screen_size
            size, part = (screen, "screen") if screen else (self.cfg.sampling.group_size, "group")
            for idx in chosen:
                self.dispatch(idx, 0, size, part)
            if not chosen and not self.in_flight:
                raise NoProblemsLeft(self.why_no_problems())
        if self.unacked:  # this turn's dispatches and re-dispatches
            self.flush()

    def why_no_problems(self) -> str:
        retired = self.counters.get("problems_retired", 0)
        if not self.retired_reasons:
            return f"no problem can be dispatched ({len(self.problems)} in the training set, none in flight)"
        reasons = "; ".join(self.retired_reasons.values())
        return (f"no problem can be dispatched: producers could not serve {retired} of {len(self.problems)} training "
                f"problems and they were retired ({reasons[:400]})")

    def dispatch(self, idx: int, attempt: int, group_size: int, part: str = "group") -> str:
        """Send problem ``idx`` out for ``group_size`` completions (acknowledged at the next
        flush); return the dispatch id."""
        p = self.problems[idx]
        d = Dispatch(
            uuid.uuid4().hex, p.id, p.prompt, p.answer, group_size, self.sampling,
            self.learner_version, attempt, time.time(), p.chat,
        )
        self.in_flight[d.dispatch_id] = InFlight(idx, d.issued_at, attempt, group_size, part)
        self.send(PROBLEMS, d, key=p.id.encode())
        self.unacked.append(d.issued_at)
        self.count("dispatched")
        return d.dispatch_id

    # -- state ----------------------------------------------------------------------
    SCALARS = ("learner_version", "learner_last_seq", "next_seq", "rollouts_generated", "generate_seconds",
               "groups_returned", "groups_with_signal", "counters")

    def state_dict(self) -> dict:
        replay_state = self.replay.state_dict()[0] if self.replay else None
        return {
            **{name: getattr(self, name) for name in self.SCALARS},
            "in_flight": {did: [f.problem, f.issued_at, f.attempt, f.group_size, f.part] for did, f in self.in_flight.items()},
            "screens": {rest: screen.dispatch_id for rest, screen in self.screens.items()},  # the groups go with fresh
            "coords": {did: list(c) for did, c in self.coords.items()},
            "sampler": self.sampler.state_dict(),
            "trained": self.trained.copy(),
            "replay": replay_state,
        }

    def load_state_dict(self, state: dict, fresh: list[RolloutGroup], replay: list, pending: TrainBatch | None = None) -> None:
        for name in self.SCALARS:
            setattr(self, name, state.get(name, getattr(self, name)))  # snapshots from before a field existed
        full = self.cfg.sampling.group_size  # snapshots from before dispatches recorded their size
        self.in_flight = {did: InFlight(*v) if len(v) >= 4 else InFlight(*v, full) for did, v in state["in_flight"].items()}
        self.coords = {did: tuple(c) for did, c in state.get("coords", {}).items()}
        self.sampler.load_state_dict(state["sampler"])  # checks the problem count, so "trained" below fits
        if "trained" in state:  # snapshots from before it existed: counted from here on
            self.trained[:] = np.asarray(state["trained"], dtype=np.uint8)
        waiting = state.get("screens", {})  # screens are written among the fresh groups
        groups = {g.dispatch_id: g for g in fresh}
        self.screens = {rest: groups[screen] for rest, screen in waiting.items() if screen in groups}
        screen_ids = set(waiting.values())
        self.fresh = [g for g in fresh if g.dispatch_id not in screen_ids]
        if self.replay is not None and state.get("replay"):
            self.replay.load_state_dict(state["replay"], replay)

    def snapshot(self, pending: TrainBatch | None = None) -> None:
        """Write the state (and the batch about to be published), then commit the rollout
        offsets it covers."""
        replay = self.replay.state_dict()[1] if self.replay else []
        groups = self.fresh + list(self.screens.values())
        uri = write_snapshot(self.cfg.run.run_dir, self.next_seq, self.state_dict(), groups, replay, pending)
        if self.archive is not None:  # what the committed offsets cover is archived, too
            self.archive.flush()
        self.rollouts.commit()
        self.log.info("snapshot_written", uri=uri, seq=self.next_seq, in_flight=len(self.in_flight))

    def restore(self) -> None:
        snap = read_snapshot(self.cfg.run.run_dir)
        if snap is None:
            return
        self.load_state_dict(*snap)
        pending = snap[3]
        if pending is not None:  # it may or may not have reached the topic before the restart
            self.publish_batch(pending)
        self.log.info("snapshot_restored", seq=self.next_seq, in_flight=len(self.in_flight), fresh=len(self.fresh),
                      republished_seq=pending.seq if pending is not None else None)

    def batch_metrics(self, batch) -> dict:
        rates = self.sampler.success_rates()
        tested = rates[~np.isnan(rates)]
        quantiles = np.quantile(tested, [0.1, 0.5, 0.9]).tolist() if len(tested) else [float("nan")] * 3
        return {
            "success_rate_p10": quantiles[0],
            "success_rate_p50": quantiles[1],
            "success_rate_p90": quantiles[2],
            "dispatch_rate": self.counters.get("dispatched", 0) / max(1e-9, time.time() - self.started_at),
            "rollouts_generated": self.rollouts_generated,
            "generate_seconds": self.generate_seconds,
            "groups_returned": self.groups_returned,
            "signal_share": self.groups_with_signal / max(1, self.groups_returned),
            "batch_rollouts": len(batch.rollouts),
            "batch_replayed": sum(r.is_replay for r in batch.rollouts),
            **({f"replay/{k}": v for k, v in self.replay.metrics(self.learner_version).items()} if self.replay else {}),
            "in_flight": len(self.in_flight),
            **{f"seconds/{k}": v for k, v in self.seconds.items()},
            "completion_tokens/trained_mean": self.counters.get("trained_completion_tokens", 0)
            / max(1, self.counters.get("trained_fresh_rollouts", 0)),
            "completion_tokens/stale_dropped_mean": self.counters.get("stale_completion_tokens", 0)
            / max(1, self.counters.get("stale_fresh_rollouts", 0)),
            **self.counters,
            **self.coverage(),
        }

    def gauges(self) -> dict:
        return {**self.counters, "learner_version": self.learner_version, "next_seq": self.next_seq,
                "in_flight": len(self.in_flight), "fresh_groups": len(self.fresh),
                "rollouts_generated": self.rollouts_generated, **self.coverage()}

    def coverage(self) -> dict:
        """How the pool is covered: the sampler's pools and shares, and the distinct problems trained on."""
        return {**self.sampler.metrics(), "problems_trained": int(self.trained.sum())}

    def close(self) -> None:
        if self.archive is not None:
            self.archive.close()
        self.rollouts.close()
        self.policy.close()
        super().close()
