"""The tiny built-in policy: a Llama-style causal LM with a character tokenizer.

It is saved in Hugging Face layout (config.json, model.safetensors, tokenizer.json), so
transformers and vLLM load it like any other model. ``build`` makes it from scratch:
random weights, then a short supervised warm start on the training side of the
addition task with hard problems under-represented, so that the policy solves easy
problems sometimes and hard ones rarely (room for RL to teach). Half of the warm-start
answers are written in the other digit order (most significant first): like a
pretrained model that has seen several formats, the base is unsure which one the
reward wants, and GRPO has a fast, general lesson to teach (commit to the reversed
order) on top of the slow one (get more sums right). The shipped copy under
prl/assets/tiny-adder was made by
``python -m prl.tinymodel prl/assets/tiny-adder --steps 600 --normal-share 0.5`` (45 s).
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


def sft_examples(rng: random.Random, n: int, digit_weights: list[float], normal_share: float = 0.0) -> list[list[int]]:
    """Token ids of ``n`` solved training-side problems, difficulty drawn by weight; a
    ``normal_share`` of answers is written most significant digit first (the other format)."""
    seqs = []
    while len(seqs) < n:
        d = rng.choices(range(1, len(digit_weights) + 1), digit_weights)[0]
        lo, hi = addition.operand_range(d)
        p = addition.make_problem(rng.randint(lo, hi), rng.randint(lo, hi), d)
        if addition.is_heldout(p.id):
            continue
        answer = p.answer[::-1] if rng.random() < normal_share else p.answer
        seqs.append([BOS, *encode(p.prompt), *encode(answer), EOS])
    return seqs


def encode(text: str) -> list[int]:
    return [VOCAB.index(c) for c in text]


def warm_start(model, steps: int, seed: int, digit_weights: list[float], normal_share: float = 0.0, lr: float = 1e-3, batch: int = 64):
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        seqs = sft_examples(rng, batch, digit_weights, normal_share)
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


def build(out_dir: Path, steps: int = 600, seed: int = 0, digit_weights=(0.3, 0.45, 0.2, 0.05), normal_share: float = 0.5) -> Path:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(build_config())
    warm_start(model, steps, seed, list(digit_weights), normal_share)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    build_tokenizer().save_pretrained(out_dir)
    log.info("tiny_model_built", path=str(out_dir), seconds=round(time.perf_counter() - t0, 1))
    return out_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--normal-share", type=float, default=0.5, help="share of warm-start answers in the other digit order")
    args = ap.parse_args()
    build(args.out_dir, args.steps, args.seed, normal_share=args.normal_share)


if __name__ == "__main__":
    main()
