"""`prl bench gpu`: the learner's training tokens/s and model FLOPs utilisation on a randomly
initialised model of a Qwen2 shape (nothing to download), beside a bare torch training loop of
the same model, batch and dtype in the same run (the ceiling); and transformers generation
tokens/s of the same model.

Both training loops start from the same weights and compute the same thing: float32 master
weights and AdamW state, bf16 autocast, a forward whose output layer sees the completion
positions only, the log-prob of each completion token, backward, grad-norm clip, AdamW step,
over micro-batches of at most ``--micro-batch-tokens``. The bare loop is that and nothing else;
the learner's is `learner/train.py` `train_step` (packing, the clipped objective, its statistics).

FLOPs per step (the PaLM convention, no discount for the causal mask): every token costs
6 N_body + 12 L d T (N_body: the decoder layers' parameters, T the sequence length), and every
completion token 6 V d more for the output layer. MFU = those FLOPs per second / the device's
dense bf16 peak (H100 and H200: 989 TFLOP/s; other devices: --peak-tflops).
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks.common import count, output_file, positive, quiet_console, write_json

# Qwen2 shapes by size (the 0.5B and 1.5B of Qwen2.5), and a tiny one for the test suite.
SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=512, tie_word_embeddings=True),
}
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}  # dense, SXM


def make_model(size: str, seq: int, device, seed: int = 0):
    """A randomly initialised Qwen2 model of ``size`` in float32 on ``device`` (sdpa attention)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[size], max_position_embeddings=max(seq, 4096), attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it computes: seconds for 1.5B on a GPU, not minutes
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def synthetic_rollouts(n: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    from prl.schemas import TrainRollout

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, vocab, (prompt + completion,), generator=g).tolist()
        out.append(TrainRollout(f"r{i}", "p", 0, False, float(torch.randn(1, generator=g)), 0.0, 1.0, ids[:prompt],
                                ids[prompt:], (-torch.rand(completion, generator=g)).tolist()))
    return out


def step_flops(model, rows: int, prompt: int, completion: int) -> float:
    """Model FLOPs of one training step (forward and backward) over ``rows`` sequences."""
    c = model.config
    body = sum(p.numel() for p in model.model.layers.parameters())
    seq = prompt + completion
    per_token = 6 * body + 12 * c.num_hidden_layers * c.hidden_size * seq
    return rows * (seq * per_token + completion * 6 * c.vocab_size * c.hidden_size)


def bare_step(model, optimizer, batch, rows_per_micro: int, total_tokens: int) -> None:
    """The ceiling: the same forward, log-probs, backward, clip and AdamW step, nothing else."""
    ids, targets, adv = batch
    C = targets.shape[1]
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, ids.shape[0], rows_per_micro):
        sl = slice(start, start + rows_per_micro)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids[sl], logits_to_keep=C + 1).logits[:, -(C + 1):-1].float()
            logp = logits.gather(-1, targets[sl].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
            loss = -(adv[sl].unsqueeze(-1) * logp).sum() / total_tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def timed(fn, steps: int, device) -> float:
    """Seconds per call of ``fn`` over ``steps`` calls, after one call that warms up."""
    from prl.devices import synchronize

    fn()
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / steps


def train_figures(size: str, args, device) -> dict:
    """Tokens/s and MFU of the bare loop and of the learner's step, on the same weights and batch."""
    from prl.learner.train import make_optimizer, train_step
    from prl.schemas.config import LearnerConfig

    completion = args.seq - args.prompt
    cfg = LearnerConfig(micro_batch_tokens=args.micro_batch_tokens, bf16_autocast=True, lr=1e-6)
    rollouts = synthetic_rollouts(args.rollouts, args.prompt, completion, SHAPES[size]["vocab_size"])
    tokens = args.rollouts * args.seq
    out = {}
    for name in ("bare", "learner"):
        model = make_model(size, args.seq, device)
        optimizer = make_optimizer(model, cfg)
        model.train()
        if name == "bare":
            batch = (torch.tensor(np.stack([np.concatenate([r.prompt_ids, r.completion_ids]) for r in rollouts]), device=device),
                     torch.tensor(np.stack([r.completion_ids for r in rollouts]), device=device),
                     torch.tensor([r.advantage for r in rollouts], device=device))
            rows = max(1, args.micro_batch_tokens // args.seq)
            seconds = timed(lambda: bare_step(model, optimizer, batch, rows, args.rollouts * completion), args.steps, device)
        else:
            seconds = timed(lambda: train_step(model, optimizer, rollouts, cfg, device=device), args.steps, device)
        flops = step_flops(model, args.rollouts, args.prompt, completion)
        out[name] = {"tokens_per_s": tokens / seconds, "step_seconds": seconds, "tflops_per_s": flops / seconds / 1e12}
        if device.type == "cuda":
            out[name]["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["params"] = sum(p.numel() for p in make_model(size, args.seq, "meta").parameters())
    return out


def generation_figures(size: str, args, device) -> dict:
    """Transformers generation tokens/s (sampling, bf16 weights on a GPU) of the same model shape."""
    from prl.generation import Request, TransformersBackend
    from prl.schemas import Sampling

    model = make_model(size, args.seq, device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=None)  # no end token: every row runs to max_tokens
    backend = TransformersBackend(model.eval(), tokenizer)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, SHAPES[size]["vocab_size"], (args.gen_prompt,), generator=g).tolist() for _ in range(args.gen_prompts)]
    requests = [Request(p, 1, Sampling(1.0, 1.0, args.gen_tokens, ())) for p in prompts]
    made = []
    seconds = timed(lambda: made.append(sum(len(c[0].token_ids) for c in backend.generate(requests))), 1, device)
    return {"tokens_per_s": made[-1] / seconds, "seconds": seconds}


def peak_tflops(device, given: float | None) -> float | None:
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=sorted(SHAPES), default=["0.5b", "1.5b"])
    ap.add_argument("--seq", type=count, default=2048, help="tokens per sequence, prompt and completion")
    ap.add_argument("--prompt", type=count, default=512, help="prompt tokens of each sequence")
    ap.add_argument("--rollouts", type=count, default=16, help="sequences per training step")
    ap.add_argument("--micro-batch-tokens", type=count, default=16_384)
    ap.add_argument("--steps", type=count, default=5, help="timed steps after one warm-up step")
    ap.add_argument("--gen-prompts", type=count, default=64)
    ap.add_argument("--gen-prompt", type=count, default=128, help="tokens of each generation prompt")
    ap.add_argument("--gen-tokens", type=count, default=256)
    ap.add_argument("--peak-tflops", type=positive, help="the device's dense bf16 peak (known: H100, H200, A100)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    if args.prompt >= args.seq:
        ap.error("--prompt must be shorter than --seq")
    quiet_console()
    from prl.devices import choose_device

    device = choose_device(args.device)
    peak = peak_tflops(device, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}: {args.rollouts} sequences of {args.seq} tokens ({args.prompt} prompt) a step, "
          f"bf16 autocast, float32 master weights and AdamW", flush=True)
    print(f"{'model':<7}{'bare tok/s':>12}{'learner tok/s':>15}{'ratio':>7}{'bare MFU':>10}{'learner MFU':>13}"
          f"{'gen tok/s':>11}", flush=True)
    results = {}
    for size in args.sizes:
        figures = train_figures(size, args, device)
        figures["generation"] = generation_figures(size, args, device)
        figures["learner_over_bare"] = figures["learner"]["tokens_per_s"] / figures["bare"]["tokens_per_s"]
        for part in ("bare", "learner"):
            figures[part]["mfu"] = figures[part]["tflops_per_s"] / peak if peak else None
        mfu = [f"{figures[p]['mfu']:.1%}" if peak else "n/a" for p in ("bare", "learner")]
        print(f"{size:<7}{figures['bare']['tokens_per_s']:>12,.0f}{figures['learner']['tokens_per_s']:>15,.0f}"
              f"{figures['learner_over_bare']:>7.2f}{mfu[0]:>10}{mfu[1]:>13}{figures['generation']['tokens_per_s']:>11,.0f}",
              flush=True)
        results[size] = figures
    write_json(args, device=name, peak_tflops=peak, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
