"""`prl bench scale`: reading the running scheduler's metrics, and what a ramp's end says."""

from benchmarks.scale import last_metrics, producer_names, ramp_end


def step(producers: int, offered: float, backlog: float) -> dict:
    return {"producers": producers, "offered_groups_per_s": offered, "backlog_growth_per_s": backlog,
            "cores_used": {"producers": 0.7}}


def test_the_schedulers_last_metrics_line_is_read_only_once_it_is_whole(tmp_path):
    path = tmp_path / "metrics-scheduler.jsonl"
    assert last_metrics(tmp_path) == {}
    path.write_text('{"scheduler/dispatched": 8}\n{"scheduler/dispa')  # the scheduler is mid-write
    assert last_metrics(tmp_path) == {"scheduler/dispatched": 8}
    path.write_text('{"scheduler/dispa')
    assert last_metrics(tmp_path) == {}
    path.write_text('{"scheduler/dispatched": 8}\n{"scheduler/dispatched": 16}\n')
    assert last_metrics(tmp_path) == {"scheduler/dispatched": 16}


def test_a_ramp_the_scheduler_fell_behind_in_ends_there():
    steps = [step(8, 100.0, 0.0), step(16, 200.0, 50.0), step(32, 300.0, 90.0)]
    assert ramp_end(steps) == "the scheduler fell behind at 16 producers"


def test_a_ramp_the_scheduler_kept_up_with_is_a_floor_set_by_the_offer():
    steps = [step(8, 100.0, 1.0), step(32, 230.0, -2.0), step(64, 210.0, 3.0)]  # backlog within 10% of the offer
    end = ramp_end(steps)
    assert end.startswith("the scheduler kept up at every step, so this is a floor")
    assert "peaked at 230 groups/s (32 producers" in end


def test_producers_are_dealt_round_robin_to_the_processes_as_the_ramp_grows():
    assert producer_names(0, 5, 2) == [["sim-0", "sim-2", "sim-4"], ["sim-1", "sim-3"]]
    assert producer_names(5, 8, 2) == [["sim-6"], ["sim-5", "sim-7"]]
    assert producer_names(8, 8, 3) == [[], [], []]
    assert producer_names(0, 2, 1) == [["sim-0", "sim-1"]]
