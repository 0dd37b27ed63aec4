"""`prl model import`, `prl data reasoning-gym` and `prl data likelihood`: a model, data to
train on, and difficulty groups for it without a label."""

from __future__ import annotations

import json
import sys


def command(args) -> int:
    if args.command == "model":
        return import_model(args)
    return score_answers(args) if args.action == "likelihood" else make_data(args)


def import_model(args) -> int:
    from prl.model_import import import_gguf

    s = import_gguf(args.source, args.out_dir)
    print(f"wrote {s.out_dir}: {s.parameters / 1e6:.1f}M parameters, {s.layers} layers, vocabulary {s.vocab_size:,}, "
          f"chat template {'yes' if s.chat_template else 'no'} ({s.seconds:.0f} s)")
    print(f"note: the {s.quantization} weights were dequantized to float32; the model is as good as the quantized "
          f"file, not the original release")
    print(f"use it with: --set model.path={json.dumps(s.out_dir)}")
    return 0


def make_data(args) -> int:
    from prl.tasks.reasoning_gym import SYSTEM_PROMPT, write_dataset
    from prl.schemas.config import parse_override

    settings = {}
    for item in args.settings:
        keys, value = parse_override(item)
        settings[".".join(keys)] = value
    s = write_dataset(args.task, args.train, args.test, args.seed, args.out, settings,
                      SYSTEM_PROMPT if args.system is None else args.system)
    print(f"wrote {s.out_dir}/train.parquet ({s.train} problems) and test.parquet ({s.test}), no problem in both "
          f"(drew {s.drawn}, {s.duplicates} repeats skipped)")
    print("groups (difficulty): " + ", ".join(f"{g} x{n}" for g, n in sorted(s.groups.items())))
    heldout = f"--set task.heldout_path='{s.out_dir}/test.parquet' " if s.test else ""  # none: a run without evaluation
    print(f"train on it with: --set task.name='dataset' --set task.train_path='{s.out_dir}/train.parquet' "
          f"{heldout}--set producer.reward='prl.producers.rewards:reasoning_gym'")
    return 0


def score_answers(args) -> int:
    """Score every training problem of the config's task with the model (its starting policy by
    default), bin the scores, write the groups file and say how to train with it."""
    import time

    import numpy as np
    from tqdm import tqdm

    from prl.cli import load
    from prl.tasks import train_problems
    from prl.tasks.likelihood import score_into_groups

    cfg = load(args)
    model_path = args.model or cfg.model.path
    problems = train_problems(cfg.task)
    t0 = time.perf_counter()
    with tqdm(total=len(problems), desc="problems scored", unit="problem", file=sys.stderr, dynamic_ncols=True) as bar:
        scores, bins = score_into_groups(problems, model_path, args.out, args.bins, cfg.model.dtype, cfg.sampling.temperature,
                                         progress=lambda n: bar.update(n - bar.n))
    print(f"wrote {args.out}: {len(problems)} problems scored with {model_path} in {time.perf_counter() - t0:.1f} s")
    print("groups (bin: problems, median P(answer)): " + ", ".join(
        f"{g}: {int((bins == g).sum())}, {float(np.exp(np.median(scores[bins == g]))):.2g}" for g in np.unique(bins)))
    print(f"train with it: --set scheduler.priority.prior='group' --set scheduler.priority.groups_path='{args.out}'")
    return 0
