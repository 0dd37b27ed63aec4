import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest

from prl.schemas import (
    DeadLetter, DecodeError, Dispatch, PolicyVersion, Rollout, RolloutGroup, Sampling, TrainBatch, TrainRollout,
    decode, encode, headers,
)
from prl.schemas import records


def rollout_group(reward=1.0, version=3):
    return RolloutGroup(
        "d1", "add2:12+34", version, "producer-0", [1, 4, 5, 13, 6, 7, 14], 1.0,
        [Rollout([9, 7, 2], [-0.125, -0.25, -0.5], reward, "stop", "64"), Rollout([3, 2], [-1.5, -0.375], 0.0, "stop", "0")],
        0.25, 0.0625, 1.5e9,
    )


EXAMPLES = [
    Dispatch("d1", "add1:1+2", "1+2=", "3", 8, Sampling(0.9, 0.95, 12, ["\n"]), 4, 1, 1.5e9, True),
    rollout_group(),
    TrainBatch("b1", 7, 5, 1234, [TrainRollout("d1/0", "p", 4, True, -0.5, 0.0, 1.0, [1, 2], [3, 2], [-0.5, -0.125])], 1.5e9),
    PolicyVersion(12, "s3://bucket/run/policy/v-00000012", 11, 1.5e9, "delta", "crc32c:0a1b2c3d"),
    DeadLetter("prl.rollouts", 2, 99, "not_arrow", "bad bytes", "scheduler", None, b"\x00garbage", 1.5e9),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: r.KIND)
def test_round_trip(record):
    assert decode(encode(record)) == record
    assert decode(encode(record), type(record)) == record


def test_token_fields_are_numpy_arrays_and_decode_as_read_only_views():
    group = rollout_group()
    assert group.prompt_ids.dtype == np.int32 and group.rollouts[0].logprobs.dtype == np.float32
    decoded = decode(encode(group))
    r = decoded.rollouts[0]
    assert r.completion_ids.tolist() == [9, 7, 2] and r.logprobs.tolist() == [-0.125, -0.25, -0.5]
    assert r.completion_ids.dtype == np.int32 and not r.completion_ids.flags.writeable
    assert decoded != rollout_group(reward=0.5)  # equality compares the arrays and every other field
    with pytest.raises(ValueError, match="1-D"):
        Rollout([[1, 2]], [[-0.5, -0.5]], 1.0, "stop")


def test_a_null_inside_a_rollout_is_rejected():
    group = rollout_group()
    table = records.to_table([group], RolloutGroup)
    rollouts = table["rollouts"].combine_chunks()
    inner = rollouts.values
    ids = pa.array([[9, 7, 2], None], type=pa.list_(pa.int32()))
    children = [ids if f.name == "completion_ids" else inner.field(f.name) for f in inner.type]
    nulled = pa.ListArray.from_arrays(rollouts.offsets, pa.StructArray.from_arrays(children, fields=list(inner.type)))
    table = table.set_column(table.schema.get_field_index("rollouts"), table.schema.field("rollouts"), nulled)
    with pytest.raises(DecodeError) as exc:
        decode(_ipc(table))
    assert exc.value.reason == "null_field" and "completion_ids" in str(exc.value)


def test_headers_carry_kind_version_and_policy_version():
    h = dict(headers(rollout_group(version=7)))
    assert h == {"kind": b"rollout_group", "schema_version": b"2", "policy_version": b"7"}


@pytest.mark.parametrize("cut", [0, 1, 10, 100, -1])
def test_truncated_bytes_are_rejected(cut):
    data = encode(rollout_group())
    with pytest.raises(DecodeError) as exc:
        decode(data[:cut])
    assert exc.value.reason == "not_arrow"


def test_garbage_is_rejected():
    with pytest.raises(DecodeError, match="not_arrow"):
        decode(b"definitely not arrow")


def test_wrong_kind_is_rejected():
    with pytest.raises(DecodeError) as exc:
        decode(encode(EXAMPLES[0]), RolloutGroup)
    assert exc.value.reason == "wrong_kind"


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_wrong_schema_version_is_rejected():
    pv = EXAMPLES[3]
    table = pa.Table.from_pylist([{"version": 1, "uri": "", "last_batch_seq": 0, "created_at": 0.0, "kind": "",
                                   "weights_checksum": ""}],
                                 schema=PolicyVersion.SCHEMA.with_metadata({"kind": "policy_version", "schema_version": "99"}))
    with pytest.raises(DecodeError) as exc:
        decode(_ipc(table))
    assert exc.value.reason == "wrong_schema_version"
    assert pv  # the valid one decodes (above); this one does not


def test_missing_column_is_rejected():
    schema = pa.schema([f for f in PolicyVersion.SCHEMA if f.name != "uri"]).with_metadata(
        {"kind": "policy_version", "schema_version": str(PolicyVersion.SCHEMA_VERSION)})
    table = pa.Table.from_pylist([{"version": 1, "last_batch_seq": 0, "created_at": 0.0, "kind": "", "weights_checksum": ""}],
                                 schema=schema)
    with pytest.raises(DecodeError) as exc:
        decode(_ipc(table))
    assert exc.value.reason == "missing_column" and "uri" in str(exc.value)


def test_unknown_kind_is_rejected():
    table = pa.table({"x": [1]}).replace_schema_metadata({"kind": "mystery", "schema_version": "1"})
    with pytest.raises(DecodeError) as exc:
        decode(_ipc(table))
    assert exc.value.reason == "unknown_kind"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_reward_is_rejected(bad):
    with pytest.raises(DecodeError) as exc:
        decode(encode(rollout_group(reward=bad)))
    assert exc.value.reason == "invalid_value" and "reward" in str(exc.value)


def test_negative_policy_version_is_rejected():
    with pytest.raises(DecodeError, match="negative policy_version"):
        decode(encode(rollout_group(version=-1)))


def test_no_pickle_anywhere():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    for path in root.rglob("*.py"):
        if ".venv" in path.parts or "venv" in path.parts:
            continue
        text = path.read_text()
        assert ("import " + "pickle") not in text and ("cloud" + "pickle") not in text, path


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: r.KIND)
def test_wire_format_is_unchanged(record):
    """Messages kept in tests/unit/data/wire-v<N> (each kind's schema version; version 1 made
    before the schemas were derived from the dataclasses) decode to the same records, and the
    same records encode to the same bytes."""
    import pathlib

    golden = (pathlib.Path(__file__).parent / "data" / f"wire-v{record.SCHEMA_VERSION}" / f"{record.KIND}.arrow").read_bytes()
    assert decode(golden) == record
    assert encode(record) == golden


def test_an_announcement_of_schema_version_1_is_refused():
    """Version 1 named a checkpoint and carried no checksum: a producer of today refuses it
    (wrong_schema_version) rather than load weights it cannot verify."""
    import pathlib

    old = (pathlib.Path(__file__).parent / "data" / "wire-v1" / "policy_version.arrow").read_bytes()
    with pytest.raises(DecodeError) as exc:
        decode(old)
    assert exc.value.reason == "wrong_schema_version" and "want 3" in str(exc.value)


@pytest.mark.parametrize("kind, version, now", [("train_batch", 2, 3), ("rollout_group", 1, 2)])
def test_a_batch_or_group_of_an_older_schema_is_refused(kind, version, now):
    """A batch of version 2 carried no sample weights, a group of version 1 no model mask: a
    service of today refuses them with the reason rather than train without them."""
    import pathlib

    old = (pathlib.Path(__file__).parent / "data" / f"wire-v{version}" / f"{kind}.arrow").read_bytes()
    with pytest.raises(DecodeError) as exc:
        decode(old)
    assert exc.value.reason == "wrong_schema_version" and f"want {now}" in str(exc.value)


def test_a_model_mask_is_one_per_token_and_names_a_model_token():
    group = rollout_group()
    r = group.rollouts[0]
    n = len(r.completion_ids)
    for bad in ([1] * (n + 1), [0] * n, [2] + [1] * (n - 1)):
        broken = dataclasses.replace(group, rollouts=[dataclasses.replace(r, model_mask=bad)])
        with pytest.raises(DecodeError) as exc:
            decode(encode(broken))
        assert "model_mask" in str(exc.value)
    ok = dataclasses.replace(group, rollouts=[dataclasses.replace(r, model_mask=[1] + [0] * (n - 1))])
    assert decode(encode(ok)) == ok


def test_an_announcement_with_weights_names_their_kind_and_checksum():
    with pytest.raises(DecodeError) as exc:
        decode(encode(PolicyVersion(3, "s3://b/run/policy/v-00000003", 2, 0.0)))
    assert exc.value.reason == "invalid_value" and "kind and checksum" in str(exc.value)


def test_arrow_schema_is_derived_from_the_annotations():
    assert records.arrow_type(records.Int32) == pa.int32()
    assert records.arrow_type(list[records.Float32]) == pa.list_(pa.float32())
    assert records.arrow_type(bytes | None) == pa.binary()
    assert Dispatch.SCHEMA.field("sampling").type == pa.struct(
        [("temperature", pa.float64()), ("top_p", pa.float64()), ("max_tokens", pa.int32()), ("stop", pa.list_(pa.string()))])
    assert records.nullable_fields(DeadLetter) == {"key"} and not records.nullable_fields(RolloutGroup)
    assert set(TrainRollout.ARRAYS) == {"prompt_ids", "completion_ids", "logprobs", "model_mask"}


def test_every_record_but_a_dead_letter_carries_a_policy_version_header():
    for record in EXAMPLES:
        h = dict(headers(record))
        expected = {"dispatch": b"4", "rollout_group": b"3", "train_batch": b"5", "policy_version": b"12"}.get(record.KIND)
        assert h.get("policy_version") == expected, record.KIND
