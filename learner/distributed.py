"""The learner across processes: torchrun + FSDP2 (``fully_shard``), nccl on GPUs and gloo
on CPUs.

Rank 0 alone consumes the batch topic and broadcasts each batch's bytes to the other
ranks; every rank then takes its share of the micro-batches. One consumer keeps the
batch order and the exactly-once bookkeeping (sequence numbers, offsets) in one place,
and the topic has a single partition anyway; a batch is small next to the model, so the
broadcast costs little. Only rank 0 publishes, writes metrics and writes the gathered
Hugging Face weights; every rank writes its own optimizer shard.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    rank: int
    world: int
    mesh: object

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device) -> Dist | None:
    """Join the process group when started by torchrun (any world size, one included: FSDP2
    over one GPU), else None: NCCL and a mesh of GPUs when this rank computes on
    ``cuda:LOCAL_RANK`` (prl/devices.py), gloo and a mesh of CPUs otherwise."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if cuda else "gloo", **({"device_id": device} if cuda else {}))
    world = tdist.get_world_size()
    return Dist(tdist.get_rank(), world, init_device_mesh(device.type, (world,)))


def shard(model, d: Dist, activation_checkpointing: bool = False) -> None:
    """FSDP2: each decoder layer, then the root, sharded along dim 0 over the mesh."""
    from torch.distributed.fsdp import fully_shard

    layers = model.model.layers
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, layer in enumerate(layers):
            layers[i] = checkpoint_wrapper(layer)
    for layer in layers:
        fully_shard(layer, mesh=d.mesh)
    fully_shard(model, mesh=d.mesh)


def comm_device(d: Dist):
    """Where collectives' tensors must be: the rank's GPU under NCCL, the host under gloo."""
    import torch.distributed as tdist

    return torch.device("cuda", torch.cuda.current_device()) if tdist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_bytes(data: bytes | None, d: Dist) -> bytes | None:
    """Rank 0's bytes (or None) on every rank, as tensors (nothing pickled)."""
    import torch.distributed as tdist

    dev = comm_device(d)
    length = torch.tensor([-1 if data is None else len(data)], dtype=torch.int64, device=dev)
    tdist.broadcast(length, 0)
    if length.item() <= 0:  # nothing more to send (an empty buffer cannot be a tensor)
        return None if length.item() < 0 else b""
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev) if d.is_main else \
        torch.empty(length.item(), dtype=torch.uint8, device=dev)
    tdist.broadcast(buf, 0)
    return data if d.is_main else buf.cpu().numpy().tobytes()


def all_gather_strings(value: str, d: Dist) -> list[str]:
    """Every rank's short string (e.g. a checksum, or ""), in rank order."""
    import torch.distributed as tdist

    raw = value.encode()
    t = torch.zeros(256, dtype=torch.uint8)
    if raw:
        t[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    dev = comm_device(d)
    out = [torch.zeros(256, dtype=torch.uint8, device=dev) for _ in range(d.world)]
    tdist.all_gather(out, t.to(dev))
    return [bytes(x.cpu().numpy().tobytes()).rstrip(b"\0").decode() for x in out]


def full_weights(model, d: Dist | None) -> dict:
    """The whole model's weights on rank 0 (other ranks: {}), gathered from the shards."""
    if d is None:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def memory_report(model, d: Dist | None) -> dict:
    """Bytes of parameters, gradients and AdamW state on this rank (gradients and AdamW's two
    moments for the trained parameters alone, in their dtype: a LoRA learner's adapter)."""
    params = sum(local(p).numel() * p.element_size() for p in model.parameters())
    trained = sum(local(p).numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"rank": 0 if d is None else d.rank, "world": 1 if d is None else d.world,
            "parameter_bytes": params, "gradient_bytes": trained, "optimizer_bytes": 2 * trained,
            "total_bytes": params + 3 * trained}
