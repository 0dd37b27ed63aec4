"""Where tensors live and in what precision they compute: one decision per process.

``run.device`` names it. ``auto`` is the local GPU where torch sees CUDA (``cuda:LOCAL_RANK``
under torchrun, ``cuda:0`` otherwise), else the CPU; ``cuda`` where there is none stops the
command with one line. The learner's model, optimizer state, batches and loss and the
transformers producer's model and prompts all go to the device chosen here; a policy version
comes back to the host only to be written (prl/policy.py, on the writer's thread).

Precision: the learner keeps float32 master weights and AdamW state on the device and computes
under bf16 autocast where ``learner.bf16_autocast`` says so. Pure bf16 weights would drop most
updates: at the learning rates RL uses (1e-6 to 1e-5) Adam moves a weight by about the learning
rate, below bf16's resolution of |w|/256 for most weights, so only 2.7-6.7% of the bf16 weights
change in a step at 1e-5 (shared/ENVIRONMENT.md, measured on SmolLM2-135M).
"""

from __future__ import annotations

import functools
import os

DEVICES = ("auto", "cpu", "cuda")


class DeviceMissing(RuntimeError):
    """The configuration asks for a device this machine does not have (one line to the user)."""


def choose_device(setting: str = "auto"):
    """The torch device this process computes on, from ``run.device``."""
    import torch

    if setting not in DEVICES:
        raise DeviceMissing(f"run.device = {setting!r}: expected one of {', '.join(DEVICES)}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        built = torch.version.cuda or "none, a CPU build"
        raise DeviceMissing(f"run.device = 'cuda' but torch {torch.__version__} sees no CUDA GPU (built for CUDA: "
                            f"{built}): install a CUDA build of torch on a GPU machine, or set run.device = \"auto\"")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise DeviceMissing(f"LOCAL_RANK {index} but torch sees {torch.cuda.device_count()} CUDA GPU(s): start at most "
                            "one process per GPU (torchrun --nproc_per_node)")
    return torch.device("cuda", index)


@functools.cache
def native_bf16(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` computes bfloat16 natively: a CUDA GPU that supports it, or a
    CPU with AVX512-BF16 or AMX (torch's own checks); a CPU with AVX2 alone emulates bf16.
    Asked once per process and device type (the learner asks every step)."""
    import torch

    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, check, lambda: False)() for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def bf16_autocast_on(setting: bool | str, native: bool) -> bool:
    """``learner.bf16_autocast`` resolved: true and false as set, "auto" only where bf16 is native."""
    return native if setting == "auto" else bool(setting)


def autocast(device, setting: bool | str):
    """The autocast context of a training forward on ``device``: bf16 where the setting says so,
    of the device's own type (a CPU model on a GPU machine autocasts on the CPU)."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_autocast_on(setting, native_bf16(device.type)))


def module_device(module):
    """The device a module's parameters live on (the local device of a sharded one)."""
    param = next(module.parameters())
    return param.to_local().device if hasattr(param, "to_local") else param.device


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v2, v1


def memory_bytes(device) -> int:
    """All the memory ``device`` has: a GPU's own, or for the CPU the host's RAM, or less where
    the process's cgroup (a pod's memory limit) allows less."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in CGROUP_MEMORY_LIMITS:
        try:
            with open(limit) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            ram = min(ram, int(value))
    return ram


def synchronize(device) -> None:
    """Wait for the device's queued work (timings of GPU work need it; nothing on a CPU)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_ARENA_MAX = -1, -8


def limit_heap_fragmentation() -> bool:
    """Keep glibc from holding freed tensor memory: at most 2 malloc arenas, and a fixed trim
    threshold (which also stops glibc raising its mmap threshold, so large buffers are mapped
    and unmapped instead of kept in a heap). Episodes of varied length fragment the heap of a
    process that trains and samples in threads: a 3-minute run of the calculator example peaked
    at 13.6 GB, and at 7.8 GB with these settings. They cost speed, so only episode runs
    (``task.environment``) take them: the single-turn real example made 47 steps in 15 minutes
    with them against 63-69 without (benchmarks/RESULTS.md). Set before the services start; a
    MALLOC_ARENA_MAX in the environment is left to glibc. False where libc is not glibc."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, 2)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 128 << 20))
    except (OSError, AttributeError):
        return False
