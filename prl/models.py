"""Loading a policy (any Hugging Face causal LM directory) and moving its weights.

Weights travel as safetensors only: a checkpoint's ``model.safetensors`` is read
through fsspec (file://, s3://, ...) and loaded into a running model in place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec

BUILTIN = {"builtin:tiny-adder": Path(__file__).parent / "assets" / "tiny-adder"}
CACHE_DIR = Path(os.environ.get("PRL_CACHE", Path.home() / ".cache" / "prl"))


def resolve_model_dir(path: str) -> Path:
    """A local directory for ``path``: a builtin name, a local path, or a remote URI copied to a cache."""
    if path in BUILTIN:
        return BUILTIN[path]
    fs, root = fsspec.core.url_to_fs(path)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return Path(root)
    local = CACHE_DIR / "models" / hashlib.sha256(path.encode()).hexdigest()[:16]
    if not (local / "config.json").exists():
        fs.get(root.rstrip("/") + "/", str(local), recursive=True)
    return local


def load_model(path: str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(path), dtype=getattr(torch, dtype))
    model.eval()
    return model


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_dir(path))


def export_state(model, state: dict | None = None) -> dict:
    """Weights to save (``state``, default the model's own): HF layout, tied output
    embeddings left out (loaders re-tie them)."""
    state = {k: v.detach().contiguous() for k, v in (model.state_dict() if state is None else state).items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state


def load_state(model, state: dict) -> None:
    """Load weights saved by :func:`export_state`; anything but a tied head missing is an error."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def weights_exist(uri: str) -> bool:
    """Whether ``<checkpoint uri>/model.safetensors`` is (still) there."""
    fs, path = fsspec.core.url_to_fs(uri.rstrip("/") + "/model.safetensors")
    return fs.exists(path)


def read_weights(uri: str) -> dict:
    """The tensors of ``<checkpoint uri>/model.safetensors``, after its checksum matched the
    checkpoint's manifest (a torn or tampered file raises StorageError; nothing is loaded)."""
    from safetensors.torch import load

    from prl.storage import read_verified

    return load(read_verified(uri.rstrip("/"), "model.safetensors"))
