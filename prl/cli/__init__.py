"""The `prl` commands: the only floor that wires services together.

``prl run`` runs the whole pipeline in one process; ``prl scheduler|producer|learner`` one
service over the configured transport; ``prl inspect``, ``prl replay``, ``prl model``,
``prl data``, ``prl config`` and ``prl bench`` the tools around them. The parser
(prl/cli/parser.py) imports nothing heavy and the config is validated before any command
module is imported, so ``--help`` and configuration errors are instant; each command's code
lives in its own module here (run, services, inspect, replay, prepare).
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import select
import signal
import sys

from prl.cli.parser import build_parser

# command -> module of prl.cli with its ``command(args, cfg)``
COMMAND_MODULES = {"run": "run", "scheduler": "services", "producer": "services", "learner": "services",
                   "inspect": "inspect", "replay": "replay", "explain": "explain"}


RUN_CONFIG = "config.toml"  # in a run directory: the resolved configuration the run was started with
LOCAL_PATHS = (("run", "run_dir"), ("task", "train_path"), ("task", "heldout_path"), ("model", "path"),
               ("transport", "kafka", "ssl_cafile"))  # the settings that name a file or directory


def load(args):
    """The validated config of a command's --config and --set (and its own overrides);
    on a bad field, one line naming it and exit code 2. Without --config, a --run-dir that
    holds the configuration its run was started with starts from that one."""
    from prl.schemas.config import load_config

    if getattr(args, "config", None) is None and getattr(args, "run_dir", None):
        stored = stored_config(args.run_dir)
        if stored is not None:
            return load_config(None, command_overrides(args), base=stored)
    return load_config(args.config, command_overrides(args))


def command_overrides(args) -> list[str]:
    """--set, then the command's own flags, as dotted overrides."""
    overrides = list(args.overrides)
    if getattr(args, "log_format", None):
        overrides.append(f"run.log_format={json.dumps(args.log_format)}")
    if getattr(args, "run_dir", None):
        overrides.append(f"run.run_dir={json.dumps(args.run_dir)}")
    if getattr(args, "max_steps", None) is not None:
        overrides.append(f"learner.max_steps={args.max_steps}")
    return overrides


def stored_config(run_dir: str) -> dict | None:
    """The configuration a run directory keeps (see :func:`keep_config`), or None."""
    import tomllib

    import fsspec

    from prl.schemas.config import ConfigError

    uri = f"{run_dir.rstrip('/')}/{RUN_CONFIG}"
    try:
        with fsspec.open(uri, "rb") as f:
            return tomllib.load(f)
    except OSError:  # none there, or no directory at all: the command says what is wrong with it
        return None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{uri}: {exc}; give --config, or remove that file") from None


def keep_config(cfg) -> None:
    """Write the resolved configuration into the run directory, its local paths made absolute:
    every command given that directory alone (`prl explain`, `prl replay`, `prl model export`,
    continuing the run) starts from it, from any working directory."""
    import fsspec

    from prl.schemas.config import dump_toml

    with fsspec.open(f"{cfg.run.run_dir.rstrip('/')}/{RUN_CONFIG}", "w") as f:
        f.write(dump_toml(anchored(cfg)))


def anchored(cfg):
    """``cfg`` with its relative local paths (LOCAL_PATHS) resolved against the working
    directory, as the command that read them did; URIs and builtin: models as they are."""
    from prl.storage import relative_local

    data = cfg.model_dump(mode="json")
    for keys in LOCAL_PATHS:
        *sections, name = keys
        node = data
        for section in sections:
            node = node[section]
        value = node[name]
        if value and relative_local(value) and not value.startswith("builtin:"):
            node[name] = os.path.abspath(value)
    return type(cfg).model_validate(data)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a failure a person can fix is one line on stderr and exit code 2
    (``--debug`` shows the traceback). ``kill -USR1`` prints where every thread is to stderr."""
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    args = build_parser().parse_args(argv)
    args.log_lines = getattr(args, "log_format", None) or "console"  # the config's, once it is read
    try:
        code = dispatch(args)
        sys.stdout.flush()  # a reader that left (`prl ... | head`) is met here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not reader_left():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 128 + signal.SIGPIPE  # what a shell reports for a Unix tool whose reader left
    except Exception as exc:
        from prl.errors import one_line
        from prl.logs import failure_line

        if getattr(args, "debug", False) or not fixable(exc):
            raise
        where = " ".join(filter(None, ["prl", args.command, getattr(args, "action", None)]))
        print(failure_line(where, one_line(exc), args.log_lines), file=sys.stderr)
        return 2


def fixable(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure the person fixes (the input, the environment, the disk)."""
    from prl.errors import disk_full_or_read_only

    return isinstance(exc, user_errors()) or disk_full_or_read_only(exc)


def user_errors() -> tuple[type, ...]:
    """Every exception type that means "fix the input", imported when a command fails."""
    from prl.errors import UsageError, object_store_errors
    from prl.devices import DeviceMissing
    from prl.model_export import ExportFailed
    from prl.model_import import ImportFailed
    from prl.plugins import PluginError
    from prl.policy import VersionRejected
    from prl.service import ServiceStopped
    from prl.storage import StorageError
    from prl.tasks.datasets import DatasetError
    from prl.tasks.reasoning_gym import DataError
    from prl.transport import TransportError
    from prl.trust import KeyMissing
    from prl.schemas.config import ConfigError

    return (UsageError, ConfigError, DeviceMissing, ExportFailed, DatasetError, DataError, StorageError, TransportError, ImportFailed, KeyMissing,
            VersionRejected, PluginError, ServiceStopped, FileNotFoundError, PermissionError, NotADirectoryError,
            *object_store_errors())


def reader_left() -> bool:
    """Whether stdout is a pipe nobody reads any more (`prl inspect tail ... | head` after
    head is done), as opposed to a broken connection elsewhere."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll on this platform, or no real stdout
        return False


def dispatch(args) -> int:
    if args.command == "bench" and args.name is None:
        print(benchmark_list())
        return 0
    if args.command == "bench":
        benchmark = benchmark_module(args.name)
        from benchmarks.common import code_version

        code_version()  # the tree as the benchmark starts (cached): edits made while it runs are not its code
        return benchmark.main(args.args)
    if args.command in ("model", "data"):
        from prl.cli import prepare

        return prepare.command(args)
    cfg = load(args)
    args.log_lines = cfg.run.log_format
    configure_logs(args, cfg)
    if args.command == "config":
        from prl.schemas.config import dump_toml

        print(dump_toml(cfg))
        return 0
    return importlib.import_module(f"prl.cli.{COMMAND_MODULES[args.command]}").command(args, cfg)


def benchmark_module(name: str):
    """benchmarks/<name>.py of the source checkout: the benchmarks are not installed with the
    product, so `prl bench` runs from a clone (installed with `pip install -e .`)."""
    root = checkout()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.{name}")


def benchmark_list() -> str:
    """Bare `prl bench`: each benchmark with the first sentence of its docstring (read, not
    imported: some import vLLM)."""
    import ast
    import re
    import textwrap

    from prl.cli.parser import BENCHMARKS

    lines = ["prl bench NAME [ARGS]  (prl bench NAME --help; benchmarks/RESULTS.md has each one's figures)"]
    for name in BENCHMARKS:
        doc = ast.get_docstring(ast.parse((checkout() / "benchmarks" / f"{name}.py").read_text())) or ""
        what = re.split(r"(?<=[.?])\s", " ".join(doc.split()).split(": ", 1)[-1])[0]
        lines.append(f"  {name:<11} {textwrap.shorten(what, 88, placeholder=' ...')}")
    return "\n".join(lines)


def checkout():
    """The source checkout prl is installed from (UsageError where it is not one)."""
    from pathlib import Path

    from prl.errors import UsageError

    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise UsageError("the benchmarks live in the source checkout, not in the installed package: "
                         "git clone the repository, pip install -e . in it, and run prl bench there")
    return root


def configure_logs(args, cfg) -> None:
    """Services log to the console; `prl run` and `prl replay train` keep the console to
    warnings (plus their own progress lines) and write everything to <run_dir>/prl.log."""
    from prl import logs

    training_here = cfg.run.run_dir if args.command == "run" else None
    if args.command == "replay" and args.action == "train":
        from prl.cli.replay import train_dir

        training_here = train_dir(args, cfg)
    if training_here:
        from prl.cli.run import run_log
        from prl.storage import check_writable

        check_writable(training_here)  # the log file goes there
        verbose = getattr(args, "verbose", False)  # else the libraries' start-up lines stay in the log file
        logs.configure(cfg.run.log_format, "info", log_file=run_log(training_here),
                       console_level="debug" if verbose else "warning", libraries_on_console=verbose)
    else:
        logs.configure(cfg.run.log_format, "debug" if getattr(args, "verbose", False) else "info")
