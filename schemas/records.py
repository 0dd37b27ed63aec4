"""Wire records: one dataclass per kind; its Arrow schema is derived from the annotations.

Every message body is an Arrow IPC stream holding one record batch whose schema carries
``kind`` and ``schema_version`` in its metadata; the same two values (and the policy
version where one applies) also travel as Kafka headers so a plain client can filter
without decoding. ``decode`` checks all of it and raises :class:`DecodeError` with a
machine-readable ``reason``; nothing is ever pickled.

A record is declared once, as a dataclass. :func:`arrow_type` turns each annotation into
its Arrow type (str -> string, int -> int64, float -> float64, bool, bytes, ``X | None``
nullable, ``list[X]``, nested dataclasses -> struct); ``Annotated[int, pa.int32()]`` picks a
narrower type. Token ids and log-probs are numpy arrays (``TokenIds`` int32, ``LogProbs``
float32): encoding hands their buffers to Arrow and decoding returns read-only views of
the message instead of a Python object per token; constructors accept any sequence and
convert it once.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1  # of every kind but those that say otherwise (``@record(kind, schema_version=N)``)
MAX_COUNT = 2**31 - 1  # versions, sequence numbers, sizes: anything larger is corrupt
MAX_TOKENS = 1 << 20  # a completion budget above this is not a real request
MAX_TEMPERATURE = 100.0
CHECKSUM = re.compile(r"crc32c:[0-9a-f]{8}")


def token_ids(values) -> np.ndarray:
    """Token ids as a 1-D int32 array (no copy when they already are one)."""
    return _vector(values, np.int32)


def logprob_array(values) -> np.ndarray:
    """Log-probs as a 1-D float32 array (no copy when they already are one)."""
    return _vector(values, np.float32)


def mask_array(values) -> np.ndarray:
    """A 0/1 token mask as a 1-D uint8 array (no copy when it already is one)."""
    return _vector(values, np.uint8)


def _vector(values, dtype) -> np.ndarray:
    out = np.asarray(values, dtype=dtype)
    if out.ndim != 1:
        raise ValueError(f"expected a 1-D sequence, got shape {out.shape}")
    return out


# Field types with a wire type narrower than the default, and the numpy array fields (Arrow
# type, then the conversion applied at construction).
Int32 = Annotated[int, pa.int32()]
Float32 = Annotated[float, pa.float32()]
TokenIds = Annotated[np.ndarray, pa.list_(pa.int32()), token_ids]
LogProbs = Annotated[np.ndarray, pa.list_(pa.float32()), logprob_array]
Mask = Annotated[np.ndarray, pa.list_(pa.uint8()), mask_array]
_PLAIN = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(), bytes: pa.binary()}


def arrow_type(hint) -> pa.DataType:
    """The Arrow type of a record field's annotation (resolved with ``include_extras``)."""
    if typing.get_origin(hint) is Annotated:
        return next(m for m in hint.__metadata__ if isinstance(m, pa.DataType))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return arrow_type(inner)
    if typing.get_origin(hint) is list:
        return pa.list_(arrow_type(typing.get_args(hint)[0]))
    if dataclasses.is_dataclass(hint):
        return pa.struct([pa.field(name, arrow_type(h)) for name, h in _hints(hint).items()])
    return _PLAIN[hint]


@functools.cache
def _hints(cls) -> dict:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _converters(cls) -> dict:
    """Field name -> conversion, for the fields annotated with one (the numpy arrays)."""
    out = {}
    for name, hint in _hints(cls).items():
        if typing.get_origin(hint) is Annotated:
            out.update({name: m for m in hint.__metadata__ if callable(m) and not isinstance(m, pa.DataType)})
    return out


def nullable_fields(cls) -> set[str]:
    """Top-level fields annotated ``X | None`` (the only place a null is allowed)."""
    return {name for name, hint in _hints(cls).items()
            if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)}


def record(kind: str | None = None, schema_version: int = SCHEMA_VERSION):
    """Class decorator: a frozen dataclass whose ``SCHEMA`` is derived from its annotations
    (and, with ``kind``, a wire record of that kind). Array fields are converted once at
    construction; equality compares arrays element-wise (the dataclass default compares
    tuples, which numpy refuses to reduce to one bool); records of plain values keep the
    dataclass equality and hash."""

    def wrap(cls):
        cls.__post_init__ = _convert_arrays
        cls = dataclass(frozen=True)(cls)
        cls.SCHEMA = pa.schema([pa.field(name, arrow_type(h)) for name, h in _hints(cls).items()])
        cls.ARRAYS = _converters(cls)
        if kind is not None:
            cls.KIND, cls.SCHEMA_VERSION = kind, schema_version
        if cls.ARRAYS:
            cls.__eq__, cls.__hash__ = _record_eq, None
        return cls

    return wrap


def _convert_arrays(self) -> None:
    for name, convert in self.ARRAYS.items():
        object.__setattr__(self, name, convert(getattr(self, name)))


def _record_eq(self, other):
    if type(other) is not type(self):
        return NotImplemented
    return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return a == b


class DecodeError(ValueError):
    """A message that cannot become a record. ``reason`` is a short stable code."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


@record()
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: Int32 = 16
    stop: list[str] = field(default_factory=list)

    def validate(self) -> None:
        _require(valid_temperature(self.temperature), "invalid_value", f"temperature must be in (0, {MAX_TEMPERATURE}]")
        _require(math.isfinite(self.top_p) and 0 < self.top_p <= 1, "invalid_value", "top_p must be in (0, 1]")
        _require(0 < self.max_tokens <= MAX_TOKENS, "invalid_value", f"max_tokens must be in [1, {MAX_TOKENS}]")
        _require(len(self.stop) <= 16 and all(0 < len(s) <= 64 for s in self.stop), "invalid_value",
                 "at most 16 stop strings of 1-64 characters")


@record("dispatch", schema_version=2)
class Dispatch:
    """The scheduler asks a producer for ``group_size`` completions of one problem (episodes of
    ``task.environment`` with ``env_args``, where the run has one). Schema version 2: version 1
    had no env_args."""

    dispatch_id: str
    problem_id: str
    prompt: str
    answer: str
    group_size: Int32
    sampling: Sampling
    learner_version: int
    attempt: Int32 = 0
    issued_at: float = 0.0
    chat: bool = False  # prompt is a JSON list of chat messages: apply the chat template
    env_args: str = ""  # the problem's environment arguments, a JSON object ("": none)

    def validate(self) -> None:
        _require(valid_env_args(self.env_args), "invalid_value", "env_args is not a JSON object")
        _require(1 <= self.group_size <= 4096, "invalid_value", "group_size must be in [1, 4096]")
        _require(0 <= self.learner_version <= MAX_COUNT, "invalid_value", "learner_version out of range")
        _require(bool(self.problem_id), "invalid_value", "empty problem_id")
        self.sampling.validate()


@record()
class Rollout:
    """One sampled completion with its behaviour log-probs (one per completion token). In a
    multi-turn episode the completion is every turn after the prompt, the environment's too:
    ``model_mask`` is 1 where the model sampled the token and 0 where the environment wrote it
    (whose log-probs are 0); empty: every token is the model's."""

    completion_ids: TokenIds
    logprobs: LogProbs
    reward: Float32
    finish_reason: str  # "stop" (end of sequence or stop string) or "length"
    text: str = ""
    model_mask: Mask = field(default_factory=tuple)


@record("rollout_group", schema_version=2)
class RolloutGroup:
    """G completions of one dispatched problem, made by one policy version. Schema version 2:
    version 1 had no model masks."""

    dispatch_id: str
    problem_id: str
    policy_version: int
    producer_id: str
    prompt_ids: TokenIds
    temperature: float
    rollouts: list[Rollout]
    generate_seconds: Float32 = 0.0
    reward_seconds: Float32 = 0.0
    created_at: float = 0.0
    error: str = ""  # the problem could not be served (prompt too long, ...): no rollouts

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def has_completions(self) -> bool:
        """Every rollout carries its completion tokens (false for a group sent as its rewards
        only, producer.drop_zero_signal_completions; true for an error group, which has none)."""
        return all(len(r.completion_ids) for r in self.rollouts)

    def validate(self) -> None:
        _require(self.policy_version >= 0, "invalid_value", "negative policy_version")
        _require(self.policy_version <= MAX_COUNT, "invalid_value", "policy_version out of range")
        _require(len(self.rollouts) > 0 or bool(self.error), "invalid_value", "no rollouts and no error")
        _require(valid_temperature(self.temperature), "invalid_value", "temperature is not a sampling temperature")
        _require(valid_token_ids(self.prompt_ids), "invalid_value", "negative token id")
        for r in self.rollouts:
            _require(math.isfinite(r.reward), "invalid_value", "reward is not finite")
            _require(len(r.logprobs) == len(r.completion_ids), "invalid_value", "logprobs/token length mismatch")
            _require(valid_logprobs(r.logprobs), "invalid_value", "log-prob not finite, above 0 or below LOGPROB_MIN")
            _require(valid_token_ids(r.completion_ids), "invalid_value", "negative token id")
            _require(valid_mask(r.model_mask, r.completion_ids), "invalid_value", "model_mask: 0/1 per token, some 1")


@record()
class TrainRollout:
    """A rollout as the learner sees it: tokens, behaviour log-probs, frozen advantage, and
    ``sample_weight``, the importance weight of a replayed rollout's prioritized draw (1 for a
    fresh one)."""

    rollout_id: str
    problem_id: str
    policy_version: int
    is_replay: bool
    advantage: Float32
    reward: Float32
    temperature: float
    prompt_ids: TokenIds
    completion_ids: TokenIds
    logprobs: LogProbs
    sample_weight: Float32 = 1.0
    model_mask: Mask = field(default_factory=tuple)  # as Rollout's: the learner trains the model's tokens alone

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def model_tokens(self) -> int:
        """The completion tokens the model sampled: the ones trained."""
        return int(self.model_mask.sum()) if len(self.model_mask) else len(self.completion_ids)


@record("train_batch", schema_version=3)
class TrainBatch:
    """One optimizer step's worth of rollouts: fresh ones first, then replayed ones. ``epoch``:
    the scheduler's that composed it (prl/epochs.py). Schema version 3: version 2 had no
    sample weights, version 1 no epoch."""

    batch_id: str
    seq: int
    learner_version: int
    rollouts_generated: int
    rollouts: list[TrainRollout]
    created_at: float = 0.0
    epoch: int = 0

    def validate(self) -> None:
        _require(0 <= self.seq <= MAX_COUNT and 0 <= self.epoch <= MAX_COUNT, "invalid_value", "seq or epoch out of range")
        _require(0 <= self.learner_version <= MAX_COUNT, "invalid_value", "learner_version out of range")
        _require(0 <= self.rollouts_generated <= 1 << 62, "invalid_value", "rollouts_generated out of range")
        _require(len(self.rollouts) > 0, "invalid_value", "no rollouts")
        _require(len({r.temperature for r in self.rollouts}) == 1, "invalid_value", "more than one temperature")
        for r in self.rollouts:
            _require(0 <= r.policy_version <= MAX_COUNT, "invalid_value", "policy_version out of range")
            _require(math.isfinite(r.advantage) and math.isfinite(r.reward), "invalid_value", "advantage or reward not finite")
            _require(0 < r.sample_weight <= 1, "invalid_value", "sample_weight outside (0, 1]")
            _require(valid_temperature(r.temperature), "invalid_value", "temperature is not a sampling temperature")
            _require(len(r.logprobs) == len(r.completion_ids) > 0, "invalid_value", "logprobs/token length mismatch")
            _require(valid_logprobs(r.logprobs), "invalid_value", "log-prob not finite, above 0 or below LOGPROB_MIN")
            _require(valid_token_ids(r.prompt_ids) and valid_token_ids(r.completion_ids), "invalid_value", "negative token id")
            _require(valid_mask(r.model_mask, r.completion_ids), "invalid_value", "model_mask: 0/1 per token, some 1")


@record()
class RolloutRef:
    """Where a trained rollout is: the rollout group message on the rollouts topic (the
    rollout is ``index`` in that group), with what the batch adds to it."""

    rollout_id: str  # "<dispatch_id>/<index>"
    topic: str
    partition: Int32
    offset: int
    index: Int32
    policy_version: int
    is_replay: bool
    advantage: Float32
    sample_weight: Float32 = 1.0


@record("train_batch_refs", schema_version=3)
class TrainBatchRefs:
    """A claim-check TrainBatch: references to the rollouts instead of copies of their tokens
    (the learner fetches the groups from the rollouts topic). Fresh references first. Schema
    version 3: version 2 had no sample weights, version 1 no epoch."""

    batch_id: str
    seq: int
    learner_version: int
    rollouts_generated: int
    refs: list[RolloutRef]
    created_at: float = 0.0
    epoch: int = 0

    def validate(self) -> None:
        _require(0 <= self.seq <= MAX_COUNT and 0 <= self.epoch <= MAX_COUNT, "invalid_value", "seq or epoch out of range")
        _require(0 <= self.learner_version <= MAX_COUNT, "invalid_value", "learner_version out of range")
        _require(0 <= self.rollouts_generated <= 1 << 62, "invalid_value", "rollouts_generated out of range")
        _require(len(self.refs) > 0, "invalid_value", "no rollouts")
        for r in self.refs:
            _require(0 <= r.policy_version <= MAX_COUNT, "invalid_value", "policy_version out of range")
            _require(r.partition >= 0 and r.offset >= 0 and 0 <= r.index < 4096, "invalid_value", "bad reference")
            _require(math.isfinite(r.advantage), "invalid_value", "advantage is not finite")
            _require(0 < r.sample_weight <= 1, "invalid_value", "sample_weight outside (0, 1]")


VERSION_KINDS = ("full", "delta", "adapter")


@record("policy_version", schema_version=3)
class PolicyVersion:
    """The learner announces a policy version: ``uri`` is its directory under the run's policy
    root (prl/policy.py; empty for version 0, the base model), ``kind`` what it holds (a full
    set of weights, a delta against version - 1, or a LoRA adapter) and ``weights_checksum``
    the CRC-32C of the weights it rebuilds to, which a producer checks before serving them;
    ``epoch`` the learner's (prl/epochs.py). Schema version 3: version 1 named a checkpoint and
    carried no checksum, version 2 no epoch."""

    version: int
    uri: str
    last_batch_seq: int
    created_at: float = 0.0
    kind: str = ""
    weights_checksum: str = ""
    epoch: int = 0

    def validate(self) -> None:
        _require(self.version >= 0 and 0 <= self.epoch <= MAX_COUNT, "invalid_value", "negative version or epoch out of range")
        _require(self.version <= MAX_COUNT and -1 <= self.last_batch_seq <= MAX_COUNT, "invalid_value", "version out of range")
        _require(not self.uri or (self.kind in VERSION_KINDS and CHECKSUM.fullmatch(self.weights_checksum) is not None),
                 "invalid_value", "a version with weights names their kind and checksum")


@record("dead_letter")
class DeadLetter:
    """A message some service could not use, kept byte for byte with the reason."""

    source_topic: str
    partition: Int32
    offset: int
    reason: str
    detail: str
    service: str
    key: bytes | None  # the Kafka key, if the message had one
    original: bytes
    created_at: float = 0.0

    def validate(self) -> None:
        pass


@record()
class EvalProblem:
    """One held-out problem of an evaluation request."""

    problem_id: str
    prompt: str
    answer: str
    difficulty: int = 0
    chat: bool = False
    env_args: str = ""  # as a Dispatch's


@record("eval_request", schema_version=2)
class EvalRequest:
    """The scheduler asks a producer to answer held-out problems greedily with policy version
    ``version`` and no other (on the problems topic, beside Dispatches)."""

    request_id: str
    version: int
    problems: list[EvalProblem]
    max_tokens: Int32
    attempt: Int32 = 0
    issued_at: float = 0.0

    def validate(self) -> None:
        _require(bool(self.request_id), "invalid_value", "empty request_id")
        _require(0 <= self.version <= MAX_COUNT, "invalid_value", "version out of range")
        _require(1 <= len(self.problems) <= 4096, "invalid_value", "an evaluation request holds 1 to 4096 problems")
        _require(1 <= self.max_tokens <= MAX_TOKENS, "invalid_value", f"max_tokens must be in [1, {MAX_TOKENS}]")
        _require(all(p.problem_id and p.prompt for p in self.problems), "invalid_value", "a problem without id or prompt")
        _require(all(valid_env_args(p.env_args) for p in self.problems), "invalid_value", "env_args is not a JSON object")


@record("eval_result")
class EvalResult:
    """A producer's answers to an EvalRequest, made by ``version`` (on the rollouts topic):
    one reward and greedy completion per problem, in the request's order; or none and an
    ``error`` saying why it could not answer with that version."""

    request_id: str
    version: int
    producer_id: str
    problem_ids: list[str]
    rewards: list[float]
    texts: list[str]
    error: str = ""
    created_at: float = 0.0

    def validate(self) -> None:
        _require(0 <= self.version <= MAX_COUNT, "invalid_value", "version out of range")
        _require(len(self.problem_ids) == len(self.rewards) == len(self.texts), "invalid_value",
                 "one reward and text per problem")
        _require(bool(self.error) != bool(self.problem_ids), "invalid_value", "answers, or an error, not both")
        _require(all(math.isfinite(r) for r in self.rewards), "invalid_value", "reward is not finite")


RECORD_TYPES = {cls.KIND: cls for cls in (Dispatch, RolloutGroup, TrainBatch, TrainBatchRefs, PolicyVersion, DeadLetter,
                                          EvalRequest, EvalResult)}


def valid_temperature(t: float) -> bool:
    return math.isfinite(t) and 0 < t <= MAX_TEMPERATURE


# A sampled token's log-prob is at least that of float32's smallest probability (2^-149, e^-103.3):
# a sampler computing in float32 or narrower never draws a token below it. One far below it (a
# corrupt or hostile message) would put the learner's importance ratio out of any float's range.
LOGPROB_MIN = -110.0


def valid_logprobs(lp: np.ndarray) -> bool:
    return bool(np.isfinite(lp).all() and (lp <= 0).all() and (lp >= LOGPROB_MIN).all())


def valid_env_args(text: str) -> bool:
    """Empty, or a JSON object of at most 64 kB."""
    if not text:
        return True
    try:
        return len(text) <= 65_536 and isinstance(json.loads(text), dict)
    except ValueError:
        return False


def valid_mask(mask: np.ndarray, ids: np.ndarray) -> bool:
    """Empty (every token the model's), or one 0/1 per token with at least one 1."""
    return not len(mask) or (len(mask) == len(ids) and int(mask.max()) == 1)


def valid_token_ids(ids: np.ndarray) -> bool:
    return not len(ids) or int(ids.min()) >= 0


def _require(ok: bool, reason: str, detail: str) -> None:
    if not ok:
        raise DecodeError(reason, detail)


def _schema_with_meta(cls) -> pa.Schema:
    return cls.SCHEMA.with_metadata({"kind": cls.KIND, "schema_version": str(cls.SCHEMA_VERSION)})


def record_row(record) -> dict:
    """A record as one Arrow row (nested records as dicts; arrays stay arrays)."""
    row = _fields(record)
    if "sampling" in row:
        row["sampling"] = _fields(row["sampling"])
    for nested in ("rollouts", "refs", "problems"):
        if nested in row:
            row[nested] = [_fields(r) for r in row[nested]]
    return row


def _fields(obj) -> dict:
    """A dataclass's fields, shallow (``dataclasses.asdict`` deep-copies every token list)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def to_table(records: list, cls: type) -> pa.Table:
    """Records of one kind as an Arrow table (one row each), schema metadata included."""
    return pa.Table.from_pylist([record_row(r) for r in records], schema=_schema_with_meta(cls))


def encode(record) -> bytes:
    """Arrow IPC stream bytes of one record."""
    return encode_table(to_table([record], type(record)))


def encode_table(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_many(data: bytes, expected: type) -> list:
    """Every record of an IPC stream made by ``encode_table(to_table(records, expected))``."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DecodeError("not_arrow", str(exc)[:200]) from None
    return from_table(table, expected)


def headers(record) -> list[tuple[str, bytes]]:
    """Kafka headers for a record: kind, schema_version and policy_version: the version that
    made a rollout group, that a policy announces, at which a dispatch was issued, and that will
    train a batch. Dead letters have none."""
    out = [("kind", record.KIND.encode()), ("schema_version", str(record.SCHEMA_VERSION).encode())]
    version = next((getattr(record, a) for a in ("policy_version", "version", "learner_version") if hasattr(record, a)), None)
    if version is not None:
        out.append(("policy_version", str(version).encode()))
    return out


def decode(data: bytes, expected: type | None = None):
    """Decode bytes made by :func:`encode`; raise :class:`DecodeError` on anything else
    (whatever the bytes: fuzzed input must never raise anything but DecodeError)."""
    try:
        return _decode(data, expected)
    except DecodeError:
        raise
    except Exception as exc:  # corrupt bytes can fail deep inside Arrow in many ways
        raise DecodeError("corrupt", f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _decode(data: bytes, expected: type | None):
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        table = reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, EOFError) as exc:
        raise DecodeError("not_arrow", str(exc)[:200]) from None
    try:
        table.validate(full=True)  # corrupt offsets would crash the conversion below (abort, not raise)
    except pa.ArrowInvalid as exc:
        raise DecodeError("corrupt", str(exc)[:200]) from None
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    kind = meta.get("kind")
    if kind not in RECORD_TYPES:
        raise DecodeError("unknown_kind", repr(kind))
    cls = RECORD_TYPES[kind]
    if expected is not None and cls is not expected:
        raise DecodeError("wrong_kind", f"expected {expected.KIND}, got {kind}")
    if meta.get("schema_version") != str(cls.SCHEMA_VERSION):
        raise DecodeError("wrong_schema_version", f"got {meta.get('schema_version')!r}, want {cls.SCHEMA_VERSION}")
    missing = [f.name for f in cls.SCHEMA if f.name not in table.schema.names]
    if missing:
        raise DecodeError("missing_column", ", ".join(missing))
    for f in cls.SCHEMA:
        if not table.schema.field(f.name).type.equals(f.type):
            raise DecodeError("wrong_type", f"{f.name}: {table.schema.field(f.name).type}")
    if table.num_rows != 1:
        raise DecodeError("wrong_row_count", str(table.num_rows))
    try:
        [record] = from_table(table, cls)
    except DecodeError:
        raise
    except (TypeError, KeyError, ValueError) as exc:
        raise DecodeError("invalid_value", str(exc)[:200]) from None
    record.validate()
    return record


def from_table(table: pa.Table, cls: type) -> list:
    """The table's rows as records of ``cls`` (extra columns ignored). Token ids and
    log-probs become read-only numpy views of the table's buffers; a null anywhere but a
    dead letter's key raises :class:`DecodeError` ``null_field``."""
    names = [f.name for f in dataclasses.fields(cls)]
    nullable = nullable_fields(cls)
    columns = [_values(table.column(name).combine_chunks(), name, nullable=name in nullable) for name in names]
    return [_from_row(cls, dict(zip(names, row))) for row in zip(*columns)]


def _values(array: pa.Array, name: str, nullable: bool = False) -> list:
    """One Python value per element: lists of numbers as numpy slices, structs as dicts."""
    if array.null_count and not nullable:
        raise DecodeError("null_field", name)
    kind = array.type
    if pa.types.is_list(kind):
        inner = array.values
        if pa.types.is_integer(inner.type) or pa.types.is_floating(inner.type):
            if inner.null_count:
                raise DecodeError("null_field", name)
            items = inner.to_numpy()
        else:
            items = _values(inner, name)
        offsets = array.offsets.to_numpy().tolist()
        return [items[start:end] for start, end in zip(offsets[:-1], offsets[1:])]
    if pa.types.is_struct(kind):
        fields = [f.name for f in kind]
        children = [_values(child, f) for child, f in zip(array.flatten(), fields)]
        return [dict(zip(fields, row)) for row in zip(*children)]
    return array.to_pylist()


def _from_row(cls, row: dict):
    if cls is Dispatch:
        row["sampling"] = Sampling(**row["sampling"])
    elif cls is RolloutGroup:
        row["rollouts"] = [Rollout(**r) for r in row["rollouts"]]
    elif cls is TrainBatch:
        row["rollouts"] = [TrainRollout(**r) for r in row["rollouts"]]
    elif cls is TrainBatchRefs:
        row["refs"] = [RolloutRef(**r) for r in row["refs"]]
    elif cls is EvalRequest:
        row["problems"] = [EvalProblem(**p) for p in row["problems"]]
    return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})
