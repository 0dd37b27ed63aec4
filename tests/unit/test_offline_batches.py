"""Offline training batches from archived groups (`prl replay` builds them without a broker)."""

from dataclasses import replace

from prl.cli import replay
from prl.schemas.config import SchedulerConfig
from tests.support.groups import make_groups


def test_offline_batches_leave_out_groups_archived_as_rewards_only():
    from prl.producers.service import rewards_only

    groups = make_groups(12)
    stripped = {g.dispatch_id for g in groups[::3]}
    groups = [replace(g, rollouts=rewards_only(g.rollouts)) if g.dispatch_id in stripped else g for g in groups]
    batches = replay.to_batches(groups, SchedulerConfig(groups_per_batch=4, max_batch_tokens=1 << 20))
    trained = {r.rollout_id.rsplit("/", 1)[0] for b in batches for r in b.rollouts}
    assert trained == {g.dispatch_id for g in groups} - stripped
    for b in batches:
        b.validate()
