"""Every kafka-python internal this project touches, in one place.

kafka-python has no public switch for three things the pipeline needs, so these functions
reach into its private state. pyproject.toml pins the version they were read and tested
against (``TESTED_WITH``); each function checks that what it touches exists and, where it does
not, changes nothing and says so (its caller logs a warning), so a newer kafka-python degrades
to its own behaviour instead of failing.
"""

from __future__ import annotations

TESTED_WITH = "3.0.12"
JOIN_INTERNALS = ("_join_task", "_lock", "_generation", "_enable_heartbeat", "_on_join_complete_async", "join_group_async")


def keep_finished_joins(coordinator) -> bool:
    """Make a group member keep a join that finished while no ``poll()`` was waiting for it.

    kafka-python 3 runs JoinGroup + SyncGroup as a task on its I/O thread but takes the result
    only inside a ``poll()``, and ``join_group_async`` schedules a new task whenever the last one
    is done: a join that finishes between two polls is thrown away and the member joins again
    (upstream main has the same condition). The broker holds each JoinGroup until the group's
    members have joined (tansu: about 2 s), so a member polled in short windows, or one that
    works between polls, can go on rejoining: under CPU load, 9 of 40 two-member joins polled
    alternately from one thread had no assignment after 30 s (CI failed on it once). The wrapper
    completes a finished, successful join the way kafka-python completes one it awaited.
    Returns False, changing nothing, on a kafka-python without these internals."""
    if not all(hasattr(coordinator, name) for name in JOIN_INTERNALS):
        return False
    from kafka.coordinator.base import MemberState

    rejoin = coordinator.join_group_async

    async def join_group_async(timeout_ms=None):
        task = coordinator._join_task
        if task is None or not task.is_done or not task.succeeded():
            return await rejoin(timeout_ms=timeout_ms)
        coordinator._join_task = None
        with coordinator._lock:
            coordinator.rejoining = False
            coordinator.rejoin_needed = False
            coordinator.state = MemberState.STABLE
            coordinator._enable_heartbeat()
        generation = coordinator._generation
        await coordinator._on_join_complete_async(generation.generation_id, generation.member_id, generation.protocol, task.value)
        return True

    coordinator.join_group_async = join_group_async
    return True


def stay_in_group_on_close(consumer) -> bool:
    """Make ``consumer.close()`` send no LeaveGroup (a member that will be back keeps its
    partitions until its session times out): with its generation reset, kafka-python sends
    none. False, changing nothing, where the coordinator has no ``reset_generation``."""
    reset = getattr(getattr(consumer, "_coordinator", None), "reset_generation", None)
    if reset is None:
        return False
    reset()
    return True


def fatal_error(producer) -> str | None:
    """Why an idempotent producer can no longer send, or None while it can. kafka-python's
    idempotent producer never leaves a fatal error state; its transaction manager says when it
    is in one."""
    manager = getattr(producer, "_transaction_manager", None)
    if manager is None or not manager.has_fatal_error():
        return None
    return f"{type(manager.last_error).__name__}: {manager.last_error}"
