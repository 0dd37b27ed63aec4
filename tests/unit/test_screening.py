"""Screening (scheduler.screen_size): a look at a problem costs a screen of s completions; a
screen with a signal is completed to a whole group by a second dispatch and the two train as
one group. Driven through the real scheduler on the in-memory transport, with results
written by hand instead of a producer; so are the other things such results show: the
problems trained and the advantages a published batch carries."""

import json
import re

import numpy as np
import pytest

from prl.transport.memory import MemoryBroker, MemoryTransport
from schemas import Dispatch, Rollout, RolloutGroup, decode, encode, headers, topic_name
from schemas.config import ConfigError, load_config
from schemas.topics import PROBLEMS, ROLLOUTS


def screening_config(tmp_path, **extra):
    overrides = [
        f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", "scheduler.screen_size=2", "sampling.group_size=8",
        "scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'", "scheduler.replay.enabled=false",
        "scheduler.groups_per_batch=4", "scheduler.max_in_flight=4", "scheduler.archive=false",
        "task.train_per_digit=[20, 20]", "task.heldout_per_digit=10",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(overrides=overrides)


class Desk:
    """The scheduler's counterpart: reads its dispatches and answers them with given rewards."""

    def __init__(self, cfg, transport):
        self.cfg, self.transport = cfg, transport
        self.dispatches = transport.subscriber([topic_name(cfg.run.name, PROBLEMS)], group=None)
        self.publisher = transport.publisher()

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
    from scheduler.service import Scheduler

    cfg = screening_config(tmp_path, **extra)
    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    scheduler = Scheduler(cfg, transport)
    scheduler.step()
    return cfg, transport, scheduler, Desk(cfg, transport)


def waiting_for_a_rest(tmp_path):
    """A scheduler whose first screen showed a signal (rewards 1, 0): (cfg, transport,
    scheduler, desk, the screen's dispatch, the rest's dispatch)."""
    cfg, transport, scheduler, desk = started(tmp_path)
    mixed, *_ = desk.read()
    desk.answer(mixed, [1.0, 0.0])
    scheduler.step()
    [rest] = [d for d in desk.read() if d.problem_id == mixed.problem_id]
    return cfg, transport, scheduler, desk, mixed, rest


def test_a_screen_with_a_signal_is_completed_and_trained_as_one_group(tmp_path):
    cfg, transport, scheduler, desk = started(tmp_path)
    screens = desk.read()
    assert len(screens) == 4 and all(d.group_size == 2 for d in screens)  # every look starts as a screen
    mixed, *flat = screens
    desk.answer(mixed, [1.0, 0.0])
    for d in flat:
        desk.answer(d, [0.0, 0.0])
    scheduler.step()
    rest = [d for d in desk.read() if d.problem_id == mixed.problem_id]
    assert [d.group_size for d in rest] == [6]  # the rest of the group, and only for the screen with a signal
    assert scheduler.fresh == [] and scheduler.counters["screens_without_signal"] == 3
    assert scheduler.groups_returned == 3 and scheduler.counters["zero_signal_rollouts"] == 6  # looks, and their cost
    problem = scheduler.index[mixed.problem_id]
    assert scheduler.sampler.state[problem] == 1  # still in flight: no second look while its rest is out
    desk.answer(rest[0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], version=1)
    scheduler.step()
    [group] = scheduler.fresh
    assert group.dispatch_id == rest[0].dispatch_id and group.rewards == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert group.policy_version == 0  # the older part's version: nothing trains older than tau_max
    assert scheduler.sampler._attempts_np[problem] == 8 and scheduler.sampler._successes_np[problem] == 2
    assert scheduler.rollouts_generated == 4 * 2 + 6  # the screens count as generated


def test_a_screen_waiting_for_its_rest_survives_a_restart(tmp_path):
    from scheduler.service import Scheduler

    cfg, transport, scheduler, desk, mixed, rest = waiting_for_a_rest(tmp_path)
    scheduler.snapshot()
    restarted = Scheduler(cfg, transport)
    assert restarted.fresh == [] and list(restarted.screens) == [rest.dispatch_id]
    assert restarted.in_flight[rest.dispatch_id].part == "rest"
    desk.answer(rest, [1.0] * 6)
    restarted.step()
    [group] = restarted.fresh
    assert group.rewards == [1.0, 0.0] + [1.0] * 6


def test_a_rest_that_times_out_is_asked_again_and_still_joins_its_screen(tmp_path):
    cfg, transport, scheduler, desk, mixed, rest = waiting_for_a_rest(tmp_path)
    scheduler.in_flight[rest.dispatch_id].issued_at -= cfg.scheduler.dispatch_timeout_s + 1
    scheduler.step()
    [again] = [d for d in desk.read() if d.problem_id == mixed.problem_id]
    assert again.group_size == 6 and again.attempt == 1
    desk.answer(again, [0.0] * 6)
    scheduler.step()
    assert [g.rewards for g in scheduler.fresh] == [[1.0, 0.0] + [0.0] * 6]


def test_a_rest_for_another_prompt_than_its_screen_is_not_joined_to_it(tmp_path):
    """Results are untrusted: a rest whose prompt differs from its screen's trains alone."""
    cfg, transport, scheduler, desk, mixed, rest = waiting_for_a_rest(tmp_path)
    desk.answer(rest, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0], prompt=(9, 9))
    scheduler.step()
    assert [len(g.rollouts) for g in scheduler.fresh] == [6] and scheduler.counters["rests_not_joined"] == 1


def test_a_rest_without_completions_is_dead_lettered_even_when_its_own_rewards_are_equal(tmp_path):
    """A rest trains with its screen whatever its own rewards, so it must carry its completions."""
    from schemas import DeadLetter
    from schemas.topics import DEADLETTER

    cfg, transport, scheduler, desk, mixed, rest = waiting_for_a_rest(tmp_path)
    desk.answer(rest, [0.0] * 6, completions=False)
    scheduler.step()
    dead = [decode(m.value, DeadLetter) for m in transport.subscriber([topic_name(cfg.run.name, DEADLETTER)],
                                                                      group=None).poll(0.0)]
    assert [d.reason for d in dead] == ["missing_completions"]
    assert scheduler.fresh == [] and rest.dispatch_id in scheduler.in_flight  # asked again when it times out


@pytest.mark.parametrize("override, says", [
    ({"scheduler.screen_size": 1}, "screen_size must be 0 (off) or 2 to sampling.group_size - 1"),
    ({"scheduler.screen_size": 8}, "screen_size must be 0 (off) or 2 to sampling.group_size - 1"),
    ({"scheduler.strategy": "'uniform'"}, "needs the zero-variance filter"),
    ({"scheduler.claim_check": "true"}, "does not work with scheduler.claim_check"),
    ({"producer.drop_zero_signal_completions": "true"}, "does not work with producer.drop_zero_signal_completions"),
])
def test_screening_settings_that_cannot_work_fail_with_the_reason(tmp_path, override, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        screening_config(tmp_path, **override)


def test_problems_trained_counts_distinct_problems_that_entered_a_batch_and_survives_a_restart(tmp_path):
    """How broadly a run trains, not only how much: a group without a signal is looked at, not
    trained; the count is kept in the snapshot."""
    from scheduler.service import Scheduler

    cfg, transport, scheduler, desk = started(tmp_path, **{"scheduler.screen_size": 0})
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
    cfg, transport, scheduler, desk = started(tmp_path, **{"scheduler.screen_size": 0,
                                                           "scheduler.filter_zero_variance": "false"})
    looks = desk.read()
    for d, rewards in zip(looks, ([1.0, 0.0] * 4, [0.0] * 8, [0.0] * 8, [1.0] * 8)):
        desk.answer(d, rewards)
    scheduler.step()
    assert scheduler.next_seq == 1 and scheduler.counters.get("zero_signal_dropped", 0) == 0  # all four trained
    assert scheduler.gauges()["problems_trained"] == 1
    assert scheduler.trained[scheduler.index[looks[0].problem_id]] == 1


@pytest.mark.parametrize("scaled, success, failure", [("true", 7 ** 0.5, -(7 ** -0.5)), ("false", 0.875, -0.125)])
def test_the_published_batch_carries_the_configured_advantages(tmp_path, scaled, success, failure):
    """scheduler.advantage_std reaches the batches the learner trains: GRPO's std-scaled
    advantages by default, Dr. GRPO's r - mean(r) when false."""
    from schemas import TrainBatch
    from schemas.topics import BATCHES

    cfg, transport, scheduler, desk = started(tmp_path, **{"scheduler.screen_size": 0,
                                                           "scheduler.advantage_std": scaled})
    batches = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group=None)
    for d in desk.read():
        desk.answer(d, [1.0] + [0.0] * 7)
    scheduler.step()
    [message] = batches.poll(0.0)
    advantages = [r.advantage for r in decode(message.value, TrainBatch).rollouts]
    assert advantages == pytest.approx(([success] + [failure] * 7) * 4, rel=1e-4)  # four groups alike
