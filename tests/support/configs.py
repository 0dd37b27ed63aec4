"""Config files for services started as `prl` processes against a test broker."""

from __future__ import annotations

from pathlib import Path

import tomli_w


def write_kafka_config(path: Path, bootstrap: str, run_name: str, run_dir: str, **sections: dict) -> Path:
    """A TOML config: the run on the Kafka transport (short group sessions, JSON logs),
    small batches for the tiny model, one torch thread per service; ``sections`` add to or
    override a section each (``scheduler={"tau_max": 3}``)."""
    config = {
        "run": {"name": run_name, "run_dir": run_dir, "log_format": "json"},
        "transport": {"type": "kafka", "kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 3000}},
        "scheduler": {"groups_per_batch": 4, "max_in_flight": 8},
        "producer": {"max_dispatches_per_call": 4, "threads": 1},
        "learner": {"eval_every": 0, "checkpoint_every": 1, "threads": 1},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    path.write_text(tomli_w.dumps(config))
    return path
