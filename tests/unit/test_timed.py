"""Calls into a person's code on worker threads, each within a limit (prl/timed.py)."""

import threading

from prl import timed
from prl.timed import TimedCalls


def test_calls_left_running_past_their_limit_stop_new_ones_until_they_end(monkeypatch):
    """A judge that stops answering: each wave's calls are left running past the limit, and
    once MAX_STUCK of them run no call starts (none waits out the limit, no thread is added)
    until they end; then calls run again."""
    monkeypatch.setattr(timed, "MAX_STUCK", 8)
    answering, started = threading.Event(), []

    def judge(i):
        started.append(i)
        answering.wait(10)
        return i

    calls = TimedCalls(4, "test")
    assert calls.run([(judge, (i,)) for i in range(8)], timeout_s=0.05) == [None] * 8  # two waves, left running
    threads = threading.active_count()
    assert calls.run([(judge, (i,)) for i in range(8, 16)], timeout_s=5.0) == [None] * 8
    assert sorted(started) == list(range(8)) and threading.active_count() == threads
    answering.set()
    for f in calls.stuck:
        f.result(timeout=5)
    assert [f.result() for f in calls.run([(judge, (i,)) for i in range(16, 20)], timeout_s=5.0)] == [16, 17, 18, 19]
    calls.close()
