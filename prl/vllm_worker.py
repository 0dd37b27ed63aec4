"""A vLLM worker extension: take new weights inside the engine's workers, without restarting
the engine. Named in ``LLM(worker_extension_cls=...)``; only a local file's path crosses the
process boundary, never tensors (the producer verified the file's weights before writing it)."""

from __future__ import annotations


class WeightReload:
    def prl_load_file(self, path: str) -> int:
        """Load the safetensors file at ``path`` into the running model; return the tensor count."""
        from safetensors.torch import load_file

        weights = load_file(path)
        # In-place reload: also redoes the post-load processing (e.g. CPU weight packing)
        # that a plain model.load_weights would skip.
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
