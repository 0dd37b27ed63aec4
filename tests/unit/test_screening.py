"""Screening (scheduler.screen_size): a look at a problem costs a screen of s completions; a
screen with a signal is completed to a whole group by a second dispatch and the two train as
one group. Driven through the real scheduler on the in-memory transport, with results
written by hand instead of a producer (tests/support/scheduler_desk.py)."""

import re

import pytest

from prl.schemas import decode, topic_name
from prl.schemas.config import ConfigError
from tests.support.scheduler_desk import desk_config, started as started_unscreened

SCREEN = {"scheduler.screen_size": 2}


def screening_config(tmp_path, **extra):
    return desk_config(tmp_path, **{**SCREEN, **extra})


def started(tmp_path, **extra):
    return started_unscreened(tmp_path, **{**SCREEN, **extra})


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
    from prl.scheduler.service import Scheduler

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
    from prl.schemas import DeadLetter
    from prl.schemas.topics import DEADLETTER

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
