"""`prl model export`: a run's policy version as a Hugging Face model directory that
transformers and vLLM load as it is (config, tokenizer, chat template, safetensors).

A version is taken whole from the run's checkpoint of that step where there is one (a run that
ends leaves one), else rebuilt from its policy versions (a base and its deltas). Either way it is
verified before anything is written: the checkpoint against its manifest and, cast to the
version's dtype, against the version's checksum; a rebuilt version against its checksum. A LoRA
run's version is its adapter: merged into the base weights, or written as a peft adapter directory.
Both sides take any fsspec URI.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import fsspec

from prl import storage
from prl.models import MODEL_FILES, base_weight_shapes, merge_adapter, resolve_model_dir, write_adapter_dir
from prl.policy import PolicyReader, VersionRejected, flat_bits, newest_version, read_meta, weights_checksum
from prl.trust import checkpoint_name, checkpoint_root, policy_root, version_name


class ExportFailed(ValueError):
    """A version that cannot be exported (one line: which, and what to do)."""


@dataclass(frozen=True)
class Exported:
    out: str
    version: int
    source: str  # "checkpoint" or "policy versions"
    dtype: str
    adapter: bool  # written as a peft adapter directory (LoRA, not merged)
    tensors: int
    seconds: float


def export_model(run_dir: str, out: str, model_path: str, version: int | None = None, dtype: str = "bfloat16",
                 merge_lora: bool = True) -> Exported:
    """Write version ``version`` (default: the newest) of the run in ``run_dir``, trained from
    ``model_path``, to the new directory ``out`` in ``dtype``."""
    import torch

    t0 = time.perf_counter()
    model_dir = resolve_model_dir(model_path)
    version = newest(run_dir) if version is None else version
    tensors, source = version_tensors(run_dir, version, model_dir)
    adapter = any(".lora_A." in name for name in tensors)
    if adapter and merge_lora:
        base = base_weights(model_dir)
        tensors = merge_adapter({k: v.to(base[k].dtype) for k, v in base.items()}, tensors)
    fs, root = fsspec.core.url_to_fs(out)
    if fs.exists(root) and fs.ls(root):
        raise ExportFailed(f"{out} exists and is not empty: give a new directory")
    fs.makedirs(root, exist_ok=True)
    cast = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in tensors.items()}
    if adapter and not merge_lora:
        write_adapter_files(fs, root, cast, model_path)
    else:
        write_chunks(fs, f"{root}/model.safetensors", storage.safetensors_chunks(cast))
    copy_model_files(model_dir, fs, root, dtype)
    return Exported(out, version, source, dtype, adapter and not merge_lora, len(cast), time.perf_counter() - t0)


def newest(run_dir: str) -> int:
    """The newest version the run has: in its policy versions, or its newest checkpoint."""
    steps = [int(n.split("-")[1]) for n in storage.list_versions(checkpoint_root(run_dir), "step-")]
    found = max([newest_version(run_dir), *steps])
    if found == 0:
        raise ExportFailed(f"{run_dir} holds no trained version (no policy/ or checkpoints/): is it a run directory?")
    return found


def version_tensors(run_dir: str, version: int, model_dir) -> tuple[dict, str]:
    """(tensors, where from) of ``version``, verified."""
    ckpt = f"{checkpoint_root(run_dir)}/{checkpoint_name(version)}"
    policy = f"{policy_root(run_dir)}/{version_name(version)}"
    meta = None
    try:
        meta = read_meta(policy, version)
    except VersionRejected:
        pass  # pruned, or a run that kept no versions: the checkpoint alone says it
    if checkpoint_whole(ckpt):
        try:
            tensors = storage.read_safetensors(ckpt, storage.CHECKPOINT_WEIGHTS)  # verified against the manifest
        except storage.StorageError as exc:
            raise ExportFailed(f"checkpoint of step {version} does not verify: {exc}") from None
        if meta is not None and weights_checksum(flat_bits(tensors, [n for n, _ in meta["tensors"]], meta["dtype"])) \
                != meta["checksum"]:
            raise ExportFailed(f"the checkpoint of step {version} does not rebuild version {version}'s checksum")
        return tensors, "checkpoint"
    if meta is None:
        raise ExportFailed(f"{run_dir} has neither a checkpoint nor a policy version {version} that reads whole "
                           f"(versions kept: the newest bases and their deltas; checkpoints: the last 3)")
    try:
        tensors = PolicyReader(base_weight_shapes(model_dir)).read(policy, version, meta["kind"], meta["checksum"])
    except VersionRejected as exc:
        raise ExportFailed(f"version {version} does not rebuild: {exc}") from None
    return {k: v.float() for k, v in tensors.items()}, "policy versions"


def checkpoint_whole(uri: str) -> bool:
    fs, root = fsspec.core.url_to_fs(uri)
    return fs.exists(f"{root}/{storage.MANIFEST}")


def base_weights(model_dir) -> dict:
    """The base model's own weights (every safetensors file of its directory)."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def write_chunks(fs, path: str, chunks: list) -> None:
    with fs.open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def write_adapter_files(fs, root: str, adapter: dict, base_model: str) -> None:
    """A peft adapter directory (adapter_model.safetensors, adapter_config.json)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        write_adapter_dir(Path(tmp), adapter, base_model)
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            fs.put_file(f"{tmp}/{name}", f"{root}/{name}")


def copy_model_files(model_dir, fs, root: str, dtype: str) -> None:
    """Config, tokenizer and chat template of the base model; the config names the dtype."""
    for name in MODEL_FILES:
        src = model_dir / name
        if not src.exists():
            continue
        data = src.read_bytes()
        if name == "config.json":
            config = json.loads(data)
            config["dtype"] = dtype
            data = json.dumps(config, indent=2).encode()
        with fs.open(f"{root}/{name}", "wb") as f:
            f.write(data)
