"""The typed configuration of a run: one root model, a section per service.

Loaded from a TOML file plus dotted overrides (``--set learner.lr=1e-5``), validated once at
start; a bad field raises :class:`ConfigError` naming the field and the reason. Each field has a
one-line description; ``python -m prl.cli.docs`` writes them into docs/configuration.md.
Defaults are the single-machine run: the tiny built-in model on the addition task.

Only what a user sets lives here. Constants of the method (seed papers' values nobody tunes
per run) are named in the module that uses them.
"""

from __future__ import annotations

import copy
import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

BUILTIN_STRATEGIES = ("uniform", "dapo_filter", "priority")
PLUGIN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # module:attribute


class ConfigError(ValueError):
    """Configuration that cannot run; the message names each bad field and why."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class RunConfig(Section):
    name: str = Field("prl", pattern=r"^[A-Za-z0-9._-]+$", description="Run name; prefixes every topic (<name>.rollouts).")
    run_dir: str = Field("runs/prl", description="Checkpoints, metrics, archive and plots: a path or fsspec URI (s3://...).")
    seed: int = Field(0, description="Seed of every random choice of the run.")
    log_format: Literal["console", "json"] = Field("console", description="Log lines for people (console) or machines (json).")
    threads: int = Field(0, ge=0, description="torch threads of each process (0: torch's default).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where learner and producers compute; auto: the local CUDA GPU where torch sees one (cuda:LOCAL_RANK), else the CPU.")
    trackers: list[Literal["tensorboard", "wandb"]] = Field([], description="Also send metrics to TensorBoard and/or Weights & Biases.")


class KafkaConfig(Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Comma-separated host:port list of brokers.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field("PLAINTEXT", description="Kafka security protocol.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(None, description="SASL mechanism (user and password from PRL_KAFKA_USERNAME / PRL_KAFKA_PASSWORD).")
    ssl_cafile: str | None = Field(None, description="CA bundle for SSL (a private cluster's CA).")
    max_message_bytes: int = Field(8 << 20, ge=1024, description="Largest message produced, fetched and allowed per topic.")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Consumer-group session timeout; a group join takes about half of it.")
    max_poll_interval_ms: int = Field(300_000, ge=10_000, description="Longest gap between a group member's polls before it loses its partitions: above the slowest learner step.")
    leave_group_on_close: bool = Field(True, description="A cleanly stopped member leaves its group at once (false for tansu 0.6).")
    partitions: int = Field(4, ge=1, le=10_000, description="Partitions of the problems and rollouts topics: at most one busy producer each.")
    replication_factor: int = Field(1, ge=1, description="Replication factor of the topics created at start.")


class TransportConfig(Section):
    kafka: KafkaConfig = KafkaConfig()
    signed_kinds: list[Literal["problems", "rollouts", "batches", "policy"]] = Field([], description="Topic kinds signed with HMAC-SHA256 (keys from PRL_KEY_<KIND>).")


class TaskConfig(Section):
    train_path: str | None = Field(None, description="Training problems, Parquet or JSONL, path or URI (none: the built-in addition task).")
    heldout_path: str | None = Field(None, description="Held-out problems for evaluation (none with a dataset: no evaluation).")
    group_field: str | None = Field(None, description="Column whose values group problems for the priority's shared prior (none: one group, no label).")
    success_threshold: float = Field(1.0, description="A completion counts as solved when its reward is at least this (success rates, retest pools).")
    environment: str | None = Field(None, description="Episodes of this environment per problem, module:Class or skyrl:<id> (none: one completion per prompt).")

    @field_validator("environment")
    @classmethod
    def _environment_spec(cls, value: str | None) -> str | None:
        if value is not None and not (PLUGIN.match(value) or re.fullmatch(r"skyrl:[\w.-]+", value)):
            raise ValueError(f"{value!r} is neither module:Class nor skyrl:<environment id>")
        return value


class ModelConfig(Section):
    path: str = Field("builtin:tiny-adder", description="Hugging Face model directory (path or URI), or builtin:tiny-adder.")
    dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="Dtype of the weights producers serve and versions carry (the learner keeps float32).")


class SamplingConfig(Section):
    group_size: int = Field(8, ge=2, description="Completions per problem (G).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; the learner scores log-probs at the same temperature.")
    max_tokens: int = Field(8, ge=1, description="Longest completion, in tokens.")


class PriorityConfig(Section):
    pseudo_count: float = Field(2.0, gt=0, description="Weight, in attempts, of a problem's group rate in its Beta prior.")
    retest_interval: int = Field(10, ge=0, description="Learner versions between retests of always-solved / never-solved problems (0: never).")


class ReplayConfig(Section):
    ratio: float = Field(0.5, ge=0, le=4, description="Replayed rollouts per fresh rollout in a batch (0: no replay).")
    warmup_updates: int = Field(20, ge=0, description="No replay before this learner version.")


class SchedulerConfig(Section):
    strategy: str = Field("priority", description="Problem choice: uniform, dapo_filter, priority, or module:Factory.")
    priority: PriorityConfig = PriorityConfig()
    replay: ReplayConfig = ReplayConfig()
    groups_per_batch: int = Field(16, ge=1, description="Returned rollout groups per training batch (before filters).")
    max_in_flight: int = Field(32, ge=1, description="Dispatched groups not yet answered, at most.")
    dispatch_timeout_s: float = Field(120.0, gt=0, description="An unanswered dispatch is issued again after this long.")
    tau_max: int = Field(10, ge=0, description="Rollouts more than tau_max policy versions old are never trained on.")
    max_batches_ahead: int = Field(2, ge=1, description="Batches published but not yet trained, at most.")
    claim_check: bool = Field(False, description="Batches name the rollout messages instead of copying them (fewer broker bytes).")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        if value not in BUILTIN_STRATEGIES and not PLUGIN.match(value):
            raise ValueError(f"{value!r} is neither one of {', '.join(BUILTIN_STRATEGIES)} nor module:Factory")
        return value


class VLLMConfig(Section):
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM engine spans (tensor parallelism); 1: one producer per GPU.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Share of the GPU's memory the engine takes (none: 0.9 on a producer's own GPU, 0.3 beside the learner in prl run).")
    max_model_len: int | None = Field(None, ge=16, description="Longest prompt + completion the engine accepts (none: the model's own context).")
    enforce_eager: bool = Field(False, description="No CUDA graphs (saves their memory and start-up time, slower decoding); CPUs always run eager.")


class ProducerConfig(Section):
    backend: Literal["auto", "transformers", "vllm"] = Field("auto", description="Generation engine; auto: vLLM where installed and on a GPU or for a model of >= 100 MB of weights, else transformers.")
    reward: str = Field("prl.tasks.addition:exact_match", pattern=PLUGIN.pattern, description="Reward function, module:function(completion, answer) -> float.")
    reward_workers: int = Field(8, ge=1, le=256, description="Reward calls and environment steps at once, on threads (for a judge model, a sandbox, a tool); 1: not thread-safe.")
    max_dispatches_per_call: int = Field(16, ge=1, description="Dispatches batched into one generation call.")
    drop_zero_signal_completions: bool = Field(False, description="Send a group whose rewards are all equal as its rewards only (fewer broker bytes).")
    vllm: VLLMConfig = VLLMConfig()


class LearnerConfig(Section):
    lr: float = Field(3e-5, gt=0, lt=1, description="AdamW learning rate.")
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO ratio lower clip: 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio upper clip: 1 + clip_high.")
    max_steps: int = Field(200, ge=1, description="Stop after this many optimizer steps.")
    checkpoint_every: int = Field(10, ge=1, description="Write a checkpoint (weights, optimizer, offsets) every N steps; versions go out every step.")
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps, and at the last (0: never).")
    micro_batch_tokens: int = Field(16_384, ge=1, description="Padded tokens per micro-batch; gradients accumulate over them.")
    bf16_autocast: bool | Literal["auto"] = Field(False, description="bf16 autocast in training; auto: where the device computes bf16 natively.")
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward (saves memory).")
    lora_rank: int = Field(0, ge=0, le=1024, description="Train a LoRA adapter of this rank on every linear layer (0: all weights); versions carry it alone.")


class Config(Section):
    run: RunConfig = RunConfig()
    transport: TransportConfig = TransportConfig()
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    sampling: SamplingConfig = SamplingConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    producer: ProducerConfig = ProducerConfig()
    learner: LearnerConfig = LearnerConfig()

    @model_validator(mode="after")
    def _cross_field(self) -> "Config":
        if not self.task.train_path and (self.task.heldout_path or self.task.group_field not in (None, "difficulty")):
            raise ValueError("the built-in task (no task.train_path) has its own held-out set and one label, "
                             "task.group_field = 'difficulty' (the digit count); set task.train_path for a dataset")
        if self.producer.drop_zero_signal_completions and self.scheduler.strategy == "uniform":
            raise ValueError("producer.drop_zero_signal_completions needs a strategy that does not train groups without "
                             "a signal (uniform trains them): use dapo_filter or priority, or leave it false")
        if self.scheduler.max_in_flight < self.scheduler.groups_per_batch:
            raise ValueError("scheduler.max_in_flight must be >= scheduler.groups_per_batch, or no batch can fill")
        kafka = self.transport.kafka
        if kafka.security_protocol.startswith("SASL") and kafka.sasl_mechanism is None:
            raise ValueError("transport.kafka.sasl_mechanism is required when security_protocol uses SASL")
        return self


def settings(model: type[BaseModel] = Config, prefix: str = ""):
    """(dotted name, field) of every setting, sections flattened: what a user can set."""
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from settings(field.annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def likely_setting(name: str) -> str | None:
    """The setting (or section) a misplaced or misspelt ``name`` most likely means: one of the
    same name in another section, else the closest spelling; None if nothing is close."""
    full = [n for n, _ in settings()]
    names = sorted({".".join(n.split(".")[:i]) for n in full for i in range(1, n.count(".") + 2)})
    leaf = name.rsplit(".", 1)[-1]
    same_leaf = [n for n in names if n.rsplit(".", 1)[-1] == leaf]
    close = difflib.get_close_matches(name, [n for n in names if n.count(".") == name.count(".")], n=1, cutoff=0.8)
    return same_leaf[0] if len(same_leaf) == 1 else (close[0] if close else None)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value); value is read as TOML, else as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def load_config(path: str | Path | None = None, overrides: list[str] = (), base: dict | None = None) -> Config:
    """Read TOML (if given; else start from ``base``, a config read already), apply dotted
    overrides, validate; raise ConfigError on any fault."""
    data: dict[str, Any] = copy.deepcopy(base) if base else {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k} is not a section")
        node[keys[-1]] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc)) from None


def format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            meant = likely_setting(where)
            msg = f"not a setting ({f'did you mean {meant}? ' if meant else ''}docs/configuration.md lists them)"
        lines.append(f"{where}: {msg}" if where else msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def dump_toml(cfg: Config) -> str:
    """The config as TOML text (what a ConfigMap or a run directory stores)."""
    import tomli_w

    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
