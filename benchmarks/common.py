"""What every benchmark shares: the ``--json PATH`` output, a quiet console."""

from __future__ import annotations

import json


def write_json(args, **figures) -> None:
    """Write the run's arguments and figures to ``args.json`` when it was given."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **figures}, f, indent=2, default=str)


def quiet_console() -> None:
    """Warnings and errors only on the console, no download or loading progress bars: the
    benchmark prints its own progress and figures."""
    from transformers.utils import logging as hf_logging

    from prl import logs

    logs.configure("console", "warning")
    hf_logging.disable_progress_bar()
