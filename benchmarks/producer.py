"""`prl bench producer`: generation throughput of vLLM against the transformers backend,
on the same model, prompts and sampling settings, side by side in one run.

Counts completion tokens per second of ``generate`` calls (each call: ``--prompts``
prompts x ``--group-size`` samples, every prompt of the call batched together), after one
warm-up call per backend. Engine start-up is reported separately.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench producer", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder")
    ap.add_argument("--task", help="chat prompts from this reasoning-gym task (e.g. chain_sum; for instruct models) "
                                   "instead of built-in addition prompts")
    ap.add_argument("--prompts", type=count, default=128)
    ap.add_argument("--group-size", type=count, default=8)
    ap.add_argument("--max-tokens", type=count, default=8)
    ap.add_argument("--calls", type=count, default=5)
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from prl.generation import TransformersBackend, VLLMBackend
    from prl.schemas import Sampling

    prompts = bench_prompts(args.task, args.prompts)
    chat = bool(args.task)
    sampling = Sampling(1.0, 1.0, args.max_tokens, [])
    t0 = time.perf_counter()
    vllm = VLLMBackend(args.model)
    vllm_start = time.perf_counter() - t0
    results = {"vllm": measure(vllm, prompts, sampling, args.group_size, args.calls, chat)}
    results["vllm"]["startup_s"] = vllm_start
    t0 = time.perf_counter()
    hf = TransformersBackend.from_path(args.model)
    hf_start = time.perf_counter() - t0
    results["transformers"] = measure(hf, prompts, sampling, args.group_size, args.calls, chat)
    results["transformers"]["startup_s"] = hf_start
    print(f"producer backends, {args.model}, {args.prompts} {'chat prompts (' + args.task + ')' if chat else 'prompts'} x "
          f"{args.group_size} samples x <= {args.max_tokens} tokens per call")
    print(f"{'figure':<18}{'vLLM':>14}{'transformers':>16}")
    print(f"{'tokens_per_s':<18}{results['vllm']['tokens_per_s']:>14,.0f}{results['transformers']['tokens_per_s']:>16,.0f}")
    print(f"{'startup_s':<18}{vllm_start:>14.1f}{hf_start:>16.1f}")
    write_json(args, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
