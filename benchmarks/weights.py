"""`prl bench weights`: what a new policy version costs to reach the producers.

prl moves weights through object storage: the learner writes ``model.safetensors`` once (with
a CRC-32C manifest), each producer reads it, verifies it and loads it into its engine. This
measures that path on a real model directory (default: the tiny built-in model; use an
imported SmolLM2-135M-Instruct for a real figure): write to local disk and to an S3 server
(moto), read + verify, load into the transformers backend and, where vLLM is installed, into a
running vLLM engine through the worker extension (in place). It then states the bytes per
version for 135M / 1.7B / 8B parameters and the time per version those rates imply, and
whether vLLM's own weight-transfer engines can run here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from benchmarks.common import count, write_json

SIZES = {"135M": 135e6, "1.7B": 1.7e9, "8B": 8.0e9}
SMALL_MB = 50  # below this a write or read is mostly per-request latency, not bandwidth


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def object_storage_path(model_dir: str, run_dir: str, repeats: int) -> dict:
    """Seconds to write a version's weights, read + verify them, and load them."""
    from prl.learner.checkpoint import write_checkpoint
    from prl.generation import TransformersBackend
    from prl.models import export_state, load_model, read_weights, resolve_model_dir

    model = load_model(model_dir)
    weights = export_state(model)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    step = iter(range(1, 1000))
    uri = {}

    def write():
        uri["last"] = write_checkpoint(run_dir, next(step), weights, None, {"step": 0}, resolve_model_dir(model_dir), 2)

    write_s = timed(write, repeats)
    read_s = timed(lambda: read_weights(uri["last"]), repeats)
    backend = TransformersBackend.from_path(model_dir)
    load_s = timed(lambda: backend.load_weights(uri["last"], 1), repeats)
    return {"bytes": nbytes, "write_s": write_s, "read_verify_s": read_s, "load_transformers_s": load_s,
            "write_MB_per_s": nbytes / write_s / 1e6, "read_MB_per_s": nbytes / read_s / 1e6, "uri": uri["last"]}


def vllm_reload(model_dir: str, uri: str, repeats: int) -> dict | None:
    """In-place reload of a running vLLM engine from the checkpoint (prl/vllm_worker.py)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from prl.generation import VLLMBackend

    engine = VLLMBackend(model_dir, max_model_len=512)
    seconds = timed(lambda: engine.load_weights(uri, 1), repeats)
    del engine.llm
    return {"reload_s": seconds}


def vllm_transfer_engines() -> dict:
    """vLLM's weight-transfer engines and whether any can run here (they need CUDA)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"installed": False}
    import torch
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    names = sorted(getattr(WeightTransferEngineFactory, "_registry", {}) or [])
    return {"installed": True, "engines": names, "cuda": torch.cuda.is_available()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench weights", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder", help="a model directory (e.g. an imported SmolLM2)")
    ap.add_argument("--repeats", type=count, default=3)
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine reload")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)

    from prl import logs
    from tests.support.servers import S3Server

    logs.configure("console", "warning")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["local"] = object_storage_path(args.model, f"{tmp}/run", args.repeats)
        s3 = S3Server(log_path=f"{tmp}/s3.log")
        try:
            s3.create_bucket("prl-weights")
            os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1",
                              AWS_ENDPOINT_URL=s3.endpoint)
            results["s3"] = object_storage_path(args.model, "s3://prl-weights/run", args.repeats)
        finally:
            s3.stop()
        results["vllm"] = None if args.no_vllm else vllm_reload(args.model, results["local"]["uri"], args.repeats)
    results["vllm_transfer_engines"] = vllm_transfer_engines()
    print_report(args.model, results)
    write_json(args, **results)
    return 0


def print_report(model: str, r: dict) -> None:
    mb = r["local"]["bytes"] / 1e6
    print(f"one policy version of {model}: {mb:.0f} MB of weights (best of the repeats)")
    print(f"{'path':<14}{'write s':>9}{'read+verify s':>15}{'load s':>8}{'write MB/s':>12}{'read MB/s':>11}")
    for where in ("local", "s3"):
        x = r[where]
        print(f"{where:<14}{x['write_s']:>9.2f}{x['read_verify_s']:>15.2f}{x['load_transformers_s']:>8.2f}"
              f"{x['write_MB_per_s']:>12.0f}{x['read_MB_per_s']:>11.0f}")
    if r["vllm"]:
        print(f"vLLM engine, in-place reload from the checkpoint: {r['vllm']['reload_s']:.2f} s")
    s3 = r["s3"]
    if mb < SMALL_MB:
        print(f"note: {mb:.0f} MB is too small to measure bandwidth (each request's latency dominates), so the "
              f"times below are too high; --model an imported SmolLM2-135M-Instruct gives real rates")
    print("per version at these rates (bf16 weights; write once, every producer reads in parallel):")
    for name, params in SIZES.items():
        nbytes = 2 * params
        print(f"  {name:>5}: {nbytes / 1e9:5.1f} GB, write {nbytes / 1e6 / s3['write_MB_per_s']:6.1f} s + read "
              f"{nbytes / 1e6 / s3['read_MB_per_s']:6.1f} s per producer")
    e = r["vllm_transfer_engines"]
    if e.get("installed"):
        print(f"vLLM weight-transfer engines here: {', '.join(e['engines']) or '-'}; CUDA available: {e['cuda']}")


if __name__ == "__main__":
    sys.exit(main())
