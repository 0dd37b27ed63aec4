"""Learner checkpoints in object storage through fsspec (file://, s3://, gs://, ...).

Layout under ``<run_dir>/checkpoints/`` (written by prl/storage.py: data, manifest, then
``latest``, so a crash mid-write never leaves a checkpoint that loads half)::

    step-00000012/model.safetensors      weights in Hugging Face layout (what producers load)
    step-00000012/config.json, tokenizer* copied from the base model, so the directory loads
                                         with from_pretrained or vLLM as it is
    step-00000012/optimizer.safetensors  optimizer tensors; param groups go in state.json
    step-00000012/state.json             step, last batch seq, counters
    step-00000012/manifest.json          sha256 of every file above
    latest                               {"step": 12, "name": "step-00000012"}

Nothing is pickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from prl import storage

log = structlog.get_logger("checkpoint")

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
CheckpointError = storage.StorageError


def root(run_dir: str) -> str:
    return run_dir.rstrip("/") + "/checkpoints"


def optimizer_tensors(optimizer) -> tuple[dict, list]:
    """AdamW state as flat named tensors plus JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors = {f"{idx}.{name}": t.detach().contiguous() for idx, st in sd["state"].items() for name, t in st.items()}
    return tensors, sd["param_groups"]


def restore_optimizer(optimizer, tensors: dict, param_groups: list) -> None:
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = t
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def write_checkpoint(run_dir: str, step: int, weights: dict, optimizer, state: dict, base_model_dir: Path, keep: int) -> str:
    """Write one checkpoint and move ``latest`` to it; return the checkpoint's URI."""
    from safetensors.torch import save

    opt_tensors, param_groups = optimizer_tensors(optimizer) if optimizer is not None else ({}, [])
    files: dict[str, bytes] = {
        "model.safetensors": save(weights),
        "optimizer.safetensors": save(opt_tensors),
        "state.json": json.dumps({**state, "step": step, "param_groups": param_groups}).encode(),
    }
    for fname in HF_FILES:
        if (base_model_dir / fname).exists():
            files[fname] = (base_model_dir / fname).read_bytes()
    return storage.write_versioned(root(run_dir), f"step-{step:08d}", files, keep, meta={"step": step})


def list_checkpoints(run_dir: str) -> list[str]:
    return storage.list_versions(root(run_dir), "step-")


def read_latest(run_dir: str) -> dict | None:
    return storage.read_latest(root(run_dir))


def latest_uri(run_dir: str) -> str | None:
    return storage.latest_uri(root(run_dir))


def load_checkpoint(uri: str, model, optimizer) -> dict:
    """Restore weights and optimizer from ``uri``; return its state.json."""
    from safetensors.torch import load

    from prl.models import load_state

    state = json.loads(storage.read_verified(uri, "state.json"))
    load_state(model, load(storage.read_verified(uri, "model.safetensors")))
    if optimizer is not None and state.get("param_groups"):
        restore_optimizer(optimizer, load(storage.read_verified(uri, "optimizer.safetensors")), state["param_groups"])
    log.info("checkpoint_loaded", uri=uri, step=state["step"])
    return state
