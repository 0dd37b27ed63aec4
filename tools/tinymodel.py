"""The tiny built-in policy: a Llama-style causal LM with a character tokenizer.

It is saved in Hugging Face layout (config.json, model.safetensors, tokenizer.json), so
transformers and vLLM load it like any other model. ``build`` makes it from scratch:
random weights, then a short supervised warm start on the training side of the addition
task, stopped early on purpose, like a pretrained model that half knows the skill:

- only 1- and 2-digit sums are shown (measured: with 3- or 4-digit sums in the mix, this
  0.8M-parameter model never learns the second digit of a 2-digit sum; on 1-2 digits alone
  it learns it to 0.56 in 500 steps and 0.99 in 3,000);
- it stops after ``steps`` (default 275), mid-way through learning to carry: greedy held-out
  accuracy 0.85 / 0.48 / 0 / 0 on 1 / 2 / 3 / 4 digits, and 73% of 2-digit problems solved by
  at least one of 8 samples (measured after the held-out split became unordered, so no
  held-out problem's swapped twin is in the warm-up data: at 250 steps 0.25 / 0.10, at 285
  0.70 / 0.39, at 300 0.85 / 0.54, at 400 1.0 / 0.94; the profile is sensitive to where it stops).

So RL has a real lesson to teach (carrying on 2-digit sums) on problems of medium
difficulty, beside problems already solved (1-digit) and out of reach (3-4 digits), where
uniform sampling wastes its rollouts. The shipped copy under prl/assets/tiny-adder was
made by ``python -m tools.tinymodel prl/assets/tiny-adder`` (about 15 s on 2 cores).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import structlog

from prl.tasks import addition

VOCAB = ["<pad>", "<s>", "</s>", *"0123456789", "+", "=", "<unk>"]
PAD, BOS, EOS = 0, 1, 2
ASSET_DIR = Path(__file__).parent / "assets" / "tiny-adder"

log = structlog.get_logger("tinymodel")


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def build_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,  # vLLM's CPU attention needs 64 (16 is unsupported)
        max_position_embeddings=64,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=True,
    )


def sft_examples(rng: random.Random, n: int, digit_weights: list[float]) -> list[list[int]]:
    """Token ids of ``n`` solved training-side problems, difficulty drawn by weight."""
    seqs = []
    while len(seqs) < n:
        d = rng.choices(range(1, len(digit_weights) + 1), digit_weights)[0]
        lo, hi = addition.operand_range(d)
        p = addition.make_problem(rng.randint(lo, hi), rng.randint(lo, hi), d)
        if addition.is_heldout(p.id):
            continue
        seqs.append([BOS, *encode(p.prompt), *encode(p.answer), EOS])
    return seqs


def encode(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


def warm_start(model, steps: int, seed: int, digit_weights: list[float], lr: float = 1e-3, batch: int = 64,
               warmup: int = 100):
    """Supervised steps on the answers (not the prompts); lr rises linearly for ``warmup``
    steps, then stays constant (the base is stopped mid-way, not annealed)."""
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    model.train()
    for step in range(steps):
        seqs = sft_examples(rng, batch, digit_weights)
        width = max(map(len, seqs))
        ids = torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])
        labels = ids.clone()
        labels[ids == PAD] = -100
        for row, s in enumerate(seqs):  # learn the answer only, not the prompt
            labels[row, : s.index(VOCAB.index("=")) + 1] = -100
        loss = model(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 100 == 0:
            log.info("warm_start", step=step, loss=round(loss.item(), 4))
    model.eval()


def build(out_dir: Path, steps: int = 275, seed: int = 0, digit_weights=(0.3, 0.7)) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(build_config())
    warm_start(model, steps, seed, list(digit_weights))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    build_tokenizer().save_pretrained(out_dir)
    log.info("tiny_model_built", path=str(out_dir), seconds=round(time.perf_counter() - t0, 1))
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--steps", type=int, default=275, help="warm-start steps (stopped early on purpose)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    build(args.out_dir, args.steps, args.seed)


if __name__ == "__main__":
    main()
