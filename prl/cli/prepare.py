"""`prl model import`, `prl model export`, `prl data reasoning-gym` and `prl data guess-number`:
a model, data to train it on, and the trained model out of a run."""

from __future__ import annotations

import json


def command(args) -> int:
    if args.command == "model":
        return export_model(args) if args.action == "export" else import_model(args)
    return make_guesses(args) if args.action == "guess-number" else make_data(args)


def export_model(args) -> int:
    from prl.cli import stored_config
    from prl.errors import UsageError
    from prl.model_export import export_model as export

    stored = stored_config(args.run_dir) or {}
    model = args.model or stored.get("model", {}).get("path")
    if model is None:
        raise UsageError(f"{args.run_dir} keeps no config.toml naming its model: give --model, the model the run started from")
    dtype = args.dtype or stored.get("model", {}).get("dtype", "bfloat16")
    s = export(args.run_dir, args.out_dir, model, args.version, dtype, merge_lora=args.lora == "merged")
    what = "a peft adapter directory" if s.adapter else f"{s.tensors} tensors"
    print(f"wrote {s.out}: version {s.version} from the {s.source}, verified, {what} in {s.dtype} ({s.seconds:.1f} s)")
    print(f"load it with: AutoModelForCausalLM.from_pretrained({json.dumps(s.out)}), or vllm serve {s.out}"
          if not s.adapter else f"serve it on {model} with vLLM's --enable-lora, or peft's PeftModel.from_pretrained")
    return 0


def import_model(args) -> int:
    from prl.model_import import import_gguf

    s = import_gguf(args.source, args.out_dir)
    print(f"wrote {s.out_dir}: {s.parameters / 1e6:.1f}M parameters, {s.layers} layers, vocabulary {s.vocab_size:,}, "
          f"chat template {'yes' if s.chat_template else 'no'} ({s.seconds:.0f} s)")
    print(f"note: the {s.quantization} weights were dequantized to float32; the model is as good as the quantized "
          f"file, not the original release")
    print(f"use it with: --set model.path={json.dumps(s.out_dir)}")
    return 0


def make_guesses(args) -> int:
    from prl.tasks.guess import write_dataset

    train, test = write_dataset(args.train, args.test, args.seed, args.out)
    print(f"wrote {args.out}/train.parquet ({train} problems) and test.parquet ({test}), no problem in both")
    print(f"train on it with: --set task.train_path='{args.out}/train.parquet' --set task.heldout_path='{args.out}/"
          "test.parquet' --set task.environment='prl.environments:GuessNumber'")
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
    print("difficulty column: " + ", ".join(f"{g} x{n}" for g, n in sorted(s.groups.items())))
    heldout = f"--set task.heldout_path='{s.out_dir}/test.parquet' " if s.test else ""  # none: a run without evaluation
    print(f"train on it with: --set task.train_path='{s.out_dir}/train.parquet' "
          f"{heldout}--set producer.reward='prl.rewards:reasoning_gym'")
    return 0
