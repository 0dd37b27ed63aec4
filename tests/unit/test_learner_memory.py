"""What the learner's state takes (weights, gradients, AdamW's moments) and what its device
has, as the learner checks them at its start."""

import torch

from prl import devices
from prl.learner.distributed import memory_report
from prl.models import load_model, lora_config


def test_a_full_learner_takes_16_bytes_a_parameter_and_a_lora_learner_its_weights_and_adapter():
    model = load_model("builtin:tiny-adder")
    params = sum(p.numel() for p in model.parameters())
    assert memory_report(model, None)["total_bytes"] == 16 * params
    from peft import get_peft_model

    adapted = get_peft_model(model, lora_config(4))
    adapter = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    report = memory_report(adapted, None)
    assert 0 < adapter < params // 10
    assert report["optimizer_bytes"] == 8 * adapter and report["total_bytes"] == 4 * (params + adapter) + 12 * adapter


def test_the_cpus_memory_is_the_hosts_or_less_where_the_cgroup_allows_less(tmp_path, monkeypatch):
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(devices, "CGROUP_MEMORY_LIMITS", (str(v2), str(v1)))
    assert devices.memory_bytes(torch.device("cpu")) == ram  # no cgroup files
    v2.write_text("max\n")
    assert devices.memory_bytes(torch.device("cpu")) == ram  # a pod without a memory limit
    v1.write_text(f"{1 << 30}\n")
    assert devices.memory_bytes(torch.device("cpu")) == 1 << 30
