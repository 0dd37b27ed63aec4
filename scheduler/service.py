"""The scheduler: choose problems, track what is in flight, accept results, build batches.

Loop, top to bottom:
  1. read the learner's newest PolicyVersion (its version and last trained batch), if the
     learner can have made it; finish when the learner has taken its last step;
  2. accept returned RolloutGroups: dead-letter those for unknown problems or from a version
     the learner has not made, ignore unknown or already-answered dispatch ids, update the
     sampler, keep them as fresh (with dynamic sampling, only those with a signal);
  3. re-dispatch what timed out (a late answer to the old dispatch is still used; a problem
     whose dispatch times out MAX_DISPATCH_ATTEMPTS times is retired, saying why);
  4. publish a batch when enough fresh groups wait and the learner is not too far behind
     (the zero-variance filter and tau_max apply as the batch is composed; with claim_check
     the batch names the rollouts' messages instead of copying them); the state is
     snapshotted before each batch goes out;
  5. top up dispatches to the in-flight bound.

Stopped between steps (SIGTERM), it snapshots once more: a restarted scheduler then knows the
dispatches issued since the last batch and uses their answers instead of sending them again.

Beside training, the scheduler has the fleet evaluate the held-out set at the versions due
(scheduler/evaluation.py); once the learner has taken its last step, the scheduler waits for
that version's evaluation, snapshots, declares the run finished (prl/ending.py: the producers
that wait to answer evaluations stop) and finishes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
import uuid
from collections import deque
from dataclasses import dataclass

import numpy as np

from prl import epochs
from prl.ending import declare_finished
from prl.errors import one_line
from prl.logs import Recurring
from prl.metrics import latency_bucket
from prl.models import model_context
from prl.service import Service, ServiceStopped
from prl.trust import version_problem
from prl.tasks import group_indices, heldout_problems, train_problems
from prl.formulas import annealed_beta, group_outcome, has_signal
from prl.scheduler.batches import compose_batch, replay_advantage_means
from prl.scheduler.evaluation import Evaluator
from prl.scheduler.replay import BETA0, ReplayBuffer
from prl.scheduler.archive import RolloutArchive
from prl.scheduler.archive import root as archive_root
from prl.scheduler.samplers import make_sampler
from prl.scheduler.snapshot import Logs, expect_inside, expect_sized, read_snapshot, write_snapshot
from prl.schemas import Dispatch, EvalResult, PolicyVersion, RolloutGroup, RolloutRef, Sampling, TrainBatch, TrainBatchRefs
from prl.schemas.topics import BATCHES, POLICY, PROBLEMS, ROLLOUTS

MAX_DISPATCH_ATTEMPTS = 4  # a problem whose dispatch timed out this many times in a row is retired, with the reason
TRACKER_TABLE_EVERY = 50  # a table of sampled rollouts goes to the trackers every N batches
BATCH_BYTES_PER_TOKEN = 10  # a TrainBatch's bytes per token (id, log-prob, framing): its token budget
NO_SIGNAL_BATCHES = 10  # batches' worth of groups in a row without a reward signal before the scheduler warns


def dispatch_timeout(base_s: float, attempt: int) -> float:
    """How long attempt ``attempt`` (0: the first) of a dispatch waits for its answer: doubling
    per attempt, so a fleet that is slow, not lost, is not asked for everything again at once."""
    return base_s * 2 ** attempt


def refuse_overlap(heldout: list, index: dict) -> list:
    """The held-out set, unless it shares a problem id with the training set: a held-out
    problem is never trained (ServiceStopped naming the overlap)."""
    shared = [p.id for p in heldout if p.id in index]
    if shared:
        raise ServiceStopped(f"task.heldout_path shares {len(shared)} problem ids with task.train_path (e.g. {shared[0]!r}): "
                             "a held-out problem is never trained; remove them from one of the files")
    return heldout


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


@dataclass
class SignalWatch:
    """Groups in a row whose rewards were all equal. None of them can be trained, so a reward
    that never varies (a reward function that does not read the dataset's answers, problems
    far too hard or too easy for the model) would stall a run without a word: ``observe`` says
    when to warn, at ``first`` groups in a row and at each doubling after."""

    first: int
    in_a_row: int = 0
    solved: int = 0  # of them, groups whose every completion reached the success threshold
    warned_at: int = 0

    def observe(self, signal: bool, solved: bool) -> bool:
        """Count one group; True when this one is due a warning."""
        if signal:
            self.in_a_row = self.solved = self.warned_at = 0
            return False
        self.in_a_row += 1
        self.solved += solved
        if self.in_a_row < max(self.first, 2 * self.warned_at):
            return False
        self.warned_at = self.in_a_row
        return True

    def hint(self) -> str:
        failed = self.in_a_row - self.solved
        if failed >= 0.9 * self.in_a_row:
            return ("every completion scored below task.success_threshold: check that producer.reward scores "
                    "this dataset's answers (the example), or give the model easier problems")
        if self.solved >= 0.9 * self.in_a_row:
            return "every completion was solved: give the model harder problems"
        return "the model solves each problem always or never: give it problems between the two"


class Scheduler(Service):
    name = role = "scheduler"
    reads, writes = (ROLLOUTS, POLICY), (PROBLEMS, BATCHES)
    poll_s = 0.1
    finish_asked = False  # a caller's budget ended (prl run): finish as at learner.max_steps
    lost_seq = -1  # the newest batch sent to an earlier process's broker: none after it is waited for

    def __init__(self, cfg, transport, metrics=None, new_broker: bool = False):
        super().__init__(cfg, transport, metrics)
        self.problems = train_problems(cfg.task)
        self.index = {p.id: i for i, p in enumerate(self.problems)}
        self.trained = np.zeros(len(self.problems), dtype=np.uint8)  # 1: a fresh group of it with a signal was trained
        self.group_names, labels = group_indices(self.problems)
        self.sampler = make_sampler(cfg, labels)
        # A sampler of your own written before observe_many took the groups' signal still works.
        self.observe_signal = "signal" in inspect.signature(self.sampler.observe_many).parameters
        self.zero_variance_filter = bool(getattr(self.sampler, "zero_variance_filter", False))
        self.dynamic_sampling = bool(getattr(self.sampler, "dynamic_sampling", False))
        self.sampling = Sampling(cfg.sampling.temperature, 1.0, cfg.sampling.max_tokens, [])
        self.in_flight: dict[str, InFlight] = {}
        self.superseded: dict[str, str] = {}  # timed-out dispatch id -> the one issued in its place (a late answer is used)
        self.unacked: list[float] = []  # when each dispatch sent since the last flush was issued
        self.coords: dict[str, tuple[str, int, int]] = {}  # dispatch id -> its group's message (claim-check)
        self.retired_reasons: dict[str, str] = {}  # error kind -> its latest message
        self.warn_retired = Recurring(self.log, "problem_retired")  # a dataset the model cannot serve: 3 lines, not 1,000
        self.fresh: list[RolloutGroup] = []
        self.unpublished: TrainBatch | None = None  # composed and snapshotted, not yet sent
        self.unpublished_stored = True  # the newest snapshot holds it (one that failed is written again before it is sent)
        self.replay = ReplayBuffer(seed=cfg.run.seed) if cfg.scheduler.replay.ratio > 0 else None
        self.logs = Logs.at(cfg.run.run_dir)  # what snapshots hold on storage as segments, each record written once
        self.learner_version, self.learner_last_seq, self.next_seq = 0, -1, 0
        self.rollouts_generated = 0
        self.generate_seconds = 0.0  # producers' engine time for the accepted groups
        self.groups_returned = 0
        self.groups_with_signal = 0
        self.no_signal = SignalWatch(NO_SIGNAL_BATCHES * cfg.scheduler.groups_per_batch)
        self.started_at = time.time()
        self.archive = RolloutArchive(archive_root(cfg.run.run_dir))
        self.heldout = refuse_overlap(heldout_problems(cfg.task), self.index)
        self.evaluator = Evaluator(self.heldout, cfg, self.send_evaluation, self.emit_evaluation, self.log)
        self.asked: deque[int] = deque()  # versions a caller wants evaluated (prl run's last), taken in step()
        self.epoch = epochs.claim(cfg.run.run_dir, "scheduler")  # a scheduler before this one is fenced
        self.restore(new_broker)
        if self.evaluator.due(self.learner_version):
            self.evaluator.start(self.learner_version, self.rollouts_generated)  # the policy the run starts from
        self.rollouts = transport.subscriber([self.topic(ROLLOUTS)], group=f"{cfg.run.name}.scheduler")
        self.policy, self.policy_unread = transport.subscriber([self.topic(POLICY)], group=None, from_beginning=True), deque()

    # -- the loop ---------------------------------------------------------------------
    def step(self) -> bool:
        self.read_policy()
        finishing = self.finish_asked or self.learner_version >= self.cfg.learner.max_steps  # before the asked are
        while self.asked:  # taken: an evaluation asked with the finish is started before the finish looks for it
            self.evaluator.start(self.asked.popleft(), self.rollouts_generated)
        if finishing:
            return self.finish()
        self.accept_rollouts()
        self.redispatch_timed_out()
        self.publish_batches()
        self.top_up()
        return False

    def finish(self) -> bool:
        """The learner has taken its last step: once every evaluation asked (the last version's,
        and an earlier one sent again after a refusal) is answered or given up, snapshot (a
        continued run knows it is done) and finish, in the step that settles the last of them (a
        caller waiting for the evaluations may stop the thread right after)."""
        if self.evaluator.running():
            self.accept_rollouts()
            self.evaluator.redispatch_timed_out(self.cfg.scheduler.dispatch_timeout_s)
            self.flush()
            if self.evaluator.running():
                return False
        self.snapshot()
        declare_finished(self.cfg.run.run_dir, self.learner_version)  # the producers waiting for evaluations stop
        self.log.info("learner_finished", learner_version=self.learner_version)
        return True

    def send_evaluation(self, request) -> None:
        self.send(PROBLEMS, request, key=request.request_id.encode())
        self.unacked.append(request.issued_at)  # acknowledged with the turn's dispatches

    def emit_evaluation(self, values: dict, **context) -> None:
        """Evaluation figures under their own namespace: eval/accuracy, eval/accuracy_d1, ..."""
        if self.metrics is not None:
            self.metrics.write("eval", values, **context)

    def ask_evaluation(self, version: int) -> None:
        """Evaluate ``version`` too (thread-safe: a caller's thread may ask)."""
        self.asked.append(version)

    def ask_to_finish(self, evaluate: int | None = None) -> None:
        """Finish at the learner's current version, as at ``learner.max_steps``, once version
        ``evaluate`` is evaluated too (thread-safe: `prl run`, whose budget ended before it). No
        training problem is dispatched after it: what it would generate is never trained."""
        if evaluate is not None:
            self.ask_evaluation(evaluate)
        self.finish_asked = True

    def read_policy(self) -> None:
        """Follow the learner's announcements in order. One whose check fails on the object
        store stays first in line for the retried step: skipped, the scheduler would wait for
        a learner that waits for it."""
        self.policy_unread.extend(self.policy.poll(0.0))
        while self.policy_unread:
            self.follow(self.policy_unread[0])
            self.policy_unread.popleft()
        self.sampler.on_version(self.learner_version)

    def follow(self, msg) -> None:
        """One announcement (older ones, replayed from the topic's start, are passed over); one
        the learner cannot have made is dead-lettered."""
        record = self.decode_or_dead_letter(msg, PolicyVersion)
        if record is None or record.version < self.learner_version:
            return
        if problem := self.implausible(record):
            self.reject(msg, "implausible_policy", problem)
            return
        if problem := epochs.fenced(self.cfg.run.run_dir, "learner", record.epoch):
            self.reject(msg, "fenced_epoch", problem)
            return
        self.learner_version = record.version
        self.learner_last_seq = max(self.learner_last_seq, record.last_batch_seq)
        if self.evaluator.due(record.version):
            self.evaluator.start(record.version, self.rollouts_generated)

    def implausible(self, record: PolicyVersion) -> str | None:
        """Why ``record`` cannot come from this run's learner: it trained a batch not yet
        published, took more steps than it received batches, or names a version directory that is
        not the run's own of that number."""
        if record.last_batch_seq >= self.next_seq:
            return f"last_batch_seq {record.last_batch_seq}, but batches 0..{self.next_seq - 1} were published"
        if record.version - self.learner_version > record.last_batch_seq - self.learner_last_seq:
            return (f"version {record.version} after {self.learner_version}: more steps than the "
                    f"{record.last_batch_seq - self.learner_last_seq} batches trained since")
        if record.uri:
            return version_problem(record.uri, self.cfg.run.run_dir, record.version)
        return None

    def accept_rollouts(self) -> None:
        with self.timed("kafka_io"):
            msgs = self.rollouts.poll(self.poll_s)
        outcomes: list[tuple[int, int, int, bool]] = []  # (problem, solved, attempts, signal), observed together
        for msg in msgs:
            group = self.decode_or_dead_letter(msg, (RolloutGroup, EvalResult))
            if isinstance(group, EvalResult):
                self.accept_evaluation(msg, group)
                continue
            if group is None or not self.acceptable(msg, group):
                continue
            if self.cfg.scheduler.claim_check:  # where the group is, for batches that reference it
                self.coords[group.dispatch_id] = (msg.topic, msg.partition, msg.offset)
            problem = self.accept(group)
            if problem is not None:
                outcomes.append((problem, *group_outcome(group.rewards, self.cfg.task.success_threshold)))
        if outcomes:  # offsets are committed with each snapshot: a restart re-reads what came after it
            problems, solved, attempts, signal = zip(*outcomes)
            with self.timed("statistics"):
                self.sampler.observe_many(problems, solved, attempts, self.learner_version,
                                          **({"signal": signal} if self.observe_signal else {}))

    def acceptable(self, msg, group: RolloutGroup) -> bool:
        """A group for a problem of this run, made by a version the learner can have made
        (producers load only announced versions), with completions if it could be trained,
        for the problem and of the size its dispatch asked for; otherwise dead-lettered."""
        if group.problem_id not in self.index:
            self.reject(msg, "unknown_problem", group.problem_id)
            return False
        flight = self.in_flight.get(self.live_dispatch(group.dispatch_id))
        if not group.has_completions and (not self.zero_variance_filter or has_signal(group.rewards)):
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
        if problem := self.unlike_asked(group):
            self.reject(msg, "not_as_asked", problem)
            return False
        return True

    @functools.cached_property
    def context(self) -> int | None:
        """The model's context, from its config.json alone (None, unread: groups are not checked
        against it here; the learner still is)."""
        return model_context(self.cfg.model.path)

    def unlike_asked(self, group: RolloutGroup) -> str | None:
        """Why ``group`` was not sampled as every dispatch asks (the run's temperature; for one
        turn, at most sampling.max_tokens a completion; a prompt and completion, or an episode,
        within the model's context): trained, it would spoil its whole batch (the learner refuses
        a batch of mixed temperatures or a rollout past the context)."""
        if not group.error and group.temperature != self.sampling.temperature:
            return f"temperature {group.temperature}, the run samples at {self.sampling.temperature}"
        longest = max((len(r.completion_ids) for r in group.rollouts), default=0)
        if not self.cfg.task.environment and longest > self.sampling.max_tokens:
            return f"a completion of {longest} tokens, sampling.max_tokens is {self.sampling.max_tokens}"
        if self.context is not None and group.has_completions and len(group.prompt_ids) + longest > self.context:
            return f"a rollout of {len(group.prompt_ids) + longest} tokens, over the model's context of {self.context}"
        return None

    def accept_evaluation(self, msg, result: EvalResult) -> None:
        """An evaluation's answers go to the evaluator alone, once checked against its request."""
        if problem := self.evaluator.problem(result):
            self.reject(msg, *problem)
        elif not self.evaluator.accept(result):
            self.count("duplicate_or_unknown_evaluations")

    def accept(self, group: RolloutGroup) -> int | None:
        """Take a result in; return its problem index (the sampler observes its rewards), or
        None for a duplicate or unknown one, or an error (the problem is retired)."""
        live = self.live_dispatch(group.dispatch_id)
        flight = self.in_flight.pop(live, None)
        if flight is None:
            self.count("duplicate_or_unknown_results")
            return None
        if live != group.dispatch_id:  # it timed out and was issued again: the late answer is used
            self.count("late_results_used")
        self.archive.add(group, self.learner_version)
        if group.error:
            self.retire(flight.problem, group.error)
            return None
        self.rollouts_generated += len(group.rollouts)
        self.generate_seconds += group.generate_seconds
        signal = has_signal(group.rewards)
        self.groups_returned += 1
        self.groups_with_signal += signal
        if self.no_signal.observe(signal, min(group.rewards) >= self.cfg.task.success_threshold):
            self.warn_no_signal(group, flight.problem)
        if not signal:
            self.count("zero_signal_rollouts", len(group.rollouts))
        if self.dynamic_sampling and not signal:
            self.count("zero_signal_dropped")
        else:
            self.fresh.append(group)
        return flight.problem

    def warn_no_signal(self, group: RolloutGroup, problem: int) -> None:
        """One line on what the groups without a signal were, with the latest as an example."""
        watch, first = self.no_signal, group.rollouts[0]
        self.log.warning("no_signal", groups_in_a_row=watch.in_a_row, all_solved=watch.solved,
                         all_failed=watch.in_a_row - watch.solved, example_problem=group.problem_id,
                         example_answer=self.problems[problem].answer[:80], example_completion=first.text[:80],
                         example_reward=first.reward, hint=watch.hint())

    def live_dispatch(self, dispatch_id: str) -> str:
        """The dispatch in flight for the problem ``dispatch_id`` asked for: itself, or the one
        issued after it timed out (and after that one, ...)."""
        while dispatch_id in self.superseded:
            dispatch_id = self.superseded[dispatch_id]
        return dispatch_id

    def redispatch_timed_out(self) -> None:
        """Issue again each dispatch past its timeout (which doubles per attempt), remembering
        the old id so that its late answer is still used; retire a problem whose dispatch timed
        out MAX_DISPATCH_ATTEMPTS times."""
        self.evaluator.redispatch_timed_out(self.cfg.scheduler.dispatch_timeout_s)
        now = time.time()
        for did, flight in list(self.in_flight.items()):
            if now - flight.issued_at <= dispatch_timeout(self.cfg.scheduler.dispatch_timeout_s, flight.attempt):
                continue
            del self.in_flight[did]
            if flight.attempt + 1 >= MAX_DISPATCH_ATTEMPTS:
                self.retire(flight.problem, f"TimedOut: no answer to {MAX_DISPATCH_ATTEMPTS} dispatches; raise "
                                            "scheduler.dispatch_timeout_s if the producers are slow rather than lost")
                continue
            self.count("redispatched")
            self.superseded[did] = self.dispatch(flight.problem, flight.attempt + 1, flight.group_size)
        self.forget_superseded()

    def forget_superseded(self) -> None:
        """Keep the old ids of dispatches still in flight only (their answers can still be used)."""
        if len(self.superseded) > 4 * self.cfg.scheduler.max_in_flight:
            self.superseded = {old: new for old, new in self.superseded.items() if self.live_dispatch(new) in self.in_flight}

    def retire(self, problem: int, reason: str) -> None:
        """Never dispatch ``problem`` again, for ``reason`` (its kind, a colon, then what to do)."""
        self.count("problems_retired")
        kind = reason.split(":", 1)[0]
        self.retired_reasons[kind] = reason
        self.sampler.retire(problem)
        self.warn_retired(kind, problem_id=self.problems[problem].id, error=reason)

    def publish_batches(self) -> None:
        cfg = self.cfg.scheduler
        if self.unpublished is not None:  # composed, then the step failed before it was sent
            if not self.unpublished_stored:  # its snapshot failed (the object store away): it goes first
                with self.timed("snapshot"):
                    self.snapshot(pending=self.unpublished)
            self.publish_batch(self.unpublished)
        while len(self.fresh) >= cfg.groups_per_batch and self.batches_ahead() < cfg.max_batches_ahead:
            groups, rest = self.fresh[: cfg.groups_per_batch], self.fresh[cfg.groups_per_batch :]
            comp = self.compose(groups)
            self.fresh = comp.leftover + rest
            self.count_composition(comp)
            batch = comp.batch
            if batch is None:
                continue
            self.next_seq += 1
            self.unpublished, self.unpublished_stored = batch, False
            with self.timed("snapshot"):
                self.snapshot(pending=batch)  # on storage before it is on the topic
            self.publish_batch(batch)
            self.emit(self.batch_metrics(batch), seq=batch.seq, learner_version=self.learner_version)
            if batch.seq % TRACKER_TABLE_EVERY == 0:
                self.emit_table("rollouts", *rollout_sample(groups, batch), step=self.rollouts_generated)

    def compose(self, groups: list[RolloutGroup]):
        """The next batch from ``groups``. The learner trains it after the batches already
        ahead of it, one version each: ages are counted at that version, so nothing arrives
        older than tau_max."""
        cfg = self.cfg.scheduler
        with self.timed("compose_and_replay"):
            return compose_batch(
                groups, seq=self.next_seq, learner_version=self.learner_version + self.batches_ahead(),
                rollouts_generated=self.rollouts_generated, tau_max=cfg.tau_max,
                max_tokens=self.cfg.transport.kafka.max_message_bytes // BATCH_BYTES_PER_TOKEN,
                buffer=self.replay, replay_ratio=cfg.replay.ratio, warmup_updates=cfg.replay.warmup_updates,
                replay_beta=annealed_beta(BETA0, self.learner_version, self.cfg.learner.max_steps),
                drop_zero_signal=self.zero_variance_filter,
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
        """Send ``batch`` with this scheduler's epoch; from then on the publisher keeps it until
        the broker acknowledges it."""
        batch = dataclasses.replace(batch, epoch=self.epoch)
        self.send(BATCHES, self.claim_check(batch) if self.cfg.scheduler.claim_check else batch)
        self.unpublished = None
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
                                   r.advantage, r.sample_weight))
        self.prune_coords()
        return TrainBatchRefs(batch.batch_id, batch.seq, batch.learner_version, batch.rollouts_generated, refs,
                              batch.created_at, batch.epoch)

    def prune_coords(self) -> None:
        """Forget where groups are once no fresh group or replayable rollout needs them."""
        live_limit = 2 * ((self.replay.capacity if self.replay else 0) + self.cfg.scheduler.max_in_flight)
        if len(self.coords) <= live_limit:
            return
        live = {g.dispatch_id for g in self.fresh}
        if self.replay is not None:
            live |= {r.rollout_id.rsplit("/", 1)[0] for r in self.replay.state_dict()[1]}
        self.coords = {d: c for d, c in self.coords.items() if d in live}

    def batches_ahead(self) -> int:
        return self.next_seq - (max(self.learner_last_seq, self.lost_seq) + 1)

    def top_up(self) -> None:
        room = self.cfg.scheduler.max_in_flight - len(self.in_flight) - len(self.fresh)
        if room > 0:
            busy = {f.problem for f in self.in_flight.values()}
            with self.timed("statistics"):
                chosen = self.sampler.next(room, busy)
            for idx in chosen:
                self.dispatch(idx, 0, self.cfg.sampling.group_size)
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

    def dispatch(self, idx: int, attempt: int, group_size: int) -> str:
        """Send problem ``idx`` out for ``group_size`` completions (acknowledged at the next
        flush); return the dispatch id."""
        p = self.problems[idx]
        d = Dispatch(
            uuid.uuid4().hex, p.id, p.prompt, p.answer, group_size, self.sampling,
            self.learner_version, attempt, time.time(), p.chat, p.env_args,
        )
        self.in_flight[d.dispatch_id] = InFlight(idx, d.issued_at, attempt, group_size)
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
            "in_flight": {did: [f.problem, f.issued_at, f.attempt, f.group_size] for did, f in self.in_flight.items()},
            "superseded": dict(self.superseded),
            "coords": {did: list(c) for did, c in self.coords.items()},
            "sampler": self.sampler.state_dict(),
            "trained": self.trained.copy(),
            "replay": replay_state,
            "evaluator": self.evaluator.state_dict(),
        }

    def check_state(self, state: dict) -> None:
        """ValueError unless a snapshot's state fits this pool (the sampler checks its own part)."""
        self.sampler.check_state(state["sampler"])
        n = len(self.problems)
        expect_sized({"trained": (state["trained"], n)})
        expect_inside({"in_flight": ([entry[0] for entry in state["in_flight"].values()], 0, n),
                       "evaluator.pending": ([i for p in state["evaluator"]["pending"].values() for i in p[1]], 0,
                                             max(1, len(self.heldout))),
                       "evaluator.rewards": ([int(i) for e in state["evaluator"]["evaluations"].values() for i in e[2]], 0,
                                             max(1, len(self.heldout)))})

    def load_state_dict(self, state: dict, fresh: list[RolloutGroup], replay: list, pending: TrainBatch | None = None) -> None:
        for name in self.SCALARS:
            setattr(self, name, state[name])
        self.in_flight = {did: InFlight(*v) for did, v in state["in_flight"].items()}
        self.superseded = dict(state.get("superseded", {}))
        self.coords = {did: tuple(c) for did, c in state["coords"].items()}
        self.sampler.load_state_dict(state["sampler"])
        self.trained[:] = np.asarray(state["trained"], dtype=np.uint8)
        self.fresh = list(fresh)
        if self.replay is not None and state.get("replay"):
            self.replay.load_state_dict(state["replay"], replay)
        self.evaluator.load_state_dict(state["evaluator"])

    def snapshot(self, pending: TrainBatch | None = None) -> None:
        """Write the state (and the batch about to be published), then commit the rollout
        offsets it covers. A scheduler that a newer one replaced stops instead (ServiceStopped)."""
        self.stop_if_replaced()
        replay = self.replay.state_dict()[1] if self.replay else []
        uri = write_snapshot(self.cfg.run.run_dir, self.next_seq, self.state_dict(), self.fresh, replay, pending, self.logs)
        self.unpublished_stored = pending is self.unpublished
        self.archive.flush()  # what the committed offsets cover is archived, too
        self.deliver(self.rollouts)  # the dead letters they explain are on their topic first
        self.log.info("snapshot_written", uri=uri, seq=self.next_seq, in_flight=len(self.in_flight))

    def stopped(self) -> None:
        """Snapshot what was dispatched and accepted since the last batch's snapshot (a batch a
        failed step did not send stays pending). With the broker away the flush fails first and
        nothing is written (so with the object store away): the next scheduler starts from the
        snapshot before, as after a kill."""
        try:
            self.flush()
            self.snapshot(pending=self.unpublished)
        except Exception as exc:
            if self.outage_of(exc) is None:
                raise
            self.log.warning("no_snapshot_at_stop", error=one_line(exc)[:300],
                             why="the next scheduler starts from the snapshot before and dispatches again")

    def restore(self, new_broker: bool = False) -> None:
        """Continue from the newest snapshot. ``new_broker``: the transport's broker began with
        this process (`prl run`), so nothing the snapshot holds in flight will be answered."""
        snap = read_snapshot(self.cfg.run.run_dir, self.check_state, self.logs)
        if snap is None:
            return
        self.load_state_dict(*snap)
        self.unpublished = snap[3]  # it may or may not have reached the topic: the first step sends it again
        self.log.info("snapshot_restored", seq=self.next_seq, in_flight=len(self.in_flight), fresh=len(self.fresh),
                      pending_seq=self.unpublished.seq if self.unpublished is not None else None)
        if new_broker:
            self.forget_the_old_broker()

    def forget_the_old_broker(self) -> None:
        """The snapshot's broker is gone with the earlier process (`prl run` continued): what it
        held in flight is asked for again now (the problems chosen again, the evaluation requests
        sent again, not after dispatch_timeout_s), and the batches sent to it and not known to be
        trained are given up: not waited for; the learner, told by `prl run`, passes over those it
        lacks (logged as ``batches_passed_over``)."""
        self.in_flight, self.superseded = {}, {}
        self.evaluator.send_again()
        sent = self.next_seq - (self.unpublished is not None)  # the unpublished batch is sent again
        if sent - 1 > self.learner_last_seq:  # not known to be trained: the learner says which it lacks
            self.count("batches_given_up", sent - 1 - self.learner_last_seq)
            self.log.info("batches_given_up", seqs=f"{self.learner_last_seq + 1}..{sent - 1}", why="sent to an earlier broker")
            self.lost_seq = sent - 1

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
            **replay_advantage_means([r for r in batch.rollouts if r.is_replay]),
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

    def progress(self):
        return self.groups_returned, self.next_seq, self.learner_version, len(self.evaluator.pending)

    def waiting_for(self) -> dict:
        """The learner, when max_batches_ahead batches wait for it; else answers to its dispatches."""
        if (ahead := self.batches_ahead()) >= self.cfg.scheduler.max_batches_ahead:
            return {"waits_for": "the learner", "learner_version": self.learner_version, "batches_ahead": ahead}
        return {"waits_for": "rollouts", "in_flight": len(self.in_flight), "fresh_groups": len(self.fresh),
                "evaluations_running": self.evaluator.running(), "topic": self.topic(ROLLOUTS)}

    def gauges(self) -> dict:
        return {**self.counters, "learner_version": self.learner_version, "next_seq": self.next_seq,
                "in_flight": len(self.in_flight), "fresh_groups": len(self.fresh),
                "rollouts_generated": self.rollouts_generated, **self.coverage()}

    def coverage(self) -> dict:
        """How the pool is covered: the sampler's pools and shares, and the distinct problems trained on."""
        return {**self.sampler.metrics(), "problems_trained": int(self.trained.sum())}

    def close(self) -> None:
        self.archive.close()
        self.rollouts.close()
        self.policy.close()
        super().close()
