"""The `prl` command: run the pipeline in one process, or one service of it.

Config is parsed and validated before torch or vLLM is imported, so `--help` and
configuration errors are instant.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config file (defaults: the built-in single-machine run)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set learner.lr=1e-5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="prl", description="Asynchronous off-policy GRPO over Kafka.")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the whole pipeline in one process (in-memory transport)")
    _common(run)
    run.add_argument("--run-dir", help="where checkpoints, metrics and plots go (overrides run.run_dir)")
    run.add_argument("--max-steps", type=int, help="learner steps (overrides learner.max_steps)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    for name in ("scheduler", "producer", "learner"):
        _common(sub.add_parser(name, help=f"the {name} service over the configured transport"))
    cfg = sub.add_parser("config", help="print the validated config as TOML")
    _common(cfg)
    bench = sub.add_parser("bench", help="benchmarks (benchmarks/*.py); `prl bench NAME --help`")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    return ap


BENCHMARKS = ("scheduler", "strategies", "replay", "producer", "learner")


def load(args) -> "Config":  # noqa: F821
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
        import importlib

        return importlib.import_module(f"benchmarks.{args.name}").main(args.args)
    cfg = load(args)
    from prl import logs

    logs.configure(cfg.run.log_format, cfg.run.log_level)
    if args.command == "config":
        from schemas.config import dump_toml

        print(dump_toml(cfg))
        return 0
    if args.command == "run":
        from prl.run import run_pipeline

        if cfg.transport.type != "memory":
            print("prl run uses the in-memory transport; start services with prl scheduler|producer|learner", file=sys.stderr)
            return 2
        summary = run_pipeline(cfg, progress=not args.no_progress)
        print(json.dumps({k: v for k, v in summary.items()}, indent=2))
        return 0
    return run_service(args.command, cfg)


def run_service(name: str, cfg) -> int:
    from prl.metrics import MetricsSink
    from prl.transport import make_transport

    transport = make_transport(cfg.transport)
    transport.ensure_topics(cfg.run.name)
    metrics = MetricsSink(cfg.run.run_dir, filename=f"metrics-{name}.jsonl")
    if name == "scheduler":
        from scheduler.service import Scheduler as cls
    elif name == "producer":
        from producers.service import Producer as cls
    else:
        from learner.service import Learner as cls
    service = cls(cfg, transport, metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service.run(stop, http_port=cfg.run.http_port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
