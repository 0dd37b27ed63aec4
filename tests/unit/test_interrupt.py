"""What Ctrl-C and SIGTERM do to `prl run` and the services (the whole path of `prl run`, with
a real signal, is in tests/integration/test_pipeline.py): the first asks for a stop after the
step, the second stops."""

import json
import signal

import pytest

from prl.cli.interrupt import Interrupt


@pytest.mark.parametrize("json_lines", [False, True])
def test_first_signal_asks_to_stop_and_the_second_stops_at_once(capsys, json_lines):
    interrupt = Interrupt(json_lines=json_lines)
    assert interrupt.exit_code == 0 and not interrupt.event.is_set()
    interrupt.handle(signal.SIGTERM, None)
    assert interrupt.event.is_set() and interrupt.exit_code == 143
    err = capsys.readouterr().err.strip()
    if json_lines:  # --log-format json: every console line is JSON
        assert json.loads(err) == {"event": "stopping_after_this_step", "signal": "SIGTERM"}
    else:
        assert err == "SIGTERM: stopping after this step (again to stop at once)"
    with pytest.raises(KeyboardInterrupt):
        interrupt.handle(signal.SIGINT, None)


def test_handlers_are_restored_after_the_run():
    before = signal.getsignal(signal.SIGINT)
    with Interrupt():
        assert signal.getsignal(signal.SIGINT) != before
    assert signal.getsignal(signal.SIGINT) == before


def test_a_service_stops_after_its_step_at_the_first_ctrl_c_and_at_once_at_the_second(tmp_path, monkeypatch):
    """`prl learner` (any service) by hand: the first Ctrl-C sets the stop its loop checks
    between steps; the second interrupts the step in progress, exit 130 as `prl run`."""
    from prl.cli import main
    from prl.learner.sources import write_batches

    seen = {}

    class Step:  # a service whose step outlasts both signals
        def run(self, stop, **_):
            signal.raise_signal(signal.SIGINT)
            seen["stop_after_first"] = stop.is_set()
            signal.raise_signal(signal.SIGINT)
            seen["went_on_after_second"] = True

    monkeypatch.setattr("prl.cli.services.make_service", lambda *a: Step())
    write_batches(str(tmp_path / "batches.arrow"), [])
    before = signal.getsignal(signal.SIGINT)
    code = main(["learner", "--set", f"run.run_dir={str(tmp_path / 'run')!r}", "--batches-from", str(tmp_path / "batches.arrow")])
    assert code == 130 and seen == {"stop_after_first": True}
    assert signal.getsignal(signal.SIGINT) == before


@pytest.mark.parametrize("stopped_first", [True, False])
def test_a_service_left_in_its_call_at_the_stop_ends_with_the_process_not_as_a_failure(monkeypatch, stopped_first):
    """The GPU example run on a CPU: its producer was in a generation call of hours when
    SIGTERM came; `prl run` stopped without it, and vLLM, shutting down at exit under that call,
    made it raise: a service_failed traceback after the run's summary. A service that fails
    while the run goes on still stops the run with its error."""
    import threading

    from structlog.testing import capture_logs

    import prl.cli.run as run

    monkeypatch.setattr(run, "STOP_WAIT_S", 0.05)
    release = threading.Event()

    class InItsCall:
        name = "producer"

        def run(self, stop):
            release.wait(10)
            raise ValueError("not enough values to unpack (expected 4, got 1)")

    with capture_logs() as logs:
        background = run.Background([InItsCall()])
        if stopped_first:
            background.stop()
        release.set()
        background.threads[0].join(10)
        background.stop()
    events = [(e["event"], e["log_level"]) for e in logs]
    if stopped_first:
        assert events == [("services_left_running", "warning"), ("left_service_ended", "info")]
        assert not background.failures
    else:
        assert events == [("service_failed", "error")] and len(background.failures) == 1
