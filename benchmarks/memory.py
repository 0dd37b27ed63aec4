"""`prl bench memory`: peak resident memory of one generate call of the transformers backend,
its behaviour log-probs taken one decoding step at a time (what the backend does) against the
whole [B, T, V] stack of logits at once (what it did), side by side from one run. With
``--learner``, of one learner step instead: its log-probs through the output layer a block of
positions at a time (learner/train.py, what the learner does) against the whole logits at once.

Each way runs in a fresh process (peak resident memory is a process's high-water mark), on the
same model, prompts and sampling; both load the model the same way, so the model's own size is
reported apart. The default call, given ``--model DIR --task chain_sum``, is the shape of the real
task's held-out evaluation: 200 chat prompts, one greedy completion of at most 24 tokens each.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

from benchmarks.common import bench_prompts, count, output_file, quiet_console, write_json

LEARNER_PROMPT = 64  # prompt tokens of each synthetic rollout of --learner


def peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def stacked_logprobs(step_logits: tuple, tokens, temperature: float):
    """The former way, kept as the baseline: one [B, T, V] tensor of every step's logits, its
    temperature-scaled copy and its log-softmax."""
    import torch

    logits = torch.stack(step_logits, dim=1).float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def one_way(way: str, model: str, prompts: list[str], chat: bool, max_tokens: int, greedy: bool) -> dict:
    """Load the model, make one call, return the process's peak before and after it (MB)."""
    import torch

    import prl.generation as generation
    from prl.generation import Request, TransformersBackend
    from prl.schemas import Sampling

    torch.manual_seed(0)
    if way == "stacked":
        generation.chosen_logprobs = stacked_logprobs
    backend = TransformersBackend.from_path(model)
    requests = [Request(backend.encode(p, chat=chat), 1, Sampling(max_tokens=max_tokens)) for p in prompts]
    loaded = peak_mb()
    out = backend.generate(requests, greedy=greedy)
    peak = peak_mb()
    return {"model_loaded_mb": loaded, "peak_mb": peak, "call_mb": peak - loaded,
            "completion_tokens": sum(len(c.token_ids) for (c,) in out),
            "first": [out[0][0].token_ids, out[0][0].logprobs]}


def one_learner_way(way: str, model: str, rollouts: int, prompt: int, completion: int) -> dict:
    """Load the model (float32, activation checkpointing on, as the GPU overlay trains), make one
    warm-up step (AdamW allocates its state), then time one step on ``rollouts`` synthetic
    rollouts; return the process's peak before and after that step (MB), its loss and grad norm."""
    import time

    import prl.learner.train as train
    from benchmarks.learner import synthetic_batches
    from prl.models import load_model
    from prl.schemas.config import LearnerConfig

    if way == "whole":
        train.HEAD_IS_LOGITS = frozenset()  # every model takes the whole-logits way
    policy, cfg = load_model(model), LearnerConfig(micro_batch_tokens=rollouts * (1 + prompt + completion))
    policy.config.use_cache = False  # no cache to keep when training
    policy.gradient_checkpointing_enable()
    optimizer = train.make_optimizer(policy, cfg)
    warm_up, measured = (synthetic_batches(1, n, p, c, policy.config.vocab_size, seed)[0].rollouts
                         for n, p, c, seed in ((1, 4, 4, 1), (rollouts, prompt, completion, 0)))
    train.train_step(policy, optimizer, warm_up, cfg)
    before, start = peak_mb(), time.perf_counter()
    metrics = train.train_step(policy, optimizer, measured, cfg)
    seconds, peak = time.perf_counter() - start, peak_mb()
    return {"before_step_mb": before, "peak_mb": peak, "step_mb": peak - before, "step_s": seconds,
            "first": [metrics["loss"], metrics["grad_norm"]]}


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new process: a process's peak resident memory is that call's alone."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=quiet_console) as pool:
        return pool.submit(fn, *args).result()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench memory", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder", help="a model directory (e.g. from `prl model import "
                    "smollm2-135m-instruct DIR`) or builtin:tiny-adder")
    ap.add_argument("--task", help="chat prompts from this reasoning-gym task (e.g. chain_sum; for instruct models) "
                    "instead of built-in addition prompts")
    ap.add_argument("--prompts", type=count, default=200, help="prompts in the call (the real task's held-out set: 200)")
    ap.add_argument("--max-tokens", type=count, default=24)
    ap.add_argument("--sample", action="store_true", help="sample at temperature 1 (a producer's call) instead of greedy")
    ap.add_argument("--learner", action="store_true", help="one learner step instead, on synthetic rollouts: its "
                    "log-probs through the output layer in blocks against the whole logits")
    ap.add_argument("--rollouts", type=count, default=8, help="with --learner: rollouts in the step")
    ap.add_argument("--completion-tokens", type=count, default=1000, help=f"with --learner: tokens of each completion "
                    f"(prompts: {LEARNER_PROMPT})")
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    return learner_side_by_side(args) if args.learner else generate_side_by_side(args)


def generate_side_by_side(args) -> int:
    prompts = bench_prompts(args.task, args.prompts)
    results = {way: in_fresh_process(one_way, way, args.model, prompts, bool(args.task), args.max_tokens, not args.sample)
               for way in ("per_step", "stacked")}
    same = results["per_step"].pop("first") == results["stacked"].pop("first")
    print(f"one generate call, transformers backend, {args.model}: {len(prompts)} "
          f"{'chat prompts (' + args.task + ')' if args.task else 'prompts'} x 1 {'sample' if args.sample else 'greedy'} "
          f"completion of <= {args.max_tokens} tokens")
    print(f"{'peak resident memory, MB':<32}{'per step (now)':>16}{'stacked (before)':>18}")
    for key, label in (("model_loaded_mb", "after loading the model"), ("peak_mb", "after the call"),
                       ("call_mb", "the call's own")):
        print(f"{label:<32}{results['per_step'][key]:>16,.0f}{results['stacked'][key]:>18,.0f}")
    print(f"first completion and its log-probs the same both ways: {same}")
    write_json(args, **results, same_first_completion=same)
    return 0 if same else 1


def learner_side_by_side(args) -> int:
    results = {way: in_fresh_process(one_learner_way, way, args.model, args.rollouts, LEARNER_PROMPT, args.completion_tokens)
               for way in ("blocks", "whole")}
    (loss, norm), (whole_loss, whole_norm) = results["blocks"].pop("first"), results["whole"].pop("first")
    same = math.isclose(loss, whole_loss, rel_tol=1e-4, abs_tol=1e-7) and math.isclose(norm, whole_norm, rel_tol=1e-4)
    print(f"one learner step, {args.model} (float32, activation checkpointing): {args.rollouts} rollouts of "
          f"{LEARNER_PROMPT} + {args.completion_tokens} tokens")
    print(f"{'':<32}{'blocks (now)':>16}{'whole (before)':>18}")
    for key, label in (("before_step_mb", "peak before the step, MB"), ("peak_mb", "peak after the step, MB"),
                       ("step_mb", "the step's own, MB"), ("step_s", "the step's time, s")):
        print(f"{label:<32}{results['blocks'][key]:>16,.1f}{results['whole'][key]:>18,.1f}")
    print(f"loss {loss:.6g} and grad norm {norm:.6g} the same both ways: {same}")
    write_json(args, **results, same_loss_and_grad_norm=same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
