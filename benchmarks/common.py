"""What every benchmark shares: the ``--json PATH`` output."""

from __future__ import annotations

import json


def write_json(args, **figures) -> None:
    """Write the run's arguments and figures to ``args.json`` when it was given."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **figures}, f, indent=2, default=str)
