"""`prl bench producer`: generation throughput of vLLM against the transformers backend,
on the same model, prompts and sampling settings, side by side in one run.

Counts completion tokens per second of ``generate`` calls (each call: ``--prompts``
prompts x ``--group-size`` samples, every prompt of the call batched together), after one
warm-up call per backend. Engine start-up is reported separately.

``--lora-rank R``: each backend serves a random rank-R adapter (learner.lora_rank), and vLLM
twice: the adapter merged into its weights (what a producer on a CPU does) and through vLLM's
LoRA support (what one on a GPU does).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.common import bench_prompts, count, output_file, write_json


def measure(backend, prompts, sampling, group_size, calls, chat: bool = False):
    from prl.generation import Request

    reqs = [Request(backend.encode(p, chat=chat), group_size, sampling) for p in prompts]
    backend.generate(reqs)  # warm-up
    tokens, t0 = 0, time.perf_counter()
    for _ in range(calls):
        tokens += sum(len(c.token_ids) for g in backend.generate(reqs) for c in g)
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds}


def random_adapter(model: str, rank: int) -> dict:
    """A peft adapter of the model, as after some steps (B no longer zero)."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict

    from prl.models import load_model, lora_config

    peft_model = get_peft_model(load_model(model), lora_config(rank))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}


def backends(args) -> dict:
    """Each way to measure: its key, its column's name and how to start it."""
    from prl.generation import TransformersBackend, VLLMBackend

    rank = args.lora_rank or 0
    ways = {"vllm": ("vLLM, merged" if rank else "vLLM", lambda: VLLMBackend(args.model, lora_rank=rank, merge_adapters=True))}
    if rank:
        ways["vllm_lora"] = ("vLLM's LoRA", lambda: VLLMBackend(args.model, lora_rank=rank, merge_adapters=False))
    ways["transformers"] = ("transformers", lambda: TransformersBackend.from_path(args.model))
    return ways


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench producer", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder")
    ap.add_argument("--task", help="chat prompts from this reasoning-gym task (e.g. chain_sum; for instruct models) "
                                   "instead of built-in addition prompts")
    ap.add_argument("--prompts", type=count, default=128)
    ap.add_argument("--group-size", type=count, default=8)
    ap.add_argument("--max-tokens", type=count, default=8)
    ap.add_argument("--calls", type=count, default=5)
    ap.add_argument("--lora-rank", type=count, help="serve a random adapter of this rank (see the module's doc)")
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from prl.schemas import Sampling

    prompts = bench_prompts(args.task, args.prompts)
    chat = bool(args.task)
    sampling = Sampling(1.0, 1.0, args.max_tokens, [])
    adapter = random_adapter(args.model, args.lora_rank) if args.lora_rank else None
    results, ways = {}, backends(args)
    for name, (_, start) in ways.items():
        t0 = time.perf_counter()
        backend = start()
        started = time.perf_counter() - t0
        if adapter is not None:
            backend.load_adapter(adapter, 1)
        results[name] = {**measure(backend, prompts, sampling, args.group_size, args.calls, chat), "startup_s": started}
        del backend  # one engine's KV cache at a time
    print(f"producer backends, {args.model}, {args.prompts} {'chat prompts (' + args.task + ')' if chat else 'prompts'} x "
          f"{args.group_size} samples x <= {args.max_tokens} tokens per call"
          + (f", a rank-{args.lora_rank} adapter" if adapter is not None else ""))
    print(f"{'figure':<14}" + "".join(f"{label:>16}" for label, _ in ways.values()))
    print(f"{'tokens_per_s':<14}" + "".join(f"{r['tokens_per_s']:>16,.0f}" for r in results.values()))
    print(f"{'startup_s':<14}" + "".join(f"{r['startup_s']:>16.1f}" for r in results.values()))
    write_json(args, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
