"""producer.backend = "auto" on a CPU: vLLM for a model of real size, transformers for a tiny
one (where vLLM's per-step scheduling costs more than the decoding step); on a GPU vLLM whatever
the size; named engines as asked; each producer its own sampling seed."""

import importlib.util

import pytest

from prl.generation import engine_for

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def model_of(tmp_path, size: int) -> str:
    (tmp_path / "config.json").write_text("{}")
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(size)  # a sparse file: its size is all the choice reads
    return str(tmp_path)


def test_auto_on_a_cpu_picks_by_the_weights_size(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    assert engine_for("auto", model_of(small, 10_000_000)) == "transformers"
    assert engine_for("auto", model_of(large, 538_000_000)) == ("vllm" if HAS_VLLM else "transformers")
    assert engine_for("auto", "builtin:tiny-adder") == "transformers"


def test_a_named_engine_is_the_one_used(tmp_path):
    model = model_of(tmp_path, 538_000_000)
    assert engine_for("transformers", model) == "transformers"
    if HAS_VLLM:
        assert engine_for("vllm", model) == "vllm"
    else:
        with pytest.raises(RuntimeError, match="vllm is not installed"):
            engine_for("vllm", model)


def test_auto_on_a_gpu_picks_vllm_whatever_the_size(tmp_path):
    small = model_of(tmp_path, 10_000_000)
    assert engine_for("auto", small, on_gpu=True) == ("vllm" if HAS_VLLM else "transformers")
    assert engine_for("transformers", small, on_gpu=True) == "transformers"


def test_each_producer_and_each_run_seed_samples_its_own_stream():
    from prl.producers.service import sampling_seed

    seeds = {sampling_seed(run, producer) for run in (0, 1) for producer in ("producer-0", "producer-1", "pod-a-1")}
    assert len(seeds) == 6 and sampling_seed(0, "producer-0") == sampling_seed(0, "producer-0")
    assert all(0 <= s < 2**32 for s in seeds)  # what vLLM's seed takes
