"""The service loop through a transport that fails: every failed step is tried again after a
growing wait, an outage past STALL_S is said once as an error, and the first step that
succeeds says how long it lasted; /health answers 503 for such an outage and for a hung step,
never for a long one."""

import time

import pytest
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


@pytest.mark.parametrize("outage_s, running_s, slowest_s, status", [
    (None, None, 0.0, "ok"),
    (119.0, None, 0.0, "ok"), (121.0, None, 0.0, "stalled"),  # steps failing on the transport
    (None, 1000.0, 0.0, "ok"), (None, 1801.0, 0.0, "hung"), (None, 1801.0, 150.0, "hung"),  # HUNG_STEP_S
    (None, 2999.0, 300.0, "ok"), (None, 3001.0, 300.0, "hung"),  # and 10 x the slowest step
])
def test_health_calls_a_long_step_ok_and_a_hung_step_or_a_transport_outage_not(outage_s, running_s, slowest_s, status):
    """Before, a step running past STALL_S (120 s) answered 503: a GPU learner step or a
    producer's engine call of minutes was restarted by its liveness probe, again and again."""
    now = 10_000.0
    since = None if outage_s is None else now - outage_s
    started = None if running_s is None else now - running_s
    assert service.health_status(now, False, since, started, slowest_s) == status
    assert service.health_status(now, True, since, started, slowest_s) == "finished"


def test_health_answers_503_while_the_transport_stalls_and_200_again_once_a_step_succeeds(monkeypatch):
    import json
    import threading

    from tests.support.servers import free_port, wait_until

    class Healing(Flaky):
        def __init__(self):
            super().__init__(failures=0)
            self.healed, self.done = threading.Event(), threading.Event()

        def step(self):
            if not self.healed.is_set():
                raise TransportError("poll failed: KafkaConnectionError: 111 ECONNREFUSED")
            return self.done.wait(0.01)

    monkeypatch.setattr(service, "MIN_BACKOFF_S", 0.001)
    monkeypatch.setattr(service, "MAX_BACKOFF_S", 0.004)
    monkeypatch.setattr(service, "STALL_S", 0.05)
    svc, port = Healing(), free_port()
    runner = threading.Thread(target=svc.run, args=(None, f"127.0.0.1:{port}"))
    runner.start()
    try:
        def answer():
            try:
                code, body = get(f"http://127.0.0.1:{port}/health")
            except OSError:  # not listening yet
                return None
            return code, json.loads(body)["status"]
        wait_until(lambda: answer() == (503, "stalled"), 10, "/health to say the transport stalled")
        svc.healed.set()
        wait_until(lambda: answer() == (200, "ok"), 10, "/health to say ok once a step succeeded")
    finally:
        svc.healed.set()
        svc.done.set()
        runner.join(10)
    assert not runner.is_alive()


def test_a_hung_step_is_logged_once_with_every_threads_stack(monkeypatch, capfd):
    """Before the liveness probe restarts a hung service, its log says where it hangs."""
    import threading

    from tests.support.servers import wait_until

    class Hanging(Flaky):
        def __init__(self):
            super().__init__(failures=0)
            self.release = threading.Event()

        def step(self):
            return self.wait_for_a_lock_that_never_comes()

        def wait_for_a_lock_that_never_comes(self):
            return self.release.wait(30)

    monkeypatch.setattr(service, "HUNG_STEP_S", 0.05)
    svc = Hanging()
    svc.log = structlog.get_logger("hanging")
    runner = threading.Thread(target=svc.run)
    runner.start()
    try:
        with capture_logs() as logs:
            wait_until(lambda: svc.health()["status"] == "hung", 10, "the step to be called hung")
            svc.health()  # asked again by the next probe: said once
    finally:
        svc.release.set()
        runner.join(10)
    assert [e["event"] for e in logs] == ["step_hung"]
    assert "in wait_for_a_lock_that_never_comes" in capfd.readouterr().err


def test_steps_that_move_nothing_say_what_they_wait_for_at_doubling_intervals():
    """A pipeline stopped everywhere at once used to log nothing: every service's steps
    succeeded, with no work. Now each says so after IDLE_S, again at 2x, 4x..., and says when
    work came again; progress restarts the clock."""

    class Waiting(Flaky):
        done = 0

        def progress(self):
            return self.done

        def waiting_for(self):
            return {"waits_for": "a batch", "batch_seq": self.done}

    svc = Waiting(failures=0)
    svc.log = structlog.get_logger("waiting")
    idle = service.Idle(svc)

    def step_at(*times: float) -> list[tuple]:
        with capture_logs() as logs:
            for now in times:
                idle.stepped(now)
        return [(e["event"], e["seconds"], e.get("waits_for"), e.get("batch_seq")) for e in logs]

    assert step_at(0.0, 30.0, 59.0) == []
    assert step_at(60.0, 61.0, 100.0, 120.0, 200.0, 240.0) == [("idle", 60, "a batch", 0), ("idle", 120, "a batch", 0),
                                                                 ("idle", 240, "a batch", 0)]
    svc.done = 1
    assert step_at(250.0) == [("idle_over", 250.0, None, None)]
    assert step_at(260.0, 309.0) == []
    assert step_at(310.0) == [("idle", 60, "a batch", 1)]
    svc.done = 2
    assert step_at(320.0) == [("idle_over", 70.0, None, None)]
    svc.done = 3
    assert step_at(330.0, 389.0) == []  # progress before IDLE_S: nothing to say


def test_the_loop_follows_each_steps_progress(monkeypatch):
    class Idler(Flaky):
        def progress(self):
            return "nothing done"

        def waiting_for(self):
            return {"waits_for": "work"}

        def step(self):
            self.steps += 1
            return self.steps == 3

    monkeypatch.setattr(service, "IDLE_S", 0.0)  # every step after the first is past it
    svc = Idler(failures=0)
    svc.log = structlog.get_logger("idler")
    with capture_logs() as logs:
        svc.run()
    assert [(e["event"], e["waits_for"]) for e in logs] == [("idle", "work")] * 2
    assert svc.health()["seconds_idle"] >= svc.health()["seconds_since_step"]


@pytest.mark.parametrize("role", ["scheduler", "learner"])
def test_a_replaced_scheduler_or_learner_that_waits_stops_though_it_writes_nothing(monkeypatch, tmp_path, role):
    """A second `prl run` on the same directory claimed both roles while the first's scheduler
    waited for its learner and its learner for a batch the scheduler would not send: each only
    looked at a write, neither wrote, and the first run hung for good. Idle, each looks every
    REPLACED_CHECK_S (a step that gets work done looks at its writes, as before)."""
    from prl import epochs

    class Waiting(Flaky):
        def progress(self):
            return "nothing done"

        def step(self):
            self.steps += 1
            if self.steps == 3:  # the second run starts
                epochs.claim(self.cfg.run.run_dir, role)
            return self.steps > 1000

    monkeypatch.setattr(service, "REPLACED_CHECK_S", 0.0)
    svc = Waiting(failures=0)
    svc.cfg = load_config(overrides=[f"run.run_dir='{tmp_path}'"])
    svc.role, svc.epoch = role, epochs.claim(str(tmp_path), role)
    with pytest.raises(service.ServiceStopped, match=f"another {role} took over this run"):
        svc.run()
    assert svc.steps == 3


def get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_finished_service_told_to_wait_closes_its_connections_and_answers_health_until_stopped():
    """A pod's controller restarts a container that exits, even with 0: `--when-finished wait`
    keeps the finished service up, its connections closed, /health 200 "finished" (no
    liveness restart however long it waits) and /metrics prl_<service>_finished 1, until stopped."""
    import json
    import threading

    from tests.support.servers import free_port, wait_until

    svc, stop, port = Flaky(failures=0), threading.Event(), free_port()
    closed = threading.Event()
    svc.close = closed.set
    runner = threading.Thread(target=svc.run, args=(stop, f"127.0.0.1:{port}", "wait"))
    runner.start()
    try:
        wait_until(lambda: svc.ended, 10, "the service to wait after finishing")
        svc.last_step_at -= 10 * service.STALL_S  # waiting this long is not a stall
        code, body = get(f"http://127.0.0.1:{port}/health")
        assert code == 200 and json.loads(body)["status"] == "finished"
        assert "prl_flaky_finished 1" in get(f"http://127.0.0.1:{port}/metrics")[1]
        assert closed.is_set() and runner.is_alive() and svc.steps == 1
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()


def test_a_finished_service_returns_by_default():
    svc = Flaky(failures=0)
    svc.run()
    assert svc.steps == 1 and not svc.ended


def test_a_taken_http_port_stops_the_service_with_one_line_before_any_step():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port, svc = taken.getsockname()[1], Flaky(failures=0)
        with pytest.raises(service.ServiceStopped) as stopped:
            svc.run(http=f"127.0.0.1:{port}")
    assert svc.steps == 0
    assert str(stopped.value) == f"--http 127.0.0.1:{port}: Address already in use; give a free port on an address of this host"
