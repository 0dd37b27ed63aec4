"""Loading a policy (any Hugging Face causal LM directory), moving its weights, and its LoRA
adapters. Weights travel as safetensors only (policy versions: prl/policy.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import fsspec

from prl.errors import one_line
from prl.storage import looked_under, unreachable

# The files of a model directory besides its weights (config, tokenizer, chat template): copied
# into every checkpoint and every exported model, so either loads on its own.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json")
BUILTIN = {"builtin:tiny-adder": Path(__file__).parent / "assets" / "tiny-adder"}
CACHE_DIR = Path(os.environ.get("PRL_CACHE", Path.home() / ".cache" / "prl"))


class ModelNotFound(FileNotFoundError):
    """``model.path`` names no model directory (one line to the person who set it)."""

    def __init__(self, path: str, why: str):
        super().__init__(f"model.path {path!r}: {why}; give a Hugging Face model directory (path or fsspec URI, e.g. "
                         "from `prl model import`) or builtin:tiny-adder")


def resolve_model_dir(path: str) -> Path:
    """A local directory for ``path``: a builtin name, a local path, or a remote URI copied to a
    cache. Raises ModelNotFound when there is no model directory (no config.json) there."""
    if path in BUILTIN:
        return BUILTIN[path]
    fs, root = fsspec.core.url_to_fs(path)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        local = Path(root)
    else:
        local = CACHE_DIR / "models" / hashlib.sha256(path.encode()).hexdigest()[:16]
        if not (local / "config.json").exists():
            copy_model_dir(fs, root, local, path)
    if not (local / "config.json").is_file():
        raise ModelNotFound(path, f"no such directory{looked_under(path)}" if not local.exists() else "no config.json in it")
    return local


def copy_model_dir(fs, root: str, local: Path, path: str) -> None:
    """Copy the remote model directory ``root`` to ``local``; a missing one raises
    ModelNotFound, an unreadable one (credentials, endpoint) StorageError, each one line."""
    from prl.storage import StorageError

    try:
        if not fs.exists(root.rstrip("/") + "/config.json"):
            raise ModelNotFound(path, "no config.json there")
        partial = local.with_name(f"{local.name}.partial-{os.getpid()}")  # a copy cut short is never taken as whole
        fs.get(root.rstrip("/") + "/", str(partial), recursive=True)
        if local.exists():  # an earlier copy that never finished
            shutil.rmtree(local)
        partial.replace(local)
    except ModelNotFound:
        raise
    except Exception as exc:  # credentials, a missing bucket, an unreachable endpoint...
        reason = getattr(exc, "strerror", None) or one_line(exc)[:200]
        raise StorageError(f"cannot read model.path {path}: {reason}; check the storage endpoint and credentials") from None


def load_model(path: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(path), dtype=getattr(torch, dtype))
    model.eval()
    return model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_dir(path))


def context_length(config) -> int:
    """The longest sequence a model takes: ``max_position_embeddings``, times the RoPE scaling
    factor where its config has one (YaRN and the like, as vLLM counts it); unbounded if unknown."""
    positions = getattr(config, "max_position_embeddings", None)
    if not positions:
        return 1 << 30
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    return int(positions * factor) if factor and factor > 1 else int(positions)


def model_context(path: str) -> int | None:
    """The context length of the model at ``path`` from its config.json alone (a scheduler
    checks groups against it without the weights); None where that cannot be read, but an
    unreachable store raises (the caller's step is tried again)."""
    import json
    from types import SimpleNamespace

    uri = str(BUILTIN[path] / "config.json") if path in BUILTIN else f"{path.rstrip('/')}/config.json"
    try:
        with fsspec.open(uri, "rb") as f:
            config = json.load(f)
    except Exception as exc:  # no such file, no access, no filesystem for the scheme, not JSON
        if unreachable(exc):
            raise
        return None
    return context_length(SimpleNamespace(**config)) if isinstance(config, dict) else None


def export_state(model, state: dict | None = None) -> dict:
    """Weights to save (``state``, default the model's own): HF layout, tied output
    embeddings left out (loaders re-tie them)."""
    state = {k: v.detach().contiguous() for k, v in (model.state_dict() if state is None else state).items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def load_state(model, state: dict) -> None:
    """Load weights saved by :func:`export_state`; anything but a tied head missing, or a
    shape that differs, is an error raised before any weight is copied."""
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        raise ValueError(f"weights do not fit the model: shapes differ for {wrong[:5]}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def safetensors_shapes(header: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def read_safetensors_header(uri: str) -> dict:
    """The JSON header of a safetensors file (names, dtypes, shapes), without its data."""
    import json
    import struct

    with fsspec.open(uri, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100 << 20:
            raise ValueError(f"{uri}: not a safetensors file (a header of {n} bytes)")
        return json.loads(f.read(n))


def base_weight_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a model directory's safetensors files (what any
    checkpoint of this model must hold)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        shapes.update(safetensors_shapes(read_safetensors_header(str(path))))
    return shapes


# -- LoRA (learner.lora_rank) ------------------------------------------------------------------
LORA_ALPHA_PER_RANK = 2  # lora_alpha = 2 r: the adapter's update is scaled by alpha / r = 2


def lora_config(rank: int):
    """peft's LoRA on every linear layer but the output head, alpha = 2 r, no dropout."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=LORA_ALPHA_PER_RANK * rank, target_modules="all-linear", lora_dropout=0.0)


def merge_adapter(base: dict, adapter: dict) -> dict:
    """The base weights with each adapted layer's W + (alpha / r) B A; ValueError (naming the
    tensor) for an adapter tensor that names no layer of the base or does not fit its shape."""
    out = dict(base)
    for key, a in adapter.items():
        if ".lora_A." not in key:
            continue
        b = adapter.get(key.replace(".lora_A.", ".lora_B."))
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        w = base.get(name)
        if b is None or w is None or a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0] \
                or (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise ValueError(f"adapter tensor {key} does not fit the model")
        b, a = b.to(w.device).float(), a.to(w.device).float()  # the adapter comes from the host, the base may be on a GPU
        out[name] = (w.float() + LORA_ALPHA_PER_RANK * (b @ a)).to(w.dtype)
    if len(adapter) != 2 * sum(".lora_A." in k for k in adapter):
        raise ValueError("an adapter holds lora_A and lora_B pairs only")
    return out


def write_adapter_dir(directory: Path, adapter: dict, base_model: str) -> None:
    """A peft adapter directory (adapter_model.safetensors, adapter_config.json) vLLM loads."""
    import json

    from safetensors.torch import save_file

    rank = next(v.shape[0] for k, v in adapter.items() if ".lora_A." in k)
    modules = sorted({k.split(".lora_A.")[0].rsplit(".", 1)[-1] for k in adapter if ".lora_A." in k})
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": LORA_ALPHA_PER_RANK * rank, "target_modules": modules,
        "lora_dropout": 0.0, "bias": "none", "base_model_name_or_path": base_model, "task_type": "CAUSAL_LM"}))
