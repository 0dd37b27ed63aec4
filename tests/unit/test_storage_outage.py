"""An object store that cannot be reached is a passing fault: a write is tried again until it is
back (for at most storage.RETRY_FOR_S), a service's step is tried again, and a reader never takes
an unreachable version for a torn one and resumes from an older one. A refused request, a missing
bucket or a full disk are not passing and fail at once."""

import errno

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
from structlog.testing import capture_logs

from prl import service, storage
from prl.schemas.config import load_config
from prl.transport.memory import MemoryTransport


def endpoint_error() -> Exception:
    """What s3fs raises with the store away: botocore's error from aiohttp's from the OS's."""
    try:
        try:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
        except ConnectionRefusedError:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9000/prl-runs")
    except EndpointConnectionError as exc:
        return exc


@pytest.mark.parametrize("exc, passing", [
    (endpoint_error(), True), (ConnectionResetError(), True), (ReadTimeoutError(endpoint_url="http://s3"), True),
    (TimeoutError(), False), (RuntimeError("wrapped"), False), (PermissionError("AccessDenied"), False),
    (FileNotFoundError("NoSuchBucket"), False), (OSError(errno.ENOSPC, "No space left on device"), False),
], ids=["endpoint", "reset", "read timeout", "bare timeout", "other", "denied", "no bucket", "disk full"])
def test_only_a_connection_that_failed_is_unreachable(exc, passing):
    assert storage.unreachable(exc) is passing
    try:
        raise RuntimeError("the snapshot could not be written") from exc
    except RuntimeError as wrapped:
        assert storage.unreachable(wrapped) is passing  # a cause is looked through


class Failing:
    """A write that fails ``n`` times with ``exc``, then returns "done"."""

    def __init__(self, n: int, exc: Exception):
        self.n, self.exc, self.calls = n, exc, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.n:
            raise self.exc
        return "done"


def test_a_write_is_tried_again_until_the_store_is_back(monkeypatch):
    monkeypatch.setattr(storage, "RETRY_WAITS_S", (0.001, 0.002))
    write = Failing(3, endpoint_error())
    with capture_logs() as logs:
        assert storage.retried(write, "snapshot") == "done"
    assert write.calls == 4
    assert [e["event"] for e in logs] == ["storage_error"] * 3 + ["storage_recovered"]
    assert [e["retry_in_s"] for e in logs[:3]] == [0.001, 0.002, 0.002]
    assert "Could not connect to the endpoint URL" in logs[0]["error"]


def test_a_write_refused_fails_at_once_and_one_unreachable_too_long_fails(monkeypatch):
    monkeypatch.setattr(storage, "RETRY_WAITS_S", (0.001, 0.002))
    write = Failing(3, PermissionError("AccessDenied"))
    with pytest.raises(PermissionError):
        storage.retried(write, "snapshot")
    assert write.calls == 1
    monkeypatch.setattr(storage, "RETRY_FOR_S", 0.0)
    write = Failing(3, endpoint_error())
    with pytest.raises(EndpointConnectionError):
        storage.retried(write, "snapshot")
    assert write.calls == 1


def test_an_unreachable_version_is_not_passed_over_for_an_older_one():
    """A reader that skipped it would resume from an older snapshot or checkpoint (or none),
    losing what the newest holds."""
    def read(uri):
        if uri == "new":
            raise endpoint_error()
        return uri

    with pytest.raises(EndpointConnectionError):
        storage.first_readable(["new", "old"], read, "snapshot")
    assert storage.first_readable(["torn", "old"], lambda u: u if u == "old" else int("x"), "snapshot") == ("old", "old")


class StoreAway(service.Service):
    name = role = "scheduler"

    def __init__(self, failures: int, retries: bool):
        super().__init__(load_config(), MemoryTransport())
        self.failures, self.steps, self.retries_storage = failures, 0, retries

    def step(self) -> bool:
        self.steps += 1
        if self.steps <= self.failures:
            raise RuntimeError("snapshot failed") from endpoint_error()
        return True


def test_a_step_that_found_the_store_away_is_tried_again_where_steps_can_be(monkeypatch):
    """The scheduler and producers: tried again after a growing wait, the outage logged as
    storage_error and its end as storage_recovered. The learner (a step that trained is not
    repeated) stops as before; its writes wait the store out themselves."""
    import structlog

    monkeypatch.setattr(service, "MIN_BACKOFF_S", 0.001)
    monkeypatch.setattr(service, "MAX_BACKOFF_S", 0.002)
    svc = StoreAway(failures=3, retries=True)
    svc.log = structlog.get_logger("scheduler")
    with capture_logs() as logs:
        svc.run()
    assert svc.steps == 4 and svc.counters["storage_errors"] == 3 and svc.counters["storage_recoveries"] == 1
    assert [e["event"] for e in logs] == ["storage_error"] * 3 + ["storage_recovered"]
    with pytest.raises(RuntimeError, match="snapshot failed"):
        StoreAway(failures=3, retries=False).run()


def test_health_says_stalled_while_the_store_is_away_past_the_stall_time(monkeypatch):
    svc = StoreAway(failures=1, retries=True)
    svc.storage_outage.failed(endpoint_error())
    assert svc.health()["status"] == "ok"
    svc.storage_outage.since -= service.STALL_S + 1
    assert svc.health()["status"] == "stalled"
    svc.storage_outage.over()
    assert svc.health()["status"] == "ok"


def test_a_replacement_that_cannot_be_looked_for_is_logged_not_fatal(monkeypatch):
    """The fencing check before a write reads the run's epochs: with the store away it cannot
    tell, and the write after it cannot happen either, so the service goes on to wait for it."""
    svc = StoreAway(failures=0, retries=True)
    svc.epoch = 1
    monkeypatch.setattr(service.epochs, "fenced", lambda *a: (_ for _ in ()).throw(endpoint_error()))
    with capture_logs() as logs:
        svc.stop_if_replaced()
    assert [e["event"] for e in logs] == ["replacement_unchecked"]
    monkeypatch.setattr(service.epochs, "fenced", lambda *a: (_ for _ in ()).throw(PermissionError("AccessDenied")))
    with pytest.raises(PermissionError):
        svc.stop_if_replaced()
