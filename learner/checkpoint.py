"""Learner checkpoints in object storage through fsspec (file://, s3://, gs://, ...).

Layout under ``<run_dir>/checkpoints/`` (written by prl/storage.py: data, manifest, then
``latest``, so a crash mid-write never leaves a checkpoint that loads half)::

    step-00000012/model.safetensors      weights in Hugging Face layout (what producers load)
    step-00000012/config.json, tokenizer*, chat_template.jinja
                                         copied from the base model, so the directory loads
                                         with from_pretrained or vLLM as it is
    step-00000012/optimizer-00000-of-00002.safetensors
                                         each rank's optimizer shard (param groups in state.json);
                                         any number of ranks can resume from them
    step-00000012/state.json             step, last batch seq, counters
    step-00000012/manifest.json          a checksum of every file above
    latest                               {"step": 12, "name": "step-00000012"}

Nothing is pickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import structlog

from prl import storage
from prl.models import MODEL_FILES
from prl.trust import checkpoint_name, checkpoint_root

log = structlog.get_logger("checkpoint")

CheckpointError = storage.StorageError
IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")  # how AdamW runs, not what it learned


root = checkpoint_root  # <run_dir>/checkpoints: where producers accept checkpoints from (prl/trust.py)


def optimizer_shard_name(rank: int, world: int) -> str:
    return f"optimizer-{rank:05d}-of-{world:05d}.safetensors"


def optimizer_tensors(optimizer) -> tuple[dict, list]:
    """This rank's AdamW state as flat named tensors (local shards), plus JSON-able param groups."""
    sd = optimizer.state_dict()
    tensors = {f"{idx}.{name}": (t.to_local() if hasattr(t, "to_local") else t).detach().contiguous()
               for idx, st in sd["state"].items() for name, t in st.items()}
    return tensors, sd["param_groups"]


def restore_optimizer(optimizer, shards: list[dict], param_groups: list, d=None) -> None:
    """Rebuild the optimizer state from the shards of any number of ranks: each tensor is
    the concatenation of its shards along dim 0 (FSDP2 shards dim 0), re-sharded onto
    this run's mesh."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict] = {}
    for key in shards[0]:
        idx, name = key.split(".", 1)
        parts = [s[key] for s in shards]
        full = parts[0] if parts[0].dim() == 0 else torch.cat(parts, dim=0)
        param = params[int(idx)]
        if d is not None and hasattr(param, "device_mesh") and full.dim() > 0:
            from torch.distributed.tensor import Shard, distribute_tensor

            full = distribute_tensor(full, param.device_mesh, [Shard(0)])
        state.setdefault(int(idx), {})[name] = full
    own = optimizer.param_groups  # this process's implementation (fused or not), whatever the checkpoint's was
    groups = [{**saved, **{k: g[k] for k in IMPLEMENTATION if k in g}} for saved, g in zip(param_groups, own)]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def checkpoint_files(step: int, weights: dict, optimizer, state: dict, base_model_dir: Path, rank: int = 0,
                     world: int = 1, copy: bool = False) -> dict[str, dict | bytes]:
    """This rank's files of the checkpoint of ``step``: its optimizer shard, and on rank 0 the
    weights, the state and the base model's config and tokenizer files (tensors stay tensors
    until written). ``copy``: every tensor copied to host memory first, so the files can be
    written while training changes the originals."""
    opt_tensors, param_groups = optimizer_tensors(optimizer) if optimizer is not None else ({}, [])
    files: dict[str, dict | bytes] = {optimizer_shard_name(rank, world): host_copy(opt_tensors) if copy else opt_tensors}
    if rank == 0:
        files[storage.CHECKPOINT_WEIGHTS] = host_copy(weights) if copy else weights
        files[storage.CHECKPOINT_STATE] = json.dumps({**state, "step": step, "param_groups": param_groups,
                                                      "world_size": world}).encode()
        for fname in MODEL_FILES:
            if (base_model_dir / fname).exists():
                files[fname] = (base_model_dir / fname).read_bytes()
    return files


def host_copy(tensors: dict) -> dict:
    return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}


def write_files(run_dir: str, step: int, files: dict[str, dict | bytes]) -> dict[str, str]:
    """Write files of the checkpoint of ``step`` (tensors as safetensors); {file name: checksum}.
    No manifest and no ``latest``: it is not a checkpoint until ``complete_checkpoint``. Each
    file is tried again while the object store is unreachable (``storage.retried``)."""
    def write(fname: str, data):
        return storage.write_file(root(run_dir), checkpoint_name(step), fname,
                                  storage.safetensors_chunks(data) if isinstance(data, dict) else data)

    return {fname: storage.retried(lambda: write(fname, data), f"checkpoint {step} {fname}") for fname, data in files.items()}


def complete_checkpoint(run_dir: str, step: int, written: dict[str, str], keep: int) -> str:
    """Once every file of every rank is written (``written``: file name -> checksum), the
    manifest over them, then ``latest``; checkpoints older than the ``keep`` newest are deleted
    in the background. Returns the checkpoint's URI."""
    return storage.retried(lambda: storage.write_versioned(root(run_dir), checkpoint_name(step), {}, keep, meta={"step": step},
                                                           written=written, prune_in_background=True),  # no wait for deletions
                           f"checkpoint {step}")


def write_checkpoint(run_dir: str, step: int, weights: dict, optimizer, state: dict, base_model_dir: Path, keep: int) -> str:
    """Write a single process's checkpoint now, whole, and make it the latest; its URI."""
    files = checkpoint_files(step, weights, optimizer, state, base_model_dir)
    return complete_checkpoint(run_dir, step, write_files(run_dir, step, files), keep)


def checkpoint_uri(run_dir: str, step: int) -> str:
    return root(run_dir).rstrip("/") + "/" + checkpoint_name(step)


def list_checkpoints(run_dir: str) -> list[str]:
    return storage.list_versions(root(run_dir), "step-")


def read_latest(run_dir: str) -> dict | None:
    return storage.read_latest(root(run_dir))


def latest_uri(run_dir: str) -> str | None:
    return storage.latest_uri(root(run_dir))


@dataclass
class Checkpoint:
    uri: str
    state: dict  # state.json: step, last batch seq, counters, param groups, world size
    weights: dict  # name -> tensor, Hugging Face layout
    optimizer_shards: list[dict]  # one per rank that wrote it


def read_state(uri: str) -> dict:
    return json.loads(storage.read_verified(uri, storage.CHECKPOINT_STATE))


def read_checkpoint(uri: str) -> Checkpoint:
    """Every file of a checkpoint, each verified against the manifest, before anything is
    applied: a checkpoint either loads whole or raises."""
    from safetensors.torch import load

    state = read_state(uri)
    world = state.get("world_size", 1)
    return Checkpoint(uri, state, load(storage.read_verified(uri, storage.CHECKPOINT_WEIGHTS)),
                      [load(storage.read_verified(uri, optimizer_shard_name(r, world))) for r in range(world)])


def newest_checkpoint(run_dir: str) -> Checkpoint | None:
    """The newest checkpoint that reads whole (a torn or tampered one, or a garbage
    ``latest``, is logged in one line and passed over for the one before)."""
    found = storage.first_readable(storage.candidates(root(run_dir), "step-"), read_checkpoint, "checkpoint")
    return None if found is None else found[1]


def load_optimizer(ckpt: Checkpoint, optimizer, d=None) -> None:
    """The optimizer state, from however many ranks wrote it, onto this run's ranks."""
    if ckpt.state.get("param_groups") and ckpt.optimizer_shards[0]:
        restore_optimizer(optimizer, ckpt.optimizer_shards, ckpt.state["param_groups"], d)
