"""The service loop through a transport that fails: every failed step is tried again after a
growing wait, an outage past STALL_S is said once as an error, and the first step that
succeeds says how long it lasted."""

import structlog
from structlog.testing import capture_logs

from prl import service
from prl.schemas.config import load_config
from prl.transport import TransportError
from prl.transport.memory import MemoryTransport


class Flaky(service.Service):
    name = "flaky"

    def __init__(self, failures: int):
        super().__init__(load_config(), MemoryTransport())
        self.failures, self.steps = failures, 0

    def step(self) -> bool:
        self.steps += 1
        if self.steps <= self.failures:
            raise TransportError("poll failed: KafkaConnectionError: 111 ECONNREFUSED")
        return True


def test_an_outage_is_retried_said_once_when_it_stalls_and_its_end_is_logged(monkeypatch):
    monkeypatch.setattr(service, "MIN_BACKOFF_S", 0.001)
    monkeypatch.setattr(service, "MAX_BACKOFF_S", 0.004)
    monkeypatch.setattr(service, "STALL_S", 0.0)  # every failure is past the stall time
    svc = Flaky(failures=6)
    svc.log = structlog.get_logger("flaky")  # unbound: capture_logs sees it
    with capture_logs() as logs:
        svc.run()
    events = [e["event"] for e in logs]
    assert svc.steps == 7 and svc.counters["transport_errors"] == 6
    assert events == ["transport_stalled"] + ["transport_error"] * 5 + ["transport_recovered"]
    assert [e["retry_in_s"] for e in logs[1:6]] == [0.002, 0.004, 0.004, 0.004, 0.004]  # doubling, capped
    assert "bootstrap_servers" in logs[0]["fix"] and "ECONNREFUSED" in logs[0]["error"]
