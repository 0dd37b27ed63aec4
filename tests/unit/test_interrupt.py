"""What Ctrl-C and SIGTERM do to `prl run` (the whole path, with a real signal, is in
tests/integration/test_pipeline.py): the first asks for a stop after the step, the second stops."""

import json
import signal

import pytest

from prl.cli.run import Interrupt


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
