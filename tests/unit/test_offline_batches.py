"""Offline training batches from archived groups (`prl replay` builds them without a broker)."""

from dataclasses import replace

from prl.cli import replay
from prl.producers.service import rewards_only
from prl.schemas.config import load_config
from tests.support.groups import make_groups


def test_offline_batches_leave_out_groups_archived_as_rewards_only():
    groups = make_groups(12)
    stripped = {g.dispatch_id for g in groups[::3]}  # producer.drop_zero_signal_completions: nothing to train
    groups = [replace(g, rollouts=rewards_only(g.rollouts)) if g.dispatch_id in stripped else g for g in groups]
    batches = replay.to_batches(groups, load_config(overrides=["scheduler.groups_per_batch=4", "scheduler.max_in_flight=4"]))
    trained = {r.rollout_id.rsplit("/", 1)[0] for b in batches for r in b.rollouts}
    assert trained == {g.dispatch_id for g in groups} - stripped
    for b in batches:
        b.validate()
