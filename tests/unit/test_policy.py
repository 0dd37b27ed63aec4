"""Policy versions through object storage (prl/policy.py): full bases, sparse deltas, late
joiners, and a producer that serves only what rebuilds to the announced checksum."""

import json

import numpy as np
import pytest
import torch

from prl import policy, storage
from prl.policy import PolicyReader, PolicyWriter, VersionRejected, apply_delta, encode_delta, weights_checksum


def weights(seed=0, n=4096):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(n // 64, 64, generator=g), "b.bias": torch.randn(n // 4, generator=g)}


def step(tensors, share=0.03, seed=1):
    """An RL-sized step: a small relative change on a ``share`` of the elements."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in tensors.items():
        moved = torch.rand(v.shape, generator=g) < share
        out[k] = torch.where(moved, v * (1 + 0.02 * torch.sign(torch.randn(v.shape, generator=g))), v)
    return out


def shapes(tensors):
    return {k: tuple(v.shape) for k, v in tensors.items()}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_delta_rebuilds_the_new_bits_exactly_and_costs_what_changed(dtype):
    old = policy.flat_bits(weights(), ["a.weight", "b.bias"], dtype)
    new = policy.flat_bits(step(weights()), ["a.weight", "b.bias"], dtype)
    blob = encode_delta(new, old)
    assert np.array_equal(apply_delta(old, blob), new)
    changed = float((new != old).mean())
    assert 0.01 < changed < 0.05 and len(blob) < 2.5 * changed * new.nbytes  # bytes follow the changed share
    assert len(encode_delta(old, old)) < 0.01 * old.nbytes  # nothing changed: next to nothing to send


def test_a_snapshot_is_the_weights_cast_and_laid_end_to_end():
    w = {"a": torch.randn(3, 5, dtype=torch.float64), "b": torch.randn(7), "c": torch.zeros(0), "d": torch.randn(2, 2)[:, 0]}
    flat = policy.flat_weights(w, ["d", "a", "c", "b"], "bfloat16")
    assert flat.dtype == torch.bfloat16 and torch.equal(flat, torch.cat([w[n].to(torch.bfloat16).reshape(-1) for n in "dacb"]))
    assert policy.flat_weights({}, [], "float32").shape == (0,)


def test_the_writer_lets_go_of_a_snapshot_once_it_is_on_the_host(tmp_path, monkeypatch):
    """On a GPU a version's snapshot is device memory: it is not held while the version is
    encoded and written (tens of seconds for billions of weights, beside the next step)."""
    import gc
    import weakref

    seen, host_bits, write_versioned = {}, policy.host_bits, storage.write_versioned

    def copied_to_host(flat):  # as from a GPU: the host's bits are a copy
        seen["snapshot"] = weakref.ref(flat)
        return host_bits(flat.clone())

    def written(*args, **kwargs):
        gc.collect()
        seen["held_while_written"] = seen["snapshot"]() is not None
        return write_versioned(*args, **kwargs)

    monkeypatch.setattr(policy, "host_bits", copied_to_host)
    monkeypatch.setattr(policy.storage, "write_versioned", written)
    PolicyWriter(str(tmp_path / "run"), "bfloat16").publish(1, weights())
    assert seen["held_while_written"] is False


def test_versions_go_out_as_a_base_then_deltas_and_a_producer_follows_them_bit_for_bit(tmp_path):
    run = str(tmp_path / "run")
    writer, reader = PolicyWriter(run, "bfloat16"), PolicyReader(shapes(weights()))
    w, kinds = weights(), []
    for version in range(1, 13):
        w = step(w, seed=version)
        out = writer.publish(version, w)
        kinds.append(out.kind)
        served = reader.read(out.uri, version, out.kind, out.checksum)
        assert all(torch.equal(served[k], w[k].to(torch.bfloat16)) for k in w)
    assert kinds == ["full"] + ["delta"] * 8 + ["full"] + ["delta"] * 2  # a base every FULL_EVERY versions


def test_a_producer_that_joins_late_reads_the_last_base_and_the_deltas_after_it(tmp_path):
    run = str(tmp_path / "run")
    writer, w, published = PolicyWriter(run, "bfloat16"), weights(), []
    for version in range(1, 16):
        w = step(w, seed=version)
        published.append(writer.publish(version, w))
    late = PolicyReader(shapes(w))
    last = published[-1]
    served = late.read(last.uri, 15, last.kind, last.checksum)
    assert all(torch.equal(served[k], w[k].to(torch.bfloat16)) for k in w)
    read = published[9].bytes + sum(p.bytes for p in published[10:])  # base 10, deltas 11-15
    assert read <= 2 * policy.flat_bits(w, list(w), "bfloat16").nbytes
    kept = storage.list_versions(f"{run}/policy", "v-")
    assert kept[0] == "v-00000001" and kept[-1] == "v-00000015"  # two chains kept: bases 1 and 10


def test_old_chains_are_pruned_but_the_two_newest_bases_stay(tmp_path):
    run = str(tmp_path / "run")
    writer, w = PolicyWriter(run, "bfloat16"), weights()
    for version in range(1, 32):
        w = step(w, seed=version)
        writer.publish(version, w)
    kept = storage.list_versions(f"{run}/policy", "v-")
    assert kept[0] == "v-00000020" and kept[-1] == "v-00000031"


@pytest.mark.parametrize("damage, reason", [
    ("announced checksum", "version_mismatch"),
    ("delta rewritten with its manifest", "checksum_mismatch"),
    ("another model's weights", "weights_do_not_fit"),
    ("version.json of another number", "version_mismatch"),
])
def test_a_version_that_does_not_rebuild_to_the_announcement_is_refused(tmp_path, damage, reason):
    """Storage is checked against the signed announcement, not trusted: a rewritten delta (with
    a manifest to match), another model's weights or a mislabelled directory is refused, and the
    producer keeps what it serves."""
    run = str(tmp_path / "run")
    writer, reader = PolicyWriter(run, "bfloat16"), PolicyReader(shapes(weights()))
    first = writer.publish(1, weights())
    reader.read(first.uri, 1, first.kind, first.checksum)
    second = writer.publish(2, step(weights()))
    checksum, version, uri = second.checksum, 2, second.uri
    if damage == "announced checksum":
        checksum = "crc32c:00000000"
    elif damage == "delta rewritten with its manifest":
        other = encode_delta(policy.flat_bits(step(weights(), seed=9), ["a.weight", "b.bias"], "bfloat16"),
                             policy.flat_bits(weights(), ["a.weight", "b.bias"], "bfloat16"))
        meta = storage.read_verified(uri, "version.json")
        storage.write_versioned(f"{run}/policy", "v-00000002", {"delta.zst": other, "version.json": meta}, keep=99)
    elif damage == "another model's weights":
        reader = PolicyReader({"other.weight": (4, 4)})
    else:
        version, uri = 3, uri.replace("v-00000002", "v-00000003")
        storage.write_versioned(f"{run}/policy", "v-00000003", {"version.json": storage.read_verified(second.uri, "version.json")},
                                keep=99)
    before = reader.current
    with pytest.raises(VersionRejected) as err:
        reader.read(uri, version, "delta", checksum)
    assert err.value.reason == reason and reader.current is before


def test_a_lora_adapter_travels_alone(tmp_path):
    adapter = {"base_model.model.x.lora_A.weight": torch.randn(8, 64), "base_model.model.x.lora_B.weight": torch.zeros(64, 8)}
    out = PolicyWriter(str(tmp_path / "run"), "bfloat16").publish(3, adapter, adapter=True)
    assert out.kind == "adapter" and out.bytes < 3 * 8 * 64 * 2 + 1024
    got = PolicyReader({}).read(out.uri, 3, "adapter", out.checksum)
    assert torch.equal(got["base_model.model.x.lora_A.weight"], adapter["base_model.model.x.lora_A.weight"].to(torch.bfloat16))
    assert json.loads(storage.read_verified(out.uri, "version.json"))["kind"] == "adapter"
    assert weights_checksum(policy.flat_bits(got, list(got), "bfloat16")) == out.checksum


def test_an_adapter_merges_into_the_base_weights_and_a_misfit_is_refused():
    from prl.models import LORA_ALPHA_PER_RANK, merge_adapter

    base = {"m.q.weight": torch.zeros(6, 4)}
    a, b = torch.ones(2, 4), torch.ones(6, 2)
    merged = merge_adapter(base, {"base_model.model.m.q.lora_A.weight": a, "base_model.model.m.q.lora_B.weight": b})
    assert torch.equal(merged["m.q.weight"], torch.full((6, 4), 2.0 * LORA_ALPHA_PER_RANK))
    with pytest.raises(ValueError, match="does not fit"):
        merge_adapter(base, {"base_model.model.m.q.lora_A.weight": torch.ones(2, 5),
                             "base_model.model.m.q.lora_B.weight": b})
