"""Experiment trackers: the metrics every service writes to metrics.jsonl, also to
TensorBoard and/or Weights & Biases (``run.trackers``), and a sample of rollouts as a table.

Neither is required: each is imported only when configured. W&B runs offline unless
``WANDB_API_KEY`` is set (``wandb sync <dir>`` uploads later); its files and TensorBoard's
event files go under the run directory (a local one; on object storage under the local
cache, PRL_CACHE). One tracker run per process, grouped by the run name.
"""

from __future__ import annotations

import os
from pathlib import Path

import fsspec


def local_dir(run_dir: str, sub: str) -> str:
    """``<run_dir>/<sub>`` on a local run directory, else the same under the local cache."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    from prl.models import CACHE_DIR

    base = Path(path) if local else CACHE_DIR / "trackers" / path.strip("/").replace("/", "_")
    (base / sub).mkdir(parents=True, exist_ok=True)
    return str(base / sub)


class TensorBoardTracker:
    def __init__(self, cfg, name: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.path.join(local_dir(cfg.run.run_dir, "tensorboard"), name))

    def log(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |\n" for r in rows)
        self.writer.add_text(name, header + body, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, cfg, name: str):
        import wandb

        from prl.schemas.config import dump_toml

        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "prl"), group=cfg.run.name, name=f"{cfg.run.name}-{name}",
                              dir=local_dir(cfg.run.run_dir, "."), mode=mode, config={"toml": dump_toml(cfg)},
                              reinit="create_new", settings=wandb.Settings(silent=True, console="off"))

    def log(self, values: dict, step: int) -> None:
        self.run.log(values)

    def table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows)})

    def close(self) -> None:
        self.run.finish()


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}


def make_trackers(cfg, name: str) -> list:
    """The trackers ``run.trackers`` names, for the process called ``name`` (a service, or run)."""
    return [TRACKERS[kind](cfg, name) for kind in cfg.run.trackers]
