"""metrics.jsonl as a killed and restarted service leaves it: the line cut short is skipped and
named, every whole line is read, the restarted service's first line included."""

import json

import structlog

from prl.metrics import MetricsSink, read_metrics


def test_a_line_cut_short_by_a_kill_is_skipped_and_named(tmp_path):
    sink = MetricsSink(str(tmp_path))
    sink.write("learner", {"loss": 0.5}, step=1)
    with open(sink.path, "a") as f:  # killed mid-write: no newline, and the restart appends
        f.write('{"time": 2.0, "service": "learner", "ste')
    MetricsSink(str(tmp_path)).write("learner", {"loss": 0.25}, step=3)
    sink.write("scheduler", {"dispatched": 8}, seq=0)
    with structlog.testing.capture_logs() as logs:
        rows = read_metrics(sink.path)
    assert [r.get("learner/loss", r.get("scheduler/dispatched")) for r in rows] == [0.5, 0.25, 8]
    assert [(e["event"], e["lines"]) for e in logs] == [("metrics_lines_skipped", [2])]
    assert json.loads(open(sink.path).read().splitlines()[0])["step"] == 1
