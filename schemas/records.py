"""Wire records: one dataclass and one Arrow schema per kind, encoded as Arrow IPC.

Every message body is an Arrow IPC stream holding one record batch whose schema carries
``kind`` and ``schema_version`` in its metadata; the same two values (and the policy
version where one applies) also travel as Kafka headers so a plain client can filter
without decoding. ``decode`` checks all of it and raises :class:`DecodeError` with a
machine-readable ``reason``; nothing is ever pickled.

Token ids and log-probs are numpy arrays (int32, float32) in the records, so encoding hands
their buffers to Arrow and decoding returns read-only views of the message instead of
building a Python object per token (a 2,000-token rollout is 4,000 numbers). Constructors
accept any sequence and convert it once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1
MAX_COUNT = 2**31 - 1  # versions, sequence numbers, sizes: anything larger is corrupt

_ids = pa.list_(pa.int32())
_floats = pa.list_(pa.float32())


def token_ids(values) -> np.ndarray:
    """Token ids as a 1-D int32 array (no copy when they already are one)."""
    return _vector(values, np.int32)


def logprob_array(values) -> np.ndarray:
    """Log-probs as a 1-D float32 array (no copy when they already are one)."""
    return _vector(values, np.float32)


def _vector(values, dtype) -> np.ndarray:
    out = np.asarray(values, dtype=dtype)
    if out.ndim != 1:
        raise ValueError(f"expected a 1-D sequence, got shape {out.shape}")
    return out


class _ArrayRecord:
    """A record with numpy array fields: ``ARRAYS`` names each one and its conversion, applied
    once at construction. Equality is field by field (the dataclass default compares tuples,
    which numpy refuses to reduce to one bool)."""

    ARRAYS: ClassVar[dict] = {}
    __hash__ = None

    def __post_init__(self):
        for name, convert in self.ARRAYS.items():
            object.__setattr__(self, name, convert(getattr(self, name)))

    def __eq__(self, other):
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


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)


_sampling_type = pa.struct(
    [
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
        ("max_tokens", pa.int32()),
        ("stop", pa.list_(pa.string())),
    ]
)


@dataclass(frozen=True)
class Dispatch:
    """The scheduler asks a producer for ``group_size`` completions of one problem."""

    KIND: ClassVar[str] = "dispatch"
    SCHEMA: ClassVar[pa.Schema] = pa.schema(
        [
            ("dispatch_id", pa.string()),
            ("problem_id", pa.string()),
            ("prompt", pa.string()),
            ("answer", pa.string()),
            ("group_size", pa.int32()),
            ("sampling", _sampling_type),
            ("learner_version", pa.int64()),
            ("attempt", pa.int32()),
            ("issued_at", pa.float64()),
            ("chat", pa.bool_()),
        ]
    )
    dispatch_id: str
    problem_id: str
    prompt: str
    answer: str
    group_size: int
    sampling: Sampling
    learner_version: int
    attempt: int = 0
    issued_at: float = 0.0
    chat: bool = False  # prompt is a JSON list of chat messages: apply the chat template

    def validate(self) -> None:
        _require(1 <= self.group_size <= 4096, "invalid_value", "group_size must be in [1, 4096]")
        _require(0 <= self.learner_version <= MAX_COUNT, "invalid_value", "learner_version out of range")
        _require(0 < self.sampling.max_tokens <= MAX_COUNT, "invalid_value", "max_tokens out of range")
        _require(bool(self.problem_id), "invalid_value", "empty problem_id")


@dataclass(frozen=True, eq=False)
class Rollout(_ArrayRecord):
    """One sampled completion with its behaviour log-probs (one per completion token)."""

    ARRAYS: ClassVar[dict] = {"completion_ids": token_ids, "logprobs": logprob_array}
    completion_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    reward: float
    finish_reason: str  # "stop" (end of sequence or stop string) or "length"
    text: str = ""


_rollout_type = pa.struct(
    [
        ("completion_ids", _ids),
        ("logprobs", _floats),
        ("reward", pa.float32()),
        ("finish_reason", pa.string()),
        ("text", pa.string()),
    ]
)


@dataclass(frozen=True, eq=False)
class RolloutGroup(_ArrayRecord):
    """G completions of one dispatched problem, made by one policy version."""

    ARRAYS: ClassVar[dict] = {"prompt_ids": token_ids}
    KIND: ClassVar[str] = "rollout_group"
    SCHEMA: ClassVar[pa.Schema] = pa.schema(
        [
            ("dispatch_id", pa.string()),
            ("problem_id", pa.string()),
            ("policy_version", pa.int64()),
            ("producer_id", pa.string()),
            ("prompt_ids", _ids),
            ("temperature", pa.float64()),
            ("rollouts", pa.list_(_rollout_type)),
            ("generate_seconds", pa.float32()),
            ("reward_seconds", pa.float32()),
            ("created_at", pa.float64()),
            ("error", pa.string()),
        ]
    )
    dispatch_id: str
    problem_id: str
    policy_version: int
    producer_id: str
    prompt_ids: np.ndarray  # int32
    temperature: float
    rollouts: list[Rollout]
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0
    created_at: float = 0.0
    error: str = ""  # the problem could not be served (prompt too long, ...): no rollouts

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    def validate(self) -> None:
        _require(self.policy_version >= 0, "invalid_value", "negative policy_version")
        _require(self.policy_version <= MAX_COUNT, "invalid_value", "policy_version out of range")
        _require(len(self.rollouts) > 0 or bool(self.error), "invalid_value", "no rollouts and no error")
        for r in self.rollouts:
            _require(math.isfinite(r.reward), "invalid_value", "reward is not finite")
            _require(len(r.logprobs) == len(r.completion_ids), "invalid_value", "logprobs/token length mismatch")
            _require(bool(np.isfinite(r.logprobs).all() and (r.logprobs <= 0).all()), "invalid_value", "bad logprob")


@dataclass(frozen=True, eq=False)
class TrainRollout(_ArrayRecord):
    """A rollout as the learner sees it: tokens, behaviour log-probs, frozen advantage."""

    ARRAYS: ClassVar[dict] = {"prompt_ids": token_ids, "completion_ids": token_ids, "logprobs": logprob_array}

    rollout_id: str
    problem_id: str
    policy_version: int
    is_replay: bool
    advantage: float
    reward: float
    temperature: float
    prompt_ids: np.ndarray  # int32
    completion_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float32

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


_train_rollout_type = pa.struct(
    [
        ("rollout_id", pa.string()),
        ("problem_id", pa.string()),
        ("policy_version", pa.int64()),
        ("is_replay", pa.bool_()),
        ("advantage", pa.float32()),
        ("reward", pa.float32()),
        ("temperature", pa.float64()),
        ("prompt_ids", _ids),
        ("completion_ids", _ids),
        ("logprobs", _floats),
    ]
)


@dataclass(frozen=True)
class TrainBatch:
    """One optimizer step's worth of rollouts: fresh ones first, then replayed ones."""

    KIND: ClassVar[str] = "train_batch"
    SCHEMA: ClassVar[pa.Schema] = pa.schema(
        [
            ("batch_id", pa.string()),
            ("seq", pa.int64()),
            ("learner_version", pa.int64()),
            ("rollouts_generated", pa.int64()),
            ("rollouts", pa.list_(_train_rollout_type)),
            ("created_at", pa.float64()),
        ]
    )
    batch_id: str
    seq: int
    learner_version: int
    rollouts_generated: int
    rollouts: list[TrainRollout]
    created_at: float = 0.0

    def ages(self, version: int) -> list[int]:
        return [version - r.policy_version for r in self.rollouts]

    def validate(self) -> None:
        _require(0 <= self.seq <= MAX_COUNT, "invalid_value", "seq out of range")
        _require(0 <= self.learner_version <= MAX_COUNT, "invalid_value", "learner_version out of range")
        for r in self.rollouts:
            _require(0 <= r.policy_version <= MAX_COUNT, "invalid_value", "policy_version out of range")
            _require(math.isfinite(r.advantage), "invalid_value", "advantage is not finite")
            _require(len(r.logprobs) == len(r.completion_ids), "invalid_value", "logprobs/token length mismatch")


@dataclass(frozen=True)
class PolicyVersion:
    """The learner announces new weights. ``checkpoint_uri`` is empty between checkpoints."""

    KIND: ClassVar[str] = "policy_version"
    SCHEMA: ClassVar[pa.Schema] = pa.schema(
        [
            ("version", pa.int64()),
            ("checkpoint_uri", pa.string()),
            ("last_batch_seq", pa.int64()),
            ("created_at", pa.float64()),
        ]
    )
    version: int
    checkpoint_uri: str
    last_batch_seq: int
    created_at: float = 0.0

    def validate(self) -> None:
        _require(self.version >= 0, "invalid_value", "negative version")
        _require(self.version <= MAX_COUNT and -1 <= self.last_batch_seq <= MAX_COUNT, "invalid_value", "version out of range")


@dataclass(frozen=True)
class DeadLetter:
    """A message some service could not use, kept byte for byte with the reason."""

    KIND: ClassVar[str] = "dead_letter"
    SCHEMA: ClassVar[pa.Schema] = pa.schema(
        [
            ("source_topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("reason", pa.string()),
            ("detail", pa.string()),
            ("service", pa.string()),
            ("key", pa.binary()),
            ("original", pa.binary()),
            ("created_at", pa.float64()),
        ]
    )
    source_topic: str
    partition: int
    offset: int
    reason: str
    detail: str
    service: str
    key: bytes | None
    original: bytes
    created_at: float = 0.0

    def validate(self) -> None:
        pass


NULLABLE = {"key"}  # the only field that may be null: a dead letter's Kafka key
RECORD_TYPES = {cls.KIND: cls for cls in (Dispatch, RolloutGroup, TrainBatch, PolicyVersion, DeadLetter)}


def _require(ok: bool, reason: str, detail: str) -> None:
    if not ok:
        raise DecodeError(reason, detail)


def _schema_with_meta(cls) -> pa.Schema:
    return cls.SCHEMA.with_metadata({"kind": cls.KIND, "schema_version": str(SCHEMA_VERSION)})


def _row(record) -> dict:
    row = _fields(record)
    if "sampling" in row:
        row["sampling"] = _fields(row["sampling"])
    if "rollouts" in row:
        row["rollouts"] = [_fields(r) for r in row["rollouts"]]
    return row


def _fields(obj) -> dict:
    """A dataclass's fields, shallow (``dataclasses.asdict`` deep-copies every token list)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def to_table(records: list, cls: type) -> pa.Table:
    """Records of one kind as an Arrow table (one row each), schema metadata included."""
    return pa.Table.from_pylist([_row(r) for r in records], schema=_schema_with_meta(cls))


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
    """Kafka headers for a record: kind, schema_version and, where it has one, policy_version."""
    out = [("kind", record.KIND.encode()), ("schema_version", str(SCHEMA_VERSION).encode())]
    version = getattr(record, "policy_version", getattr(record, "version", None))
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
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise DecodeError("wrong_schema_version", f"got {meta.get('schema_version')!r}, want {SCHEMA_VERSION}")
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
    columns = [_values(table.column(name).combine_chunks(), name, nullable=name in NULLABLE) for name in names]
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
    return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})
