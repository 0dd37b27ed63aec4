"""What every benchmark shares: the ``--json PATH`` output, a quiet console."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from prl.cli.parser import count, fraction, natural, output_file, positive, write_text  # noqa: F401 (the benchmarks' option types)


@functools.cache
def code_version() -> dict:
    """The commit the benchmark ran from and whether the work tree differed from it (None for
    both outside a git checkout), so stored figures name the code that made them: read once,
    by `prl bench` as the benchmark starts, so an edit made while it runs is not counted."""
    return git_state()


def git_state() -> dict:
    """The work tree's commit and whether it differs from it, now."""
    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(["git", *cmd], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def machine() -> dict:
    """What the figures ran on: the CPU, its cores and, where torch is loaded, its vector
    capability and whether it computes bf16 natively (wall times and the pipeline's off-policy
    lags depend on them, so runs pool only with runs from a like machine)."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")] \
        if info.exists() else []
    out = {"cpu": names[0] if names else platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if "torch" in sys.modules:
        from prl.devices import native_bf16

        out.update(torch_cpu_capability=sys.modules["torch"].backends.cpu.get_cpu_capability(), native_bf16=native_bf16("cpu"))
    return out


def write_json(args, **figures) -> None:
    """Write the run's arguments, the code's commit, the machine and the figures to
    ``args.json`` when it was given."""
    if args.json:
        code = code_version()  # before the file is opened: rewriting a committed results file would count as a change
        write_text(args.json, json.dumps({"args": vars(args), "code": code, "machine": machine(), **figures}, indent=2, default=str))


def bench_prompts(task: str | None, n: int) -> list[str]:
    """``n`` prompts for a generation benchmark: chat prompts (JSON) of a reasoning-gym ``task``
    at its default settings, or built-in three-digit addition prompts; the same every run."""
    if task:
        from prl.tasks.reasoning_gym import make_rows

        rows, _, _, _ = make_rows(task, n, 0, seed=0, settings={})
        return [json.dumps(r["prompt"]) for r in rows]
    import random

    from prl.tasks import addition

    rng = random.Random(0)
    return [addition.make_problem(rng.randint(10, 999), rng.randint(10, 999), 3).prompt for _ in range(n)]


def quiet_console(log_file: str | None = None) -> None:
    """Warnings and errors only on the console, no download or loading progress bars: the
    benchmark prints its own progress and figures. With ``log_file``, the libraries' lines (vLLM's
    and torch's warnings) and prl's own info events go to that file instead of the console."""
    from transformers.utils import logging as hf_logging

    from prl import logs

    if log_file:
        logs.configure("console", "info", log_file=log_file, console_level="warning", libraries_on_console=False)
    else:
        logs.configure("console", "warning")
    hf_logging.disable_progress_bar()


S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


@contextlib.contextmanager
def s3_server(tmp: str, bucket: str):
    """An S3 server (moto, a process on this machine) holding ``bucket``, with the AWS
    environment naming it (processes started meanwhile take it with them) until the block ends."""
    import fsspec

    from tests.support.servers import S3Server

    s3 = S3Server(log_path=f"{tmp}/s3.log")
    saved = {k: os.environ.get(k) for k in S3_ENV}
    try:
        s3.create_bucket(bucket)
        os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL=s3.endpoint)
        fsspec.filesystem("s3").clear_instance_cache()  # a cached client would still name an earlier endpoint
        yield s3
    finally:
        s3.stop()
        for k, v in saved.items():  # the caller's environment as it was
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fsspec.filesystem("s3").clear_instance_cache()
