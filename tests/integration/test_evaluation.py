"""Evaluation by the generation fleet (scheduler/evaluation.py, producers/service.py): the same
figures as an evaluation in one process, never a training input, and faults that end in a
re-sent request or an incomplete report, never a wrong accuracy."""

import json

import pytest
import torch

from prl.models import export_state, load_model
from prl.policy import PolicyWriter
from prl.ending import declare_finished, finished_version
from prl.producers.service import END_CHECK_S, Producer
from prl.scheduler.service import Scheduler
from prl.schemas import EvalProblem, EvalRequest, EvalResult, PolicyVersion, decode, encode, headers, topic_name
from prl.schemas.config import load_config
from prl.schemas.topics import DEADLETTER, POLICY, PROBLEMS, ROLLOUTS
from prl.transport.memory import MemoryBroker, MemoryTransport
from tests.support.addition import small_addition
from tests.support.servers import wait_until


def config(tmp_path, **extra):
    return load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "learner.eval_every=10",
                                  "scheduler.groups_per_batch=4", "scheduler.max_in_flight=8",
                                  *small_addition(tmp_path / "data", (20, 20), heldout=40),
                                  *(f"{k}={v}" for k, v in extra.items())])


class Run:
    def __init__(self, cfg):
        self.cfg = cfg
        self.transport = MemoryTransport(MemoryBroker())
        self.transport.ensure_topics(cfg.run.name)
        self.publisher = self.transport.publisher()
        self.problems = self.transport.subscriber([topic_name(cfg.run.name, PROBLEMS)], group=None)

    def inject(self, kind, record, key=b"x"):
        self.publisher.publish(topic_name(self.cfg.run.name, kind), encode(record), key=key, headers=headers(record))

    def read(self, kind, cls):
        sub = self.transport.subscriber([topic_name(self.cfg.run.name, kind)], group=None, from_beginning=True)
        return [r for r in (decode(m.value) for m in sub.poll(0.0)) if isinstance(r, cls)]

    def version(self, version: int, seed: int = 0) -> dict:
        """Publish and announce a version of perturbed weights, as the learner would; its tensors."""
        model = load_model(self.cfg.model.path)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.02)
        weights = export_state(model)
        out = PolicyWriter(self.cfg.run.run_dir, self.cfg.model.dtype).publish(version, weights)
        self.inject(POLICY, PolicyVersion(version, out.uri, version - 1, 0.0, out.kind, out.checksum), key=b"run")
        return weights


def serve_until(scheduler, producer, settled_version: int) -> None:
    def step():
        scheduler.step()
        producer.step()
        scheduler.step()
        return scheduler.evaluator.settled(settled_version, started=True)

    wait_until(step, 60, f"the evaluation of version {settled_version}")


def test_the_fleet_gives_the_figures_an_evaluation_in_one_process_gives_for_the_same_version(tmp_path):
    """The producer serves version 3 (the newest announced); version 3 is evaluated with the
    weights served, version 0 with the base swapped in for the call and out again. Each one's
    greedy answers and accuracy per difficulty are those of the same weights evaluated in one
    process (the learner-side way); the answers written to the run directory are those answers."""
    from prl.evaluation import encode_heldout, greedy_rewards, heldout_accuracy
    from prl.generation import TransformersBackend
    from prl.rewards import load_reward
    from prl.scheduler.evaluation import answers_uri

    run = Run(config(tmp_path))
    weights = {3: run.version(3), 0: export_state(load_model(run.cfg.model.path))}
    scheduler, producer = Scheduler(run.cfg, run.transport), Producer(run.cfg, run.transport)
    scheduler.ask_evaluation(3)
    serve_until(scheduler, producer, 3)
    serve_until(scheduler, producer, 0)
    assert producer.backend.version == 3  # back to what it serves after version 0's swap
    reward, max_tokens = load_reward(run.cfg.producer.reward), run.cfg.sampling.max_tokens
    for version in (3, 0):
        fleet = scheduler.evaluator.evaluations[version]
        reference = TransformersBackend.from_path(run.cfg.model.path, run.cfg.model.dtype)
        reference.load_state({k: v.to(torch.bfloat16) for k, v in weights[version].items()}, version)
        ids = encode_heldout(reference, scheduler.heldout, max_tokens)
        rewards, texts = greedy_rewards(reference, ids, [p.answer for p in scheduler.heldout], reward, max_tokens)
        assert fleet.outcome == "done" and [fleet.rewards[i] for i in range(len(rewards))] == rewards
        with open(answers_uri(run.cfg.run.run_dir, version)) as f:
            written = [json.loads(line) for line in f]
        assert [(a["problem_id"], a["answer"], a["reward"], a["text"]) for a in written] == \
            [(p.id, p.answer, r, t) for p, r, t in zip(scheduler.heldout, rewards, texts)]
        expected = heldout_accuracy(reference, scheduler.heldout, ids, reward, max_tokens)
        assert {k: v for k, v in fleet.figures.items() if k != "eval_seconds"} == pytest.approx(expected)


def test_evaluation_never_reaches_training(tmp_path):
    """Answers to held-out problems count in no statistics, no replay buffer, no batch, no archive."""
    run = Run(config(tmp_path, **{"scheduler.max_in_flight": 4, "scheduler.groups_per_batch": 4}))
    scheduler, producer = Scheduler(run.cfg, run.transport), Producer(run.cfg, run.transport)
    scheduler.top_up = lambda: None  # no training dispatch: only the evaluation of version 0 goes out
    serve_until(scheduler, producer, 0)
    assert scheduler.evaluator.evaluations[0].outcome == "done"
    assert scheduler.sampler.metrics()["problems_seen"] == 0 and not scheduler.fresh and scheduler.next_seq == 0
    assert scheduler.groups_returned == 0 and scheduler.rollouts_generated == 0
    scheduler.archive.flush()
    assert not list((tmp_path / "run" / "archive").rglob("*.parquet"))


def test_a_heldout_set_that_shares_a_problem_with_training_is_refused(tmp_path):
    from prl.service import ServiceStopped

    cfg = config(tmp_path)
    train = tmp_path / "data" / "train.jsonl"
    (tmp_path / "data" / "test.jsonl").write_text(train.read_text().splitlines()[0] + "\n")
    with pytest.raises(ServiceStopped, match="shares 1 problem ids with task.train_path"):
        Scheduler(cfg, Run(cfg).transport)


@pytest.mark.parametrize("damage, reason", [("version", "wrong_version"), ("problems", "wrong_problems")])
def test_answers_to_another_version_or_other_problems_are_dead_lettered(tmp_path, damage, reason):
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()
    request = next(r for r in run.read(PROBLEMS, EvalRequest))
    ids = [p.problem_id for p in request.problems]
    version, ids = (request.version + 1, ids) if damage == "version" else (request.version, ids[::-1])
    run.inject(ROLLOUTS, EvalResult(request.request_id, version, "p", ids, [1.0] * len(ids), [""] * len(ids)))
    scheduler.step()
    dead = run.read(DEADLETTER, object)
    assert [decode(d.original).KIND for d in dead] == ["eval_result"] and dead[0].reason == reason
    assert request.request_id in scheduler.evaluator.pending  # still waiting for a real answer


def test_an_unanswered_evaluation_is_sent_again_then_reported_incomplete_not_as_an_accuracy(tmp_path):
    """No producer answers (killed, or gone): each request is sent again on its timeout, and
    after three sends the version is reported incomplete; no accuracy is ever emitted for it."""
    from prl.metrics import MetricsSink, read_metrics
    from prl.scheduler.evaluation import MAX_ATTEMPTS

    run = Run(config(tmp_path, **{"scheduler.dispatch_timeout_s": 0.2}))
    metrics = MetricsSink(run.cfg.run.run_dir)
    scheduler = Scheduler(run.cfg, run.transport, metrics)
    wait_until(lambda: scheduler.step() or scheduler.evaluator.settled(0, started=True), 30, "the evaluation given up")
    metrics.close()
    requests = run.read(PROBLEMS, EvalRequest)
    chunks = {tuple(p.problem_id for p in r.problems) for r in requests}
    assert len(requests) == MAX_ATTEMPTS * len(chunks) and sorted({r.attempt for r in requests}) == [0, 1, 2]
    rows = read_metrics(f"{run.cfg.run.run_dir}/metrics.jsonl")
    assert [r["eval/incomplete"] for r in rows if "eval/incomplete" in r] == [1]
    assert not [r for r in rows if "eval/accuracy" in r]


def test_a_finished_evaluation_survives_a_scheduler_restart(tmp_path):
    run = Run(config(tmp_path))
    scheduler, producer = Scheduler(run.cfg, run.transport), Producer(run.cfg, run.transport)
    serve_until(scheduler, producer, 0)
    scheduler.snapshot()
    sent = len(run.read(PROBLEMS, EvalRequest))
    restarted = Scheduler(run.cfg, run.transport)
    restarted.step()
    assert restarted.evaluator.evaluations[0].outcome == "done"
    assert restarted.evaluator.evaluations[0].figures == scheduler.evaluator.evaluations[0].figures
    assert len(run.read(PROBLEMS, EvalRequest)) == sent  # not asked again


def test_a_producer_says_it_cannot_answer_with_a_version_it_cannot_rebuild(tmp_path):
    run = Run(config(tmp_path))
    producer = Producer(run.cfg, run.transport)
    request = EvalRequest("r", 7, [EvalProblem("add1:1+1", "1+1=", "2", 1)], 4)
    result = producer.evaluate(request)
    assert not result.problem_ids and "cannot answer with version 7 (serving 0)" in result.error
    result.validate()


def answer(run, request, error=""):
    """A producer's answer to ``request``: every problem right, or ``error`` (it cannot answer)."""
    ids = [] if error else [p.problem_id for p in request.problems]
    run.inject(ROLLOUTS, EvalResult(request.request_id, request.version, "p", ids, [1.0] * len(ids), [""] * len(ids), error))


def test_a_finishing_scheduler_waits_for_every_evaluation_asked_not_only_the_last(tmp_path):
    """Version 2's evaluation is refused once and sent again, behind the last version's: the
    scheduler finishes (and `prl run` stops it) only once version 2 is answered too, and only
    then declares the run finished (the producers stop answering)."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.top_up = lambda: None  # evaluations only
    scheduler.ask_evaluation(2)
    scheduler.ask_to_finish()  # at the learner's version, 0
    assert scheduler.step() is False
    first = {r.version: r for r in run.read(PROBLEMS, EvalRequest)}
    answer(run, first[0])
    answer(run, first[2], error="cannot answer with version 2 (serving 4): LookupError")
    assert scheduler.step() is False and scheduler.evaluator.settled(0, started=True)
    again = [r for r in run.read(PROBLEMS, EvalRequest) if r.request_id not in {q.request_id for q in first.values()}]
    assert [(r.version, r.attempt) for r in again] == [(2, 1)]
    assert finished_version(run.cfg.run.run_dir) == -1
    answer(run, again[0])
    assert scheduler.step() is True
    assert [e.version for e in scheduler.evaluator.done()] == [0, 2]
    assert finished_version(run.cfg.run.run_dir) == 0


def test_a_scheduler_asked_to_finish_dispatches_nothing_more_and_evaluates_what_it_was_asked(tmp_path):
    """`prl run`'s budget ended: the scheduler sends the last version's evaluation and no more
    training problems (what they would generate is never trained). The caller asks from another
    thread, here right after the scheduler found nothing asked in this step: the evaluation still
    comes before the finish (the finish used to see the flag first and end the run unevaluated)."""
    from collections import deque

    from prl.schemas import Dispatch

    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()

    class AskedJustAfterLooking(deque):
        def __bool__(self):
            if not len(self) and not scheduler.finish_asked:
                scheduler.ask_to_finish(evaluate=2)
                return False
            return bool(len(self))

    scheduler.asked = AskedJustAfterLooking()
    first = {r.request_id for r in run.read(PROBLEMS, EvalRequest)}  # version 0's, at the start
    assert scheduler.step() is False and scheduler.finish_asked  # asked during this step: it dispatches on
    assert scheduler.step() is False  # and now finishes, once the evaluation asked is answered
    asked = [r for r in run.read(PROBLEMS, EvalRequest) if r.request_id not in first]
    dispatched = len(run.read(PROBLEMS, Dispatch))
    for _ in range(3):
        scheduler.in_flight.clear()  # room for more: a scheduler not finishing would dispatch them
        assert scheduler.step() is False
    assert len(run.read(PROBLEMS, Dispatch)) == dispatched
    for request in run.read(PROBLEMS, EvalRequest):
        answer(run, request)
    assert [r.version for r in asked] == [2] and scheduler.step() is True
    assert finished_version(run.cfg.run.run_dir) == 0


def test_a_producer_told_the_training_ended_answers_evaluations_and_drops_dispatches(tmp_path):
    from prl.schemas import Dispatch, RolloutGroup, Sampling

    run = Run(config(tmp_path))
    producer = Producer(run.cfg, run.transport)
    producer.answer_evaluations_only()
    run.inject(PROBLEMS, Dispatch("d", "add1:1+1", "1+1=", "2", 4, Sampling(1.0, 1.0, 4, []), 0))
    run.inject(PROBLEMS, EvalRequest("e", 0, [EvalProblem("add1:1+1", "1+1=", "2", 1)], 4))
    wait_until(lambda: producer.step() is False and run.read(ROLLOUTS, EvalResult), 10, "the evaluation's answer")
    assert [r.request_id for r in run.read(ROLLOUTS, EvalResult)] == ["e"]
    assert run.read(ROLLOUTS, RolloutGroup) == [] and producer.counters["dispatches_dropped_at_end"] == 1


@pytest.mark.parametrize("eval_every", [0, 10])
def test_a_producer_serving_the_last_version_finishes_once_no_evaluation_can_come(tmp_path, eval_every):
    """With evaluations off, nothing more can be asked of a producer that serves the learner's
    last version: it finishes at its next step (a run of processes ends with its scheduler). With
    them on, it serves on until the scheduler declares the run finished."""
    run = Run(config(tmp_path, **{"learner.eval_every": eval_every, "learner.max_steps": 1}))
    run.version(1)
    producer = Producer(run.cfg, run.transport)
    assert producer.backend.version == 1
    if eval_every:
        assert producer.step() is False  # the last version's evaluation may still be asked
        declare_finished(run.cfg.run.run_dir, 1)
        producer.end_checked_at -= END_CHECK_S
    assert producer.step() is True


def test_a_producer_at_the_last_version_answers_an_evaluation_however_late_it_comes(tmp_path):
    """The scheduler asks for the last version's evaluation when it sees the announcement, which
    can be long after the producers did (a scheduler restarted at the end restores first): a
    producer serving that version answers until the scheduler declares the run finished (it used
    to stop 10 s after loading it, the evaluation then never answered), and not at a finish
    declared at an earlier version (a run continued with a higher learner.max_steps)."""
    run = Run(config(tmp_path, **{"learner.max_steps": 1}))
    declare_finished(run.cfg.run.run_dir, 0)
    producer = Producer(run.cfg, run.transport)
    run.version(1)
    for _ in range(3):
        producer.end_checked_at -= 1000.0  # however long it has served this version
        assert producer.step() is False and producer.backend.version == 1
    run.inject(PROBLEMS, EvalRequest("last", 1, [EvalProblem("add1:1+1", "1+1=", "2", 1)], 4))
    assert producer.step() is False
    assert [r.request_id for r in run.read(ROLLOUTS, EvalResult)] == ["last"]
    declare_finished(run.cfg.run.run_dir, 1)
    producer.end_checked_at -= END_CHECK_S
    assert producer.step() is True


def test_a_scheduler_on_a_new_broker_sends_again_at_once_what_its_snapshot_had_in_flight(tmp_path):
    """`prl run` continued in a new process: its in-memory broker is new, so the restored
    dispatches' problems are chosen again and the evaluation requests are sent again now, at the
    same attempt, not after scheduler.dispatch_timeout_s; the two batches it had sent past the
    learner's last are not waited for (the scheduler waited for them for good)."""
    run = Run(config(tmp_path))
    scheduler = Scheduler(run.cfg, run.transport)
    scheduler.step()  # the first dispatches and version 0's evaluation go out
    scheduler.next_seq, scheduler.learner_last_seq = 3, 0  # batches 1 and 2 sent, not trained
    assert scheduler.batches_ahead() == run.cfg.scheduler.max_batches_ahead == 2
    scheduler.snapshot()
    asked = run.read(PROBLEMS, EvalRequest)
    dispatched = set(scheduler.in_flight)
    assert asked and dispatched
    new = Run(run.cfg)
    restarted = Scheduler(run.cfg, new.transport, new_broker=True)
    resent = new.read(PROBLEMS, EvalRequest)
    assert [(r.version, r.attempt, [p.problem_id for p in r.problems]) for r in resent] == \
        [(r.version, r.attempt, [p.problem_id for p in r.problems]) for r in asked]
    assert set(restarted.evaluator.pending) == {r.request_id for r in resent} and not restarted.in_flight
    assert restarted.lost_seq == 2 and restarted.batches_ahead() == 0 and restarted.counters["batches_given_up"] == 2
    restarted.step()
    assert len(restarted.in_flight) == run.cfg.scheduler.max_in_flight and not set(restarted.in_flight) & dispatched
