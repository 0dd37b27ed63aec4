"""Ctrl-C and SIGTERM for the long-running commands (`prl run` and the services): the first
asks for a stop after the step in progress, the second stops at once."""

from __future__ import annotations

import json
import signal
import sys
import threading


class Interrupt:
    """The first Ctrl-C or SIGTERM sets ``event``, which the command's loop checks between
    steps (`prl run` then checkpoints, writes its curves and summary, and the same command
    continues the run); a second stops at once (KeyboardInterrupt)."""

    CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as shells report it

    def __init__(self, json_lines: bool = False):
        self.event, self.signal_name, self.previous = threading.Event(), None, {}
        self.json_lines = json_lines  # --log-format json: every console line is JSON

    def __enter__(self) -> "Interrupt":
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        self.event.set()
        if self.json_lines:
            print(json.dumps({"event": "stopping_after_this_step", "signal": self.signal_name}), file=sys.stderr)
        else:
            print(f"\n{self.signal_name}: stopping after this step (again to stop at once)", file=sys.stderr)

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        return self.CODES.get(self.signal_name, 0)
