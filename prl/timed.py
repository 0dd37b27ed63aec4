"""Calls into code a person wrote (reward functions, environments) on worker threads, each
within a time limit: a call that raises is the caller's to judge, one that hangs is left behind.

``TimedCalls.run`` starts up to ``workers`` calls at once, in waves: each wave waits
``timeout_s`` at most, so no call is waited on longer, and one whose wait on something outside
(a judge model's API, a sandbox, a tool) is most of its time goes ``workers`` times faster than
one call at a time. A wave with a call still running at its limit leaves that thread behind;
the next wave gets fresh ones. While MAX_STUCK calls left behind are still running (a judge
that stopped answering), no call starts: each is reported as past its limit at once, so an
outage costs neither unbounded threads nor ``timeout_s`` a wave.
"""

from __future__ import annotations

import concurrent.futures
from typing import Callable

MAX_STUCK = 64  # calls left running past their limit before no new one starts


def past_limit(timeout_s: float) -> str:
    """What a call ``run`` reports as None went through."""
    return f"ran past {timeout_s:g} s, or did not start while {MAX_STUCK} such calls still ran"


class TimedCalls:
    def __init__(self, workers: int, name: str):
        self.workers, self.name = workers, name
        self.pool = self.new_pool()
        self.stuck: list[concurrent.futures.Future] = []  # calls left behind, still running

    def new_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        return concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name)

    def run(self, calls: list[tuple[Callable, tuple]], timeout_s: float) -> list[concurrent.futures.Future | None]:
        """Each (function, arguments) of ``calls`` run, in order: its finished future (its
        result or exception), or None where it ran past ``timeout_s``."""
        out: list[concurrent.futures.Future | None] = []
        for lo in range(0, len(calls), self.workers):
            self.stuck = [f for f in self.stuck if not f.done()]
            if len(self.stuck) >= MAX_STUCK:
                out += [None] * len(calls[lo:lo + self.workers])
                continue
            wave = [self.pool.submit(fn, *args) for fn, args in calls[lo:lo + self.workers]]
            done, late = concurrent.futures.wait(wave, timeout=timeout_s)
            if late:  # the stuck calls keep their threads; the next wave gets fresh ones
                self.stuck += late
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self.new_pool()
            out += [f if f in done else None for f in wave]
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
