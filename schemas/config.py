"""The typed configuration of a run: one root model, a section per service.

Loaded from a TOML file plus dotted overrides (``--set learner.lr=1e-5``), validated
once at start; a bad field raises :class:`ConfigError` naming the field and the reason.
Every field documents itself (``prl config --help`` style docs are generated from these
descriptions into README.md). Defaults are the embedded single-machine run: the tiny
built-in model on the addition task, all services in one process.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """Configuration that cannot run; the message names each bad field and why."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class RunConfig(Section):
    name: str = Field("prl", pattern=r"^[A-Za-z0-9._-]+$", description="Run name; prefixes every topic (<name>.rollouts).")
    run_dir: str = Field("runs/prl", description="Where checkpoints, metrics.jsonl and plots go: a path or fsspec URI (file://, s3://).")
    seed: int = Field(0, description="Seed for every random choice of the run.")
    log_format: Literal["console", "json"] = Field("console", description="Log lines for people (console) or machines (json).")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Lowest log level printed.")
    http_port: int = Field(0, ge=0, le=65535, description="Port of /health and /metrics for a service started alone (0: none).")
    trackers: list[Literal["tensorboard", "wandb"]] = Field([], description="Also send metrics (and a sample of rollouts as a table) to TensorBoard and/or Weights & Biases (offline unless WANDB_API_KEY is set); files under the run directory.")
    wandb_project: str = Field("prl", description="Weights & Biases project.")
    tracker_table_every: int = Field(50, ge=1, description="A table of sampled rollouts goes to the trackers every N batches.")
    finish_with_learner: bool = Field(True, description="Scheduler and producers finish when the learner has reached learner.max_steps (false: they keep serving).")
    http_host: str = Field("127.0.0.1", description="Address /health and /metrics bind to: loopback by default; 0.0.0.0 in a pod (the k8s manifests set it; NetworkPolicies limit who reaches it).")


class KafkaConfig(Section):
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Comma-separated host:port list of brokers.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field("PLAINTEXT", description="Kafka security protocol.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(None, description="SASL mechanism when security_protocol uses SASL.")
    sasl_username_env: str = Field("PRL_KAFKA_USERNAME", description="Environment variable holding the SASL user name (never put secrets in the file).")
    sasl_password_env: str = Field("PRL_KAFKA_PASSWORD", description="Environment variable holding the SASL password.")
    ssl_cafile: str | None = Field(None, description="CA bundle for SSL.")
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest message produced, fetched and allowed per topic.")
    compression: Literal["none", "zstd", "lz4", "gzip", "snappy"] = Field("zstd", description="Producer compression.")
    fetch_max_wait_ms: int = Field(500, ge=1, le=10_000, description="Longest a fetch waits at the broker for new messages (Kafka's fetch.max.wait.ms). Kafka answers as soon as a message arrives, so the default costs no latency there; tansu 0.6 (the tests' broker) holds each fetch for most of this wait, which is then most of every hop's latency (measured: publish -> consume p99 250 ms at 500, 54 ms at 100, 8 ms at 20). Lower means more empty fetches from idle consumers.")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Consumer group session timeout; group joins take about half of it.")
    leave_group_on_close: bool = Field(True, description="A group member that stops cleanly leaves its group at once, so its partitions move to the others without delay; false: the broker notices when its session times out (session_timeout_ms later). Set false on tansu 0.6 (the tests' broker): it keeps a member that leaves during a rebalance as the group's leader for good, and no member that joins later is given partitions.")
    create_topics: bool = Field(True, description="Create missing topics at start with the partitions and settings in schemas/topics.py.")
    replication_factor: int = Field(1, ge=1, description="Replication factor of topics created at start.")
    problem_partitions: int = Field(4, ge=1, le=10_000, description="Partitions of the problems and rollouts topics created at start: at most one producer per problems partition gets dispatches, so this bounds the producers that can work (README, Running at scale).")


class TransportConfig(Section):
    type: Literal["memory", "kafka"] = Field("memory", description="memory: in-process (prl run, tests); kafka: separate services.")
    kafka: KafkaConfig = KafkaConfig()
    signed_kinds: list[Literal["problems", "rollouts", "batches", "policy"]] = Field(
        [], description="Topic kinds whose messages carry an HMAC-SHA256 signature; unsigned or badly signed ones are dead-lettered (the k8s manifests sign policy and batches).")
    key_env_prefix: str = Field("PRL_KEY_", pattern=r"^[A-Z_][A-Z0-9_]*$", description="Signing keys come from environment variables <prefix><KIND> (PRL_KEY_POLICY, ...), never from the file.")


class TaskConfig(Section):
    name: Literal["addition", "dataset"] = Field("addition", description="addition (built-in) or dataset (files at task.train_path).")
    train_path: str | None = Field(None, description="Training problems (task.name = dataset): Parquet or JSONL, path or fsspec URI.")
    heldout_path: str | None = Field(None, description="Held-out problems for evaluation (task.name = dataset); none: no evaluation.")
    group_field: str = Field("difficulty", description="Dataset column whose value groups problems for the shared prior.")
    train_per_digit: list[int] = Field([80, 600, 600, 600], min_length=1, max_length=6, description="Training-pool problems per difficulty (digits 1, 2, ...).")
    heldout_per_digit: int = Field(300, ge=1, description="Held-out evaluation problems per difficulty (disjoint from training).")
    seed: int = Field(0, description="Seed of the training pool.")


class ModelConfig(Section):
    path: str = Field("builtin:tiny-adder", description="Hugging Face model directory (path or fsspec URI), or builtin:tiny-adder.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weights dtype for generation and training.")


class SamplingConfig(Section):
    group_size: int = Field(8, ge=2, description="Completions per problem (G).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; the learner scores log-probs at the same temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(8, ge=1, description="Largest completion length in tokens.")


class PriorityConfig(Section):
    """Problem priority p(1-p) (strategy success_variance); see scheduler/priority.py."""

    prior: Literal["flat", "group", "pooled"] = Field("group", description="Beta prior of an unseen problem: flat Beta(alpha, beta); its group's rate (the task's group_field, e.g. difficulty); or pooled: the whole pool's rate, one group, so no label is needed (empirical Bayes: an unseen problem is expected to do as the pool's problems did on their first visit, not at p = 1/2).")
    alpha: float = Field(1.0, gt=0, description="Flat prior successes.")
    beta: float = Field(1.0, gt=0, description="Flat prior failures.")
    pseudo_count: float = Field(2.0, gt=0, description="Weight, in attempts, of the group's (or pool's) rate (prior = group or pooled).")
    group_start_weight: float = Field(2.0, gt=0, description="Weight, in attempts, of a group's starting rate (1/2, or the score_start rate) before its first visits: 2 is Beta(1, 1) at 1/2, under which a group whose first visits all fail weighs about 1/k after k of them (pass@G); smaller is a U-shaped prior over groups (0.2: Beta(0.1, 0.1)), for tasks whose groups are mostly solved always or never, so a dead group is set aside after a visit or two.")
    half_life_versions: float = Field(0.0, ge=0, description="Exponential decay of old outcomes, in policy versions (0: none); applied when priorities are read, so a problem without new results drifts back to its prior.")
    weight: Literal["variance", "signal", "solvable"] = Field("variance", description="A problem's priority from its success estimate p: variance, p(1-p) (seed A's, largest at p = 1/2); signal, 1 - p^G - (1-p)^G, the chance that its next group of G completions is neither all solved nor all failed, about equal over most of (0, 1) (nearly-solved problems go on being trained); solvable, 1 - (1-p)^G (pass@G), the chance that the group solves it at least once: only never-solved problems are set aside, solved ones go on being drawn as often as medium ones (what uniform choice over the learnable problems does).")
    solvable_groups: int = Field(1, ge=1, le=1000, description="weight = solvable: over how many groups, n, a problem counts as solvable, 1 - (1-p)^(n G) (pass@nG, the chance that its next n groups solve it at least once). 1: pass@G, which still weighs a problem solved 1 time in 10 about half as much as one solved every other time; larger n weighs every problem that may be solved within the run alike and leaves the never-solved set aside (uniform choice over the learnable problems).")
    mode: Literal["greedy", "gumbel", "periodic"] = Field("gumbel", description="greedy: highest priority first; gumbel: each pick in proportion to priority among the problems choosable then (exponential clocks); periodic: in proportion to priority too, but each tried problem at evenly spaced times (a clock that rings once per period 1/priority; equal priorities give shuffled passes over the pool, as a data loader's epochs; not with half_life_versions).")
    unseen_clock: Literal["exponential", "periodic"] = Field("exponential", description="How never-tried problems come up: exponential, a group's m never-tried problems share one clock of rate m w (each pick in proportion to priority; in periodic mode a pool of equal weights is then first tried as independent draws try it: after a pass's worth of picks about a third is untried while problems tried first come back); periodic (needs mode = 'periodic'), each is due once within one period 1/w of its group's never-tried weight, at a uniform time, the window stretched or shrunk when w moves, so a pool of equal weights is tried nearly once over before problems tried first come back, as in a data loader's first epoch, and a group whose weight falls has its first looks spread over its longer period.")
    shuffle_groups: bool = Field(False, description="A control for the group prior: the task's group labels permuted across problems (same group sizes, no information).")
    groups_path: str | None = Field(None, description="A file of (id, group) rows whose groups replace the task's labels for the group prior, e.g. the answer-likelihood bins `prl data likelihood` writes: groups without a difficulty label. Needs prior = 'group'.")
    score_start: bool = Field(True, description="With a groups_path file that has scores (`prl data likelihood`): each group's rate starts at its problems' mean exp(answer_logprob), the starting model's own chance of sampling the reference answer, instead of 1/2, and learns from first visits as before. Right when a completion is the bare answer (the built-in task); when the model writes working first the score underestimates every group (set false).")
    retest: bool = Field(True, description="Move always-solved / always-failed problems to retest pools.")
    retest_after: int = Field(1, ge=1, le=100, description="Consecutive all-solved (all-failed) groups that move a problem to a pool, counted in completions (retest_after x sampling.group_size), so a screen (scheduler.screen_size) counts as its share of a group.")
    retest_interval: int = Field(10, ge=1, description="Learner versions between retest rounds.")
    retest_share: float = Field(0.1, gt=0, le=1, description="Share of each pool queued for retest per retest round (longest-untested first).")
    retest_cap: float = Field(0.2, ge=0, le=1, description="Retests take at most this share of all dispatches (more only when nothing else is choosable).")
    unseen_share: float = Field(0.1, ge=0, le=1, description="At least this share of dispatches goes to never-tried problems while any remain, round-robin over groups (no problem starves).")

    @model_validator(mode="after")
    def _settings_that_act_together(self) -> "PriorityConfig":
        if self.mode == "periodic" and self.half_life_versions > 0:
            raise ValueError("mode = 'periodic' cannot take half_life_versions > 0: decay resets "
                             "every clock at each version, which would restart a periodic clock's period and put its "
                             "problem off; use mode = 'gumbel' with decay (its clocks do not remember), or no decay")
        if self.unseen_clock == "periodic" and self.mode != "periodic":
            raise ValueError(f"unseen_clock = 'periodic' acts only with mode = 'periodic' (mode is {self.mode!r}): "
                             f"set mode = 'periodic' or leave unseen_clock at 'exponential'")
        if self.solvable_groups != 1 and self.weight != "solvable":
            raise ValueError(f"solvable_groups = {self.solvable_groups} acts only with weight = 'solvable' "
                             f"(weight is {self.weight!r}); set weight = 'solvable' or leave solvable_groups at 1")
        return self


class ReplayConfig(Section):
    """Rollout-level advantage-prioritized replay (scheduler/replay.py); defaults are those a public
    reimplementation of the paper reports (the design reference), not tuned here."""

    enabled: bool = Field(True, description="Add replayed rollouts to every batch after the warm-up.")
    ratio: float = Field(0.5, ge=0, le=4, description="Replayed rollouts per fresh rollout in a batch (r).")
    alpha: float = Field(0.5, ge=0, description="Draw probability proportional to (|A| + eps)^alpha.")
    eps: float = Field(1e-6, gt=0, description="Priority floor added to |A|.")
    warmup_updates: int = Field(20, ge=0, description="No replay before this learner version.")
    capacity: int = Field(30_000, ge=1, description="Buffer size; the oldest rollout is overwritten when full.")


class SchedulerConfig(Section):
    strategy: Literal["uniform", "dapo_filter", "success_variance"] = Field(
        "success_variance", description="uniform; dapo_filter (uniform, zero-signal groups not trained on); success_variance (p(1-p) priority).")
    uniform_passes: bool = Field(False, description="uniform and dapo_filter: draw the pool in shuffled passes, each problem once per pass (a data loader's epochs), instead of each draw independently.")
    uniform_drop_unsolved: bool = Field(False, description="uniform and dapo_filter: a problem never solved in its first sampling.group_size completions (a whole group) is not drawn again (a dead-problem filter without a label; one solved completion, ever, keeps a problem in; when every problem is dropped, the drops are forgiven).")
    priority: PriorityConfig = PriorityConfig()
    replay: ReplayConfig = ReplayConfig()
    max_batch_tokens: int = Field(200_000, ge=1, description="Token budget of one TrainBatch (keeps a message under the broker limit).")
    groups_per_batch: int = Field(16, ge=1, description="Returned rollout groups that make one training batch: what survives the zero-variance filter and tau_max out of this many (with dynamic_sampling: this many groups that carry a signal).")
    max_in_flight: int = Field(32, ge=1, description="Dispatched groups not yet answered, at most.")
    dispatch_timeout_s: float = Field(120.0, gt=0, description="An unanswered dispatch is issued again after this long.")
    filter_zero_variance: bool | None = Field(None, description="Drop groups whose rewards are all equal; unset: off for uniform, on otherwise.")
    dynamic_sampling: bool | None = Field(None, description="Generate until groups_per_batch groups with a signal fill a batch (DAPO dynamic sampling: full batches, more generation per step); unset: on for dapo_filter, off otherwise.")
    screen_size: int = Field(0, ge=0, description="Screening (SPEED-RL's screen-then-complete): each dispatch first asks for this many completions (0: off, else 2 to sampling.group_size - 1). A screen whose rewards differ is completed by a second dispatch of the rest, and the two train as one group of sampling.group_size; a screen whose rewards are all equal is only counted in the problem's statistics. A look at a problem that teaches nothing costs screen_size completions, not a whole group. Needs the zero-variance filter; not with claim_check (a completed group spans two messages) or producer.drop_zero_signal_completions (a rest trains whatever its own rewards).")
    advantage_std: bool = Field(True, description="Divide each group's advantages by the group's reward std (GRPO: every group with a signal weighs alike); false: A_i = r_i - mean(r) (Dr. GRPO, arXiv 2503.20783: a group weighs by its reward spread, most at half solved).")
    tau_max: int = Field(10, ge=0, description="Rollouts more than tau_max policy versions old are never trained on.")
    max_batches_ahead: int = Field(2, ge=1, description="Batches published but not yet trained, at most.")
    claim_check: bool = Field(False, description="Batches reference the rollout group messages (topic, partition, offset) instead of copying the tokens; the learner fetches them (fewer broker bytes; the rollouts topic's retention must cover the replay window).")
    archive: bool = Field(True, description="Write every accepted rollout group to Parquet under <run_dir>/archive (scheduler/archive.py documents the schema).")
    archive_max_rows: int = Field(10_000, ge=1, description="Rollout groups per archive file, at most.")
    snapshot_every: int = Field(1, ge=0, description="Snapshot state to <run_dir>/scheduler every N batches (0: never). 1 makes restarts exact; with N > 1 a restart recomposes up to N-1 batches and the learner drops the rollouts it already trained.")

    @model_validator(mode="after")
    def _uniform_only(self) -> "SchedulerConfig":
        if self.uniform_drop_unsolved and self.strategy == "success_variance":
            raise ValueError("uniform_drop_unsolved acts only with strategy uniform or dapo_filter (the priority sampler "
                             "weighs a failed group itself); set one of them")
        return self


class ProducerConfig(Section):
    producer_id: str = Field("producer-0", description="Name in rollouts and logs; pods use their hostname.")
    backend: Literal["auto", "transformers", "vllm"] = Field("auto", description="Generation engine; auto: vLLM when importable and a GPU is present, else transformers.")
    reward: str = Field("prl.tasks.addition:exact_match", description="Reward function as module:function(completion, answer) -> float; built in: prl.tasks.addition:exact_match, prl.producers.rewards:math_verify, prl.producers.rewards:reasoning_gym.")
    reward_modules: list[str] = Field(["prl.tasks.addition", "prl.rewards", "prl.producers.rewards"], description="Modules producer.reward may name (a config names code to run: add your own reward's module here explicitly).")
    reward_timeout_s: float = Field(5.0, gt=0, description="A reward call running longer counts as 0.0 (and is counted).")
    max_dispatches_per_call: int = Field(16, ge=1, description="Dispatches batched into one generation call.")
    linger_ms: int = Field(50, ge=0, description="After the first dispatch arrives, wait up to this long for more to fill the generation call.")
    threads: int = Field(0, ge=0, description="torch threads (0: leave torch's default).")
    drop_zero_signal_completions: bool = Field(False, description="Publish a group whose rewards are all equal as its rewards and finish reasons only (no token ids, log-probs or text). With the zero-variance filter the scheduler never trains such a group and reads only its rewards, for its statistics; most generated groups are such groups, so this removes most of the broker's bytes (README, Running at scale). Needs the zero-variance filter; the rollout archive then keeps only those groups' rewards.")


class LearnerConfig(Section):
    lr: float = Field(3e-5, gt=0, lt=1, description="AdamW learning rate (3e-5 suits the tiny model; 1e-4 learns faster but unstably; the papers use 1e-6 at 1.7-8B).")
    lr_decay_steps: int = Field(0, ge=0, description="Anneal the learning rate linearly, as PPO does: from lr at learner version 0 to lr x lr_final_ratio at this version, held there after (0: a constant lr). It follows the version, so a resumed run goes on where it stopped.")
    lr_final_ratio: float = Field(0.0, ge=0, le=1, description="Where the annealed learning rate ends, as a share of lr (with lr_decay_steps).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO ratio lower clip: 1 - clip_low.")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio upper clip: 1 + clip_high.")
    dual_clip: float = Field(10.0, gt=1, description="Dual-clip bound c for negative advantages.")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer steps on each batch (GRPO's mu): every step after the first reuses the batch, its ratios clipped against the behaviour log-probs.")
    checkpoint_every: int = Field(1, ge=1, description="Write a checkpoint (and let producers reload) every N steps.")
    keep_checkpoints: int = Field(3, ge=1, description="Checkpoints kept; older ones are deleted after a newer one is complete.")
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps (0: never).")
    eval_every_rollouts: int = Field(0, ge=0, description="Held-out evaluation every time this many more rollouts have been generated, instead of every eval_every steps (0: by steps). Compares strategies at the same generation cost.")
    max_steps: int = Field(200, ge=1, description="Stop after this many optimizer steps.")
    threads: int = Field(0, ge=0, description="torch threads (0: leave torch's default).")
    micro_batch_tokens: int = Field(16_384, ge=1, description="Padded tokens per micro-batch; gradients accumulate over micro-batches.")
    bf16_autocast: bool | Literal["auto"] = Field(False, description="Run forward and backward under bfloat16 autocast: true, false, or \"auto\": on only where the device computes bf16 natively (a CUDA GPU that supports it, a CPU with AVX512-BF16 or AMX); a CPU with AVX2 alone emulates it, 16x slower than fp32 (measured).")
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward (saves memory).")
    fetch_cache_mb: int = Field(256, ge=0, description="Claim-check batches: keep up to this many MB of the rollout groups fetched for them, so a replayed rollout is not fetched from the broker again (groups older than scheduler.tau_max leave first; 0: fetch every time).")
    batches_from: str | None = Field(None, description="Train from a file of TrainBatch records (path or fsspec URI) instead of the batch topic.")

    @model_validator(mode="after")
    def _settings_that_act_together(self) -> "LearnerConfig":
        if self.lr_final_ratio != 0 and self.lr_decay_steps == 0:
            raise ValueError(f"lr_final_ratio = {self.lr_final_ratio} acts only with lr_decay_steps > 0 (the rate is "
                             "constant without it); set lr_decay_steps or leave lr_final_ratio at 0")
        return self


class Config(Section):
    run: RunConfig = RunConfig()
    transport: TransportConfig = TransportConfig()
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    sampling: SamplingConfig = SamplingConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    producer: ProducerConfig = ProducerConfig()
    learner: LearnerConfig = LearnerConfig()

    @property
    def filters_zero_variance(self) -> bool:
        s = self.scheduler
        return s.strategy != "uniform" if s.filter_zero_variance is None else s.filter_zero_variance

    @property
    def dynamic_sampling(self) -> bool:
        s = self.scheduler
        return s.strategy == "dapo_filter" if s.dynamic_sampling is None else s.dynamic_sampling

    @model_validator(mode="after")
    def _cross_field(self) -> "Config":
        if self.task.name == "dataset" and not self.task.train_path:
            raise ValueError("task.train_path is required when task.name = 'dataset'")
        if self.scheduler.strategy == "dapo_filter" and self.scheduler.filter_zero_variance is False:
            raise ValueError("scheduler.filter_zero_variance cannot be false with strategy dapo_filter")
        if self.scheduler.dynamic_sampling and not self.filters_zero_variance:
            raise ValueError("scheduler.dynamic_sampling needs the zero-variance filter (scheduler.filter_zero_variance)")
        if self.producer.drop_zero_signal_completions and not self.filters_zero_variance:
            raise ValueError("producer.drop_zero_signal_completions needs the zero-variance filter "
                             "(scheduler.filter_zero_variance), or the scheduler would train groups without completions")
        if self.scheduler.priority.groups_path and self.scheduler.priority.prior != "group":
            raise ValueError("scheduler.priority.groups_path needs scheduler.priority.prior = 'group' (the groups are "
                             "the group prior's)")
        screen = self.scheduler.screen_size
        if screen and not 2 <= screen < self.sampling.group_size:
            raise ValueError(f"scheduler.screen_size must be 0 (off) or 2 to sampling.group_size - 1 "
                             f"({self.sampling.group_size - 1}): one completion cannot show a signal, and a screen of the whole "
                             "group is no screen")
        if screen and not self.filters_zero_variance:
            raise ValueError("scheduler.screen_size needs the zero-variance filter (scheduler.filter_zero_variance): "
                             "a screen whose rewards are all equal is never trained")
        if screen and self.producer.drop_zero_signal_completions:
            raise ValueError("scheduler.screen_size does not work with producer.drop_zero_signal_completions: a rest "
                             "whose own rewards are equal would be sent without completions, though it trains with "
                             "its screen; set one of them off")
        if screen and self.scheduler.claim_check:
            raise ValueError("scheduler.screen_size does not work with scheduler.claim_check: a completed group "
                             "spans two messages; set one of them off")
        if self.scheduler.max_in_flight < self.scheduler.groups_per_batch:
            raise ValueError("scheduler.max_in_flight must be >= scheduler.groups_per_batch, or no batch can fill")
        module = self.producer.reward.partition(":")[0]
        if module not in self.producer.reward_modules:
            raise ValueError(f"producer.reward names module {module!r}, which is not in producer.reward_modules "
                             f"({', '.join(self.producer.reward_modules)}); add it there to allow it")
        kafka = self.transport.kafka
        if kafka.security_protocol.startswith("SASL") and kafka.sasl_mechanism is None:
            raise ValueError("transport.kafka.sasl_mechanism is required when security_protocol uses SASL")
        return self


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


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Read TOML (if given), apply dotted overrides, validate; raise ConfigError on any fault."""
    data: dict[str, Any] = {}
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
        lines.append(f"{where}: {msg}" if where else msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def dump_toml(cfg: Config) -> str:
    """The config as TOML text (what a ConfigMap or a run directory stores)."""
    import tomli_w

    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
