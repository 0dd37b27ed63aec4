"""Checkpoints in object storage through fsspec (file://, s3://, gs://, ...).

Layout under ``<run_dir>/checkpoints/``::

    step-00000012/model.safetensors      weights in Hugging Face layout (what producers load)
    step-00000012/config.json, tokenizer* copied from the base model, so the directory loads
                                         with from_pretrained or vLLM as it is
    step-00000012/optimizer.safetensors  optimizer tensors; param groups go in state.json
    step-00000012/state.json             step, last batch seq, consumed offsets, counters
    step-00000012/manifest.json          sha256 of every file above, written after them
    latest                               {"step": 12, "path": "step-00000012"}, written last

A crash mid-write leaves at worst a directory without a manifest, which ``latest`` never
points at. Loading verifies every checksum. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fsspec
import structlog

log = structlog.get_logger("checkpoint")

HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class CheckpointError(RuntimeError):
    pass


def _root(run_dir: str) -> str:
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

    root = _root(run_dir)
    name = f"step-{step:08d}"
    uri = f"{root}/{name}"
    fs, path = fsspec.core.url_to_fs(uri)
    opt_tensors, param_groups = optimizer_tensors(optimizer) if optimizer is not None else ({}, [])
    files: dict[str, bytes] = {
        "model.safetensors": save(weights),
        "optimizer.safetensors": save(opt_tensors),
        "state.json": json.dumps({**state, "step": step, "param_groups": param_groups}).encode(),
    }
    for fname in HF_FILES:
        if (base_model_dir / fname).exists():
            files[fname] = (base_model_dir / fname).read_bytes()
    fs.makedirs(path, exist_ok=True)
    for fname, data in files.items():
        fs.pipe_file(f"{path}/{fname}", data)
    manifest = {fname: hashlib.sha256(data).hexdigest() for fname, data in files.items()}
    fs.pipe_file(f"{path}/manifest.json", json.dumps(manifest).encode())
    fs.pipe_file(path.rsplit("/", 1)[0] + "/latest", json.dumps({"step": step, "path": name}).encode())
    prune(run_dir, keep)
    return uri


def list_checkpoints(run_dir: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(_root(run_dir))
    if not fs.exists(path):
        return []
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False) if p.rsplit("/", 1)[-1].startswith("step-"))


def prune(run_dir: str, keep: int) -> None:
    latest = read_latest(run_dir)
    names = [n for n in list_checkpoints(run_dir) if latest is None or n != latest["path"]]
    fs, path = fsspec.core.url_to_fs(_root(run_dir))
    for old in names[: max(0, len(names) - (keep - 1))]:
        fs.rm(f"{path}/{old}", recursive=True)


def read_latest(run_dir: str) -> dict | None:
    fs, path = fsspec.core.url_to_fs(_root(run_dir) + "/latest")
    if not fs.exists(path):
        return None
    return json.loads(fs.cat_file(path))


def latest_uri(run_dir: str) -> str | None:
    latest = read_latest(run_dir)
    return None if latest is None else f"{_root(run_dir)}/{latest['path']}"


def read_verified(uri: str, fname: str) -> bytes:
    """One checkpoint file, checked against the manifest."""
    fs, path = fsspec.core.url_to_fs(uri)
    manifest = json.loads(fs.cat_file(f"{path}/manifest.json"))
    data = fs.cat_file(f"{path}/{fname}")
    if hashlib.sha256(data).hexdigest() != manifest.get(fname):
        raise CheckpointError(f"{uri}/{fname}: checksum does not match the manifest")
    return data


def load_checkpoint(uri: str, model, optimizer) -> dict:
    """Restore weights and optimizer from ``uri``; return its state.json."""
    from safetensors.torch import load

    from prl.models import load_state

    state = json.loads(read_verified(uri, "state.json"))
    load_state(model, load(read_verified(uri, "model.safetensors")))
    if optimizer is not None and state.get("param_groups"):
        restore_optimizer(optimizer, load(read_verified(uri, "optimizer.safetensors")), state["param_groups"])
    log.info("checkpoint_loaded", uri=uri, step=state["step"])
    return state
