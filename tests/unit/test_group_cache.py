"""The learner's cache of rollout groups for claim-check batches: a replayed rollout's group
comes from the cache, not the broker; what no valid batch can name leaves; the bound holds;
a reference is checked against a cached group exactly as against a fetched one."""

from __future__ import annotations

import pytest

from prl.learner.sources import GroupCache, resolve_batch
from prl.transport import Message
from prl.schemas import (
    DecodeError,
    Rollout,
    RolloutGroup,
    RolloutRef,
    TrainBatchRefs,
    encode,
)

TOPIC = "run.rollouts"


def group_message(offset: int, version: int) -> Message:
    group = RolloutGroup(f"d{offset}", f"add2:{offset}+1", version, "producer-0", [1, 4, 5], 1.0,
                         [Rollout([9, 7], [-0.5, -0.25], 1.0, "stop", "x"), Rollout([3], [-1.5], 0.0, "stop", "y")])
    return Message(TOPIC, 0, offset, None, encode(group), [])


class CountingReader:
    """A reader over fixed messages that records every position asked of it."""

    def __init__(self, messages):
        self.messages = {(m.topic, m.partition, m.offset): m for m in messages}
        self.asked: list[tuple] = []

    def get_many(self, coords, timeout_s=30.0):
        self.asked += list(coords)
        return {c: self.messages[c] for c in coords if c in self.messages}

    def close(self):
        pass


def refs_batch(seq: int, learner_version: int, named: list[tuple[int, int, int, bool]]) -> TrainBatchRefs:
    """A claim-check batch naming (offset, rollout index, policy version, is_replay) of TOPIC."""
    refs = [RolloutRef(f"d{o}/{i}", TOPIC, 0, o, i, v, replay, 0.5 if i == 0 else -0.5) for o, i, v, replay in named]
    return TrainBatchRefs(f"b{seq}", seq, learner_version, 10, refs, 0.0)


def test_a_replayed_rollout_is_not_fetched_again():
    reader = CountingReader([group_message(o, version=1) for o in range(3)])
    cache = GroupCache(reader, max_bytes=1 << 20)
    _, fetched, cached = resolve_batch(refs_batch(0, 1, [(0, 0, 1, False), (0, 1, 1, False), (1, 0, 1, False), (1, 1, 1, False)]), cache)
    assert fetched > 0 and cached == 0 and sorted(reader.asked) == [(TOPIC, 0, 0), (TOPIC, 0, 1)]
    again, fetched, cached = resolve_batch(refs_batch(1, 2, [(2, 0, 1, False), (2, 1, 1, False), (0, 0, 1, True)]), cache)
    assert reader.asked[2:] == [(TOPIC, 0, 2)]  # only the new group came from the reader
    assert cached > 0 and fetched > 0
    replayed = next(r for r in again.rollouts if r.is_replay)
    assert replayed.rollout_id == "d0/0" and list(replayed.completion_ids) == [9, 7] and replayed.policy_version == 1


def test_groups_older_than_any_batch_may_name_leave():
    reader = CountingReader([group_message(0, version=1), group_message(1, version=5)])
    cache = GroupCache(reader, max_bytes=1 << 20)
    cache.get_many([(TOPIC, 0, 0), (TOPIC, 0, 1)])
    cache.get_many([(TOPIC, 0, 1)], oldest_version=2)  # version 1 can no longer be trained
    assert list(cache.groups) == [(TOPIC, 0, 1)]
    cache.get_many([(TOPIC, 0, 0)], oldest_version=2)
    assert reader.asked.count((TOPIC, 0, 0)) == 2


def test_the_cache_stays_within_its_bound_oldest_out():
    messages = [group_message(o, version=1) for o in range(10)]
    size = len(messages[0].value)
    cache = GroupCache(CountingReader(messages), max_bytes=3 * size + size // 2)
    for o in range(10):
        cache.get_many([(TOPIC, 0, o)])
        assert cache.size <= cache.max_bytes
    assert [p[2] for p in cache.groups] == [7, 8, 9]
    nothing = GroupCache(CountingReader(messages), max_bytes=0)
    nothing.get_many([(TOPIC, 0, 0)])
    assert not nothing.groups and nothing.size == 0


def test_a_cached_group_is_checked_against_each_reference():
    """A batch naming a cached position with another version or dispatch id is refused, as
    it would be against a fetched group."""
    cache = GroupCache(CountingReader([group_message(0, version=1)]), max_bytes=1 << 20)
    resolve_batch(refs_batch(0, 1, [(0, 0, 1, False), (0, 1, 1, False)]), cache)
    with pytest.raises(DecodeError) as err:
        resolve_batch(refs_batch(1, 2, [(0, 0, 2, True)]), cache)
    assert err.value.reason == "unresolvable_ref"
    with pytest.raises(DecodeError):
        resolve_batch(refs_batch(1, 2, [(0, 5, 1, True)]), cache)


def test_an_undecodable_position_is_refused_and_not_kept():
    cache = GroupCache(CountingReader([Message(TOPIC, 0, 0, None, b"not a group", [])]), max_bytes=1 << 20)
    with pytest.raises(DecodeError):
        resolve_batch(refs_batch(0, 1, [(0, 0, 1, False)]), cache)
    assert not cache.groups
