"""A vLLM worker extension: reload weights from a checkpoint URI inside the engine's
workers, without restarting the engine. Named in ``LLM(worker_extension_cls=...)``;
only a URI string crosses the process boundary, never tensors."""

from __future__ import annotations


class WeightReload:
    def prl_load_checkpoint(self, uri: str) -> int:
        """Load ``<uri>/model.safetensors`` (via fsspec) into the running model; return the tensor count."""
        from prl.models import read_weights

        weights = read_weights(uri)
        # In-place reload: also redoes the post-load processing (e.g. CPU weight packing)
        # that a plain model.load_weights would skip.
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
