"""A vLLM worker extension: take new weights inside the engine's workers, without restarting
the engine. Named in ``LLM(worker_extension_cls=...)``. An engine in the producer's process takes
the verified tensors by reference; across a process boundary only a local file's path crosses,
never pickled tensors (the producer verified the file's weights before writing it)."""

from __future__ import annotations

import logging


class WeightReload:
    def prl_load_file(self, path: str) -> int:
        """Load the safetensors file at ``path`` into the running model; return the tensor count."""
        from safetensors.torch import load_file

        return self.prl_load_tensors(load_file(path))

    def prl_load_tensors(self, weights: dict) -> int:
        """Load these weights (host tensors, Hugging Face names) into the running model, on the
        worker's device; return the tensor count."""
        quiet_known_reload_gaps(self.model_runner.model)
        # In-place reload: also redoes the post-load processing (e.g. CPU weight packing)
        # that a plain model.load_weights would skip.
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        retie_output_embedding(self.model_runner.model)
        return len(weights)


def retie_output_embedding(model) -> None:
    """A model that ties its output layer to the input embedding (SmolLM2, Qwen2.5-0.5B) gets
    the reloaded embedding in its output layer too. vLLM's reload finds no ``lm_head.weight``
    in the file (the tie leaves it out), logs "ParallelLMHead: Failed to load weights" and puts
    the old head back, with its CPU GEMM handle built from the old weights."""
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if not ties_embeddings(model) or head is None or embed is None:
        return
    head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)  # rebuilds the CPU GEMM from the new weight


def ties_embeddings(model) -> bool:
    """Whether the model's config ties its output layer to the input embedding."""
    return bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))


class _KnownReloadGaps(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the layers named: ones a version never
    holds and that are right after the reload anyway. Any other layer still warns."""

    def __init__(self, layers: set[str]):
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args and record.args[0] in self.layers)


def quiet_known_reload_gaps(model) -> None:
    """Once per process: the rotary embedding (a cache computed from the config, put back
    unchanged) and, for a tied model, the output layer (re-tied by ``retie_output_embedding``)
    no longer warn on every reload."""
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if any(isinstance(f, _KnownReloadGaps) for f in logger.filters):
        return
    logger.addFilter(_KnownReloadGaps({"RotaryEmbedding"} | ({"ParallelLMHead"} if ties_embeddings(model) else set())))
