"""What the scheduler's batches carry, from results written by hand (tests/support/scheduler_desk.py):
the distinct problems trained, and the advantages a published batch carries."""

import pytest

from prl.schemas import decode, topic_name
from tests.support.scheduler_desk import started


def test_problems_trained_counts_distinct_problems_that_entered_a_batch_and_survives_a_restart(tmp_path):
    """How broadly a run trains, not only how much: a group without a signal is looked at, not
    trained; the count is kept in the snapshot."""
    from prl.scheduler.service import Scheduler

    cfg, transport, scheduler, desk = started(tmp_path)
    looks = desk.read()
    assert len(looks) == 4 and all(d.group_size == 8 for d in looks)
    for d, rewards in zip(looks, ([1.0, 0.0] * 4, [1.0] + [0.0] * 7, [0.0] * 8, [1.0] * 8)):
        desk.answer(d, rewards)
    scheduler.step()
    assert scheduler.next_seq == 1  # one batch, of the two groups with a signal
    assert scheduler.gauges()["problems_trained"] == 2
    assert scheduler.counters["zero_signal_dropped"] == 2
    scheduler.snapshot()
    restarted = Scheduler(cfg, transport)
    assert restarted.gauges()["problems_trained"] == 2
    assert restarted.trained[[restarted.index[d.problem_id] for d in looks[:2]]].tolist() == [1, 1]


def test_problems_trained_leaves_out_groups_without_a_signal_when_they_are_trained_unfiltered(tmp_path):
    """Uniform GRPO trains zero-variance groups too (zero advantages, no gradient): they do
    not count as problems trained, so the count compares across strategies."""
    cfg, transport, scheduler, desk = started(tmp_path, **{"scheduler.strategy": "'uniform'"})
    looks = desk.read()
    for d, rewards in zip(looks, ([1.0, 0.0] * 4, [0.0] * 8, [0.0] * 8, [1.0] * 8)):
        desk.answer(d, rewards)
    scheduler.step()
    assert scheduler.next_seq == 1 and scheduler.counters.get("zero_signal_dropped", 0) == 0  # all four trained
    assert scheduler.gauges()["problems_trained"] == 1
    assert scheduler.trained[scheduler.index[looks[0].problem_id]] == 1


def test_the_published_batch_carries_grpo_s_advantages(tmp_path):
    """The batches the learner trains carry each group's std-scaled advantages, frozen."""
    from prl.schemas import TrainBatch
    from prl.schemas.topics import BATCHES

    cfg, transport, scheduler, desk = started(tmp_path)
    success, failure = 7 ** 0.5, -(7 ** -0.5)
    batches = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group=None)
    for d in desk.read():
        desk.answer(d, [1.0] + [0.0] * 7)
    scheduler.step()
    [message] = batches.poll(0.0)
    advantages = [r.advantage for r in decode(message.value, TrainBatch).rollouts]
    assert advantages == pytest.approx(([success] + [failure] * 7) * 4, rel=1e-4)  # four groups alike


class OldInterface:
    """A sampler of one's own written before observe_many took the groups' signal."""

    zero_variance_filter = True

    def __init__(self, groups, cfg):
        from prl.scheduler.samplers import UniformSampler

        self.inner, self.seen = UniformSampler(len(groups), cfg.run.seed), []

    def observe_many(self, idx, solved, attempts, version):
        self.seen += list(zip(idx, solved, attempts))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_sampler_of_the_older_interface_still_observes_results(tmp_path):
    cfg, transport, scheduler, desk = started(tmp_path, **{"scheduler.strategy": "'tests.unit.test_scheduler_batches:OldInterface'"})
    looks = desk.read()
    for d, rewards in zip(looks, ([1.0, 0.0] * 4, [0.0] * 8, [0.0] * 8, [1.0] * 8)):
        desk.answer(d, rewards)
    scheduler.step()
    assert sorted(s for _, s, _ in scheduler.sampler.seen) == [0, 0, 4, 8]


def answer_all(scheduler, desk, rewards, groups: int) -> list:
    """Answer ``groups`` dispatches with ``rewards``, in the order sent, stepping the scheduler
    after each; the warnings it logged."""
    import structlog

    with structlog.testing.capture_logs() as logs:
        for _ in range(groups):
            desk.answer_next(rewards)
            scheduler.step()
    return [e for e in logs if e["log_level"] == "warning"]


def test_groups_without_a_signal_in_a_row_are_warned_of_with_an_example_and_a_hint(tmp_path):
    """A reward that never varies trains nothing and raises nothing: after ten batches' worth of
    groups in a row (4 per batch here) the scheduler says so, with an example, at each doubling."""
    cfg, transport, scheduler, desk = started(tmp_path)
    assert answer_all(scheduler, desk, [0.0] * 8, 39) == []
    [warning] = answer_all(scheduler, desk, [0.0] * 8, 1)
    assert warning["event"] == "no_signal" and (warning["groups_in_a_row"], warning["all_failed"]) == (40, 40)
    problem = scheduler.problems[scheduler.index[warning["example_problem"]]]
    assert warning["example_answer"] == problem.answer and "producer.reward" in warning["hint"]
    assert [w["groups_in_a_row"] for w in answer_all(scheduler, desk, [0.0] * 8, 40)] == [80]
    assert answer_all(scheduler, desk, [1.0] + [0.0] * 7, 1) == []  # a signal: the count starts again
    assert answer_all(scheduler, desk, [1.0] * 8, 39) == []
    [warning] = answer_all(scheduler, desk, [1.0] * 8, 1)
    assert warning["all_solved"] == 40 and "harder problems" in warning["hint"]
