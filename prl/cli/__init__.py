"""The `prl` commands: the only floor that wires services together.

``prl run`` runs the whole pipeline in one process; ``prl scheduler|producer|learner`` one
service over the configured transport; ``prl inspect``, ``prl replay``, ``prl model``,
``prl data``, ``prl config`` and ``prl bench`` the tools around them. The parser
(prl/cli/parser.py) imports nothing heavy and the config is validated before any command
module is imported, so ``--help`` and configuration errors are instant; each command's code
lives in its own module here (run, services, inspect, replay, prepare).
"""

from __future__ import annotations

import importlib
import json
import sys

from prl.cli.parser import build_parser

# command -> module of prl.cli with its ``command(args, cfg)``
COMMAND_MODULES = {"run": "run", "scheduler": "services", "producer": "services", "learner": "services",
                   "inspect": "inspect", "replay": "replay"}


def load(args):
    """The validated config of a command's --config and --set (and its own overrides);
    on a bad field, one line naming it and exit code 2."""
    from schemas.config import ConfigError, load_config

    overrides = list(args.overrides)
    if getattr(args, "run_dir", None):
        overrides.append(f"run.run_dir={json.dumps(args.run_dir)}")
    if getattr(args, "max_steps", None) is not None:
        overrides.append(f"learner.max_steps={args.max_steps}")
    try:
        return load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"prl: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return importlib.import_module(f"benchmarks.{args.name}").main(args.args)
    if args.command in ("model", "data"):
        from prl.cli import prepare

        return prepare.command(args)
    cfg = load(args)
    from prl import logs

    logs.configure(cfg.run.log_format, cfg.run.log_level)
    if args.command == "config":
        from schemas.config import dump_toml

        print(dump_toml(cfg))
        return 0
    return importlib.import_module(f"prl.cli.{COMMAND_MODULES[args.command]}").command(args, cfg)
