"""`prl bench weights`: what a new policy version costs to reach the producers, by each way of
sending it, side by side from one run.

The ways, on the same model and the same optimizer steps (AdamW on a random batch of 8 x 48
tokens, at ``--lr``; the update's size is about the learning rate, whatever the gradient):

- ``checkpoint``: the path before policy versions: every step a full checkpoint (float32 weights
  and AdamW state), and producers read its float32 weights;
- ``bf16 weights``: every version the whole model in bf16;
- ``bf16 delta``: what the learner publishes (prl/policy.py): a base, then each version as the
  compressed XOR of its bf16 bits with the previous version's;
- ``lora``: a LoRA adapter of rank ``--lora-rank`` on every linear layer, published alone.

For each: bytes a running producer reads per version (and their share of the bf16 weights),
the learner's write seconds, and the producer's read + rebuild + verify and load seconds, on
local disk and on an S3 server (moto, a process on the same machine: a floor, not a cloud
figure); the share of bf16 elements a step changes; what a producer joining late reads; and
whether every rebuilt version equals the learner's bf16 weights bit for bit. Then what the
measured bytes mean per version at 1.7B and 7B with 64 producers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks.common import count, output_file, positive, s3_server, write_json

SIZES = {"135M": 135e6, "1.7B": 1.7e9, "7B": 7.0e9}
PRODUCERS = 64


def train_steps(model, params, lr: float, steps: int, seed: int = 0):
    """AdamW steps on random batches; yields the optimizer after each."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    vocab = model.get_input_embeddings().num_embeddings
    for _ in range(steps):
        ids = torch.randint(0, vocab, (8, 48))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield opt


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class Ways:
    """The four ways on one store (a run directory); each records bytes and seconds per version."""

    def __init__(self, run_dir: str, model_dir: str, base: dict):
        from prl.generation import TransformersBackend
        from prl.models import base_weight_shapes, resolve_model_dir
        from prl.policy import PolicyReader, PolicyWriter

        self.run_dir, self.model_dir = run_dir, resolve_model_dir(model_dir)
        self.full = PolicyWriter(f"{run_dir}/full", "bfloat16", full_every=1)
        self.delta = PolicyWriter(f"{run_dir}/delta", "bfloat16")
        self.lora_writer = PolicyWriter(f"{run_dir}/lora", "bfloat16")
        shapes = base_weight_shapes(self.model_dir)
        self.full_reader, self.delta_reader = PolicyReader(shapes), PolicyReader(shapes)
        self.lora_reader = PolicyReader({})
        self.backend = TransformersBackend.from_path(model_dir, "bfloat16")
        self.rows: dict[str, list[dict]] = {w: [] for w in ("checkpoint", "bf16 weights", "bf16 delta", "lora")}
        self.identical = True

    def checkpoint(self, version: int, weights: dict, opt) -> None:
        from prl.learner.checkpoint import write_checkpoint
        from prl.storage import read_safetensors

        uri, write_s = timed(lambda: write_checkpoint(self.run_dir, version, weights, opt, {"step": version},
                                                      self.model_dir, 2))
        tensors, read_s = timed(lambda: read_safetensors(uri, "model.safetensors"))
        _, load_s = timed(lambda: self.backend.load_state(tensors, version))
        self.rows["checkpoint"].append({"bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                                        "write_s": write_s, "read_s": read_s, "load_s": load_s})

    def version(self, way: str, writer, reader, version: int, tensors: dict, adapter: bool = False) -> None:
        import torch

        out, write_s = timed(lambda: writer.publish(version, tensors, adapter=adapter))
        served, read_s = timed(lambda: reader.read(out.uri, version, out.kind, out.checksum))
        load = self.backend.load_adapter if adapter else self.backend.load_state
        _, load_s = timed(lambda: load(served, version))
        self.identical &= all(torch.equal(served[k], tensors[k].to(torch.bfloat16)) for k in tensors)
        self.rows[way].append({"bytes": out.bytes, "kind": out.kind, "write_s": write_s, "read_s": read_s, "load_s": load_s})


def full_finetune(args, stores: list[Ways], lr: float, steps: int, checkpoint_on: set) -> list[float]:
    """Steps of full fine-tuning, each version sent every way on every store; the share of bf16
    elements each step changed."""
    import numpy as np

    from prl.models import export_state, load_model
    from prl.policy import flat_bits

    model = load_model(args.model)
    names = list(export_state(model))
    previous, changed = flat_bits(export_state(model), names, "bfloat16"), []
    for version, opt in enumerate(train_steps(model, model.parameters(), lr, steps), 1):
        weights = export_state(model)
        bits = flat_bits(weights, names, "bfloat16")
        changed.append(float(np.mean(bits != previous)))
        previous = bits
        for store in stores:
            if store in checkpoint_on:
                store.checkpoint(version, weights, opt)
            store.version("bf16 weights", store.full, store.full_reader, version, weights)
            store.version("bf16 delta", store.delta, store.delta_reader, version, weights)
        print(f"  lr {lr:g}, step {version}: {changed[-1]:.2%} of bf16 weights changed", flush=True)
    return changed


def lora(args, stores: list[Ways], steps: int) -> int:
    """Steps of LoRA training (lr 1e-4), each adapter sent on every store; the adapter's parameters."""
    from peft import get_peft_model, get_peft_model_state_dict

    from prl.models import load_model, lora_config

    model = get_peft_model(load_model(args.model), lora_config(args.lora_rank))
    trainable = [p for p in model.parameters() if p.requires_grad]
    for version, _ in enumerate(train_steps(model, trainable, 1e-4, steps), 1):
        adapter = {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}
        for store in stores:
            store.version("lora", store.lora_writer, store.lora_reader, version, adapter, adapter=True)
    return sum(p.numel() for p in trainable)


def summary(rows: list[dict], bf16_bytes: int, skip_first: bool) -> dict:
    """Medians over the versions a running producer reads (a delta chain: after its base)."""
    use = rows[1:] if skip_first and len(rows) > 1 else rows
    med = {k: statistics.median(r[k] for r in use) for k in ("bytes", "write_s", "read_s", "load_s")}
    return {**med, "share_of_bf16": med["bytes"] / bf16_bytes, "versions": len(rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench weights", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder", help="a model directory (e.g. an imported SmolLM2)")
    ap.add_argument("--steps", type=count, default=6, help="optimizer steps (versions) per way")
    ap.add_argument("--lr", type=positive, nargs="+", default=[1e-5, 3e-6],
                    help="learning rates; the first is also measured on S3 and for checkpoints")
    ap.add_argument("--lora-rank", type=count, default=8)
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)

    import torch

    from prl import logs
    from prl.models import base_weight_shapes, resolve_model_dir
    logs.configure("console", "warning")
    torch.set_num_threads(os.cpu_count() or 1)
    shapes = base_weight_shapes(resolve_model_dir(args.model))
    bf16_bytes = 2 * sum(int(torch.tensor(s).prod()) if s else 1 for s in shapes.values())
    with tempfile.TemporaryDirectory() as tmp, s3_server(tmp, "prl-weights"):
        stores = {"local": Ways(f"{tmp}/local", args.model, {}), "s3": Ways("s3://prl-weights/run", args.model, {})}
        changed = {args.lr[0]: full_finetune(args, list(stores.values()), args.lr[0], args.steps, set(stores.values()))}
        deltas = {args.lr[0]: [r["bytes"] for r in stores["local"].rows["bf16 delta"]]}
        for lr in args.lr[1:]:
            extra = Ways(f"{tmp}/lr{lr:g}", args.model, {})
            changed[lr] = full_finetune(args, [extra], lr, args.steps, set())
            deltas[lr] = [r["bytes"] for r in extra.rows["bf16 delta"]]
        adapter_params = lora(args, list(stores.values()), args.steps)
    results = {"bf16_bytes": bf16_bytes, "adapter_parameters": adapter_params, "changed_share": changed,
               "delta_bytes": deltas, "identical": all(s.identical for s in stores.values()),
               "ways": {where: {way: summary(rows, bf16_bytes, way == "bf16 delta") for way, rows in s.rows.items()}
                        for where, s in stores.items()}}
    report(args, results)
    write_json(args, **results)
    return 0


def report(args, r: dict) -> None:
    full = r["bf16_bytes"]
    print(f"\n{args.model}: bf16 weights {full / 1e6:.1f} MB; {args.steps} versions per way; medians, a delta chain after its base")
    print(f"{'store':<7}{'way':<14}{'MB per version':>15}{'of bf16':>9}{'write s':>9}{'read+rebuild+verify s':>23}{'load s':>8}")
    for where, ways in r["ways"].items():
        for way, x in ways.items():
            print(f"{where:<7}{way:<14}{x['bytes'] / 1e6:>15.2f}{x['share_of_bf16']:>9.1%}{x['write_s']:>9.2f}"
                  f"{x['read_s']:>23.2f}{x['load_s']:>8.2f}")
    for lr, shares in r["changed_share"].items():
        d = r["delta_bytes"][lr]
        print(f"lr {lr:g}: bf16 elements changed per step {', '.join(f'{c:.2%}' for c in shares)}; "
              f"deltas {', '.join(f'{b / full:.2%}' for b in d[1:])} of the bf16 weights (median {statistics.median(d[1:]) / full:.2%})")
    from prl.policy import FULL_EVERY

    d = r["delta_bytes"][args.lr[0]]
    late = (full + min(full, (FULL_EVERY - 1) * statistics.median(d[1:]))) / full
    print(f"a producer joining late reads a base and at most {FULL_EVERY - 1} deltas, the chain never more than the "
          f"weights: {late:.2f}x the bf16 weights at these deltas")
    print(f"every rebuilt version equal to the learner's bf16 weights, bit for bit: {r['identical']}")
    print(f"LoRA r={args.lora_rank}: {r['adapter_parameters']:,} parameters, "
          f"{r['ways']['local']['lora']['share_of_bf16']:.2%} of the bf16 weights per version")
    s3 = r["ways"]["s3"]["bf16 weights"]
    rate = s3["bytes"] / s3["read_s"]
    share = statistics.median(d[1:]) / full
    print(f"per version with {PRODUCERS} producers (bytes scaled from this model; read time at this S3 server's "
          f"{rate / 1e6:.0f} MB/s per producer):")
    print(f"  {'':>5}  {'checkpoint path: written / read by all':>40}  {'bf16 weights: read by all':>26}  "
          f"{'delta: read by all, s each':>27}")
    for name, params in SIZES.items():
        b16 = 2 * params
        print(f"  {name:>5}  {12 * params / 1e9:17.0f} GB / {4 * params * PRODUCERS / 1e9:9.0f} GB"
              f"  {b16 * PRODUCERS / 1e9:23.0f} GB  {share * b16 * PRODUCERS / 1e9:17.1f} GB, {share * b16 / rate:5.1f} s")


if __name__ == "__main__":
    sys.exit(main())
