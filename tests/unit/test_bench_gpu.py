"""`prl bench gpu` at the tiny size on the CPU: both loops train the same model and batch, and
the figures it prints are the ones it stores."""

import json

import pytest
import torch

from benchmarks import gpu


def test_the_tiny_size_runs_on_the_cpu_and_stores_its_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert gpu.main(["--sizes", "tiny", "--seq", "48", "--prompt", "16", "--rollouts", "4", "--steps", "1",
                     "--gen-prompts", "2", "--gen-prompt", "8", "--gen-tokens", "4", "--device", "cpu",
                     "--json", str(out)]) == 0
    stored = json.loads(out.read_text())
    tiny = stored["results"]["tiny"]
    assert stored["peak_tflops"] is None and tiny["learner"]["mfu"] is None  # no known peak on a CPU
    assert tiny["bare"]["tokens_per_s"] > 0 and tiny["learner"]["tokens_per_s"] > 0
    assert tiny["learner_over_bare"] == pytest.approx(tiny["learner"]["tokens_per_s"] / tiny["bare"]["tokens_per_s"])
    assert tiny["generation"]["tokens_per_s"] > 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].split()[0] == "tiny" and f"{tiny['learner_over_bare']:.2f}" in printed[-1]


def test_the_shapes_have_the_published_sizes():
    """Qwen2.5-0.5B has 494M parameters (136M of them the tied embedding), Qwen2.5-1.5B 1.54B."""
    for size, total in (("0.5b", 494e6), ("1.5b", 1.54e9)):
        model = gpu.make_model(size, 2048, "meta")
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(total, rel=0.01)
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 2


def test_a_known_gpu_has_its_peak_and_a_given_one_wins(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert gpu.peak_tflops(torch.device("cuda", 0), None) == 989.4
    assert gpu.peak_tflops(torch.device("cuda", 0), 500.0) == 500.0
    assert gpu.peak_tflops(torch.device("cpu"), None) is None
