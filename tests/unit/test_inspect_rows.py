"""`prl inspect tail` shows every record kind a topic carries, as read off the wire, in its
brief console row and as JSON."""

import json

import pytest

from prl.cli.inspect import TailFilter, describe, format_row
from prl.schemas import EvalProblem, EvalRequest, EvalResult, decode, encode
from tests.unit.test_schemas import EXAMPLES

EVALUATIONS = [
    EvalRequest("r1", 10, [EvalProblem("add1:1+1", "1+1=", "2", 1)] * 3, 8, 0, 1.5e9),
    EvalResult("r1", 10, "producer-0", ["add1:1+1", "add1:2+1", "add1:3+1"], [1.0, 0.0, 1.0], ["2", "4", "4"]),
    EvalResult("r2", 10, "producer-0", [], [], [], "version 10 is gone from storage"),
]


@pytest.mark.parametrize("record", EXAMPLES + EVALUATIONS, ids=lambda r: r.KIND)
def test_every_record_kind_off_the_wire_makes_a_row(record):
    """An evaluation's answers (the rollouts topic carries them beside the groups) stopped
    `prl inspect tail rollouts --from-beginning` with a ValueError: their rewards decode as an
    array, and `array in ("", None)` has no truth value; so did --min-reward. A dead letter's
    source offset and a version's weights kind stood where the row's own offset and kind go."""
    wire = decode(encode(record))
    TailFilter(min_reward=0.5, min_version=1).keep(wire)
    row = {"partition": 0, "offset": 7, **describe(wire, brief=True)}
    assert (row["partition"], row["offset"], row["kind"]) == (0, 7, record.KIND)
    if record.KIND == "eval_result":
        assert (row["answered"], row["mean_reward"]) == ((3, 0.6667) if record.rewards else (0, None))
    assert format_row(row).startswith(f"0:7       {record.KIND}")
    assert json.loads(json.dumps({"partition": 0, "offset": 7, **describe(wire)}, default=str))["kind"] == record.KIND


class IdleTopic:
    """A consumer of a one-partition topic where nothing new comes: ``polls`` empty polls,
    then Ctrl-C."""

    def __init__(self, polls: int):
        self.polls = polls

    def partitions_for_topic(self, name):
        return {0}

    def assign(self, tps):
        pass

    def seek_to_beginning(self, *tps):
        pass

    def seek(self, tp, offset):
        pass

    def highwater(self, tp):
        return 0

    def position(self, tp):
        return 0

    def poll(self, timeout_ms, max_records):
        self.polls -= 1
        if self.polls < 0:
            raise KeyboardInterrupt
        return {}

    def close(self):
        pass


def test_following_a_quiet_topic_prints_its_summary_every_few_seconds_not_every_poll(monkeypatch):
    """`--follow --summary` printed the summary after every empty poll: two lines a second of
    'messages: {}' while the topic was quiet."""
    import io

    from prl.cli import inspect
    from prl.schemas.config import load_config

    monkeypatch.setattr(inspect, "_consumer", lambda cfg: IdleTopic(polls=200))
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        inspect.tail(load_config(None, []), "rollouts", flt=TailFilter(), from_beginning=False, follow=True,
                     as_json=False, summary=True, limit=None, out=out)
    assert out.getvalue().count("messages: {}") == 1  # when it stopped: the 200 polls took less than FOLLOW_SUMMARY_S
