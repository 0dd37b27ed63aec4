"""Policy versions in object storage: what producers load, apart from the learner's checkpoints.

A policy version is the weights alone, in the dtype producers serve (``model.dtype``, bf16 by
default), written once per learner step under ``<run_dir>/policy/``::

    v-00000013/version.json     {"version", "kind", "base", "checksum", "dtype", "last_batch_seq",
                                 "tensors": [[name, shape], ...]}
    v-00000013/weights.safetensors   kind "full": every tensor
    v-00000013/delta.zst             kind "delta": the change from version 12 (below)
    v-00000013/adapter.safetensors   kind "adapter": the LoRA tensors alone (learner.lora_rank)
    v-00000013/manifest.json    CRC-32C of each file, written after them; ``latest`` last

**Deltas.** Between consecutive RL steps most bf16 weights are bit-identical (an update below
|w|/256 does not move its bf16 value), so a version travels as the XOR of its weights' bit
patterns with the previous version's: zero where nothing changed, and where a value moved by an
ulp or two, zero in the high byte. The XOR is split into its low and high byte planes and
zstd-compressed (``encode_delta``). A full base is written every ``FULL_EVERY`` versions, at the
learner's first version after a start, and whenever the deltas since the last base would
outgrow the weights themselves; so a producer that joins late, reading the last base and the
deltas after it, reads at most twice the weights.

**Checksums.** ``checksum`` is the CRC-32C of the reconstructed weights' bits in canonical order
(``weights_checksum``); the learner puts it in the PolicyVersion message too, so a producer
serves only weights that rebuild, bit for bit, to what the learner announced, whatever is in
storage. Nothing is pickled.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import crc32c
import numpy as np
import zstandard

from prl import storage
from prl.trust import policy_root, version_name

FULL_EVERY = 10  # a full base every N versions: a late joiner reads at most one base and N - 1 deltas
KEEP_BASES = 2  # chains kept: the newest base's and the one before (a producer may be reading it)
DELTA_LEVEL = 3  # zstd level of deltas (level 3: ~1 s for 270 MB on one core)


class VersionRejected(ValueError):
    """A policy version that must not be served; ``reason`` is a short stable code."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


# -- the pure parts: bits, checksum, delta -----------------------------------------------------
def flat_bits(tensors: dict, names: list[str], dtype: str) -> np.ndarray:
    """The weights ``names`` (in that order) cast to ``dtype`` and laid end to end as their raw
    bits: uint16 for bf16 and fp16, uint32 for fp32."""
    return host_bits(flat_weights(tensors, names, dtype))


def flat_weights(tensors: dict, names: list[str], dtype: str):
    """The weights ``names`` cast to ``dtype`` and laid end to end in one new tensor on their own
    device: a snapshot, so the tensors may change afterwards (on a GPU it takes microseconds)."""
    import torch

    dt = getattr(torch, dtype)
    sizes = [tensors[n].numel() for n in names]
    flat = torch.empty(sum(sizes), dtype=dt, device=tensors[names[0]].device if names else "cpu")
    for name, part in zip(names, flat.split(sizes)):  # cast into place: no second copy of the model alive
        part.copy_(tensors[name].detach().reshape(-1))
    return flat


def host_bits(flat) -> np.ndarray:
    """A flat tensor's raw bits in host memory: uint16 for bf16 and fp16, uint32 for fp32."""
    import torch

    return flat.cpu().view(torch.int16 if flat.element_size() == 2 else torch.int32).numpy().view(
        np.uint16 if flat.element_size() == 2 else np.uint32)


def weights_checksum(bits: np.ndarray) -> str:
    return f"crc32c:{crc32c.crc32c(np.ascontiguousarray(bits).view(np.uint8)):08x}"


def encode_delta(new: np.ndarray, old: np.ndarray) -> bytes:
    """zstd of new XOR old, its bytes split into planes (low bytes of every element, then the
    next): the planes of an ulp-sized change are mostly zeros."""
    planes = np.empty((new.itemsize, new.size), dtype=np.uint8)
    new_bytes, old_bytes = new.view(np.uint8), old.view(np.uint8)
    for k, plane in enumerate(planes):  # the XOR of byte k of every element, in one pass: no temporary array
        np.bitwise_xor(new_bytes[k::new.itemsize], old_bytes[k::new.itemsize], out=plane)
    return zstandard.ZstdCompressor(level=DELTA_LEVEL).compress(planes)  # the array's buffer, not a copy of it


def apply_delta(old: np.ndarray, blob: bytes) -> np.ndarray:
    """The inverse of :func:`encode_delta`: the new bits from the old and the delta."""
    size = old.size * old.itemsize
    raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=size)
    if len(raw) != size:
        raise VersionRejected("delta_does_not_fit", f"{len(raw)} bytes for weights of {size}")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(old.itemsize, -1)
    new = np.empty_like(old)
    interleaved = new.view(np.uint8)
    for k, plane in enumerate(planes):  # byte k of every element (a transposed copy took 4.8x the rebuild: RESULTS)
        interleaved[k::old.itemsize] = plane
    return np.bitwise_xor(new, old, out=new)


def unflatten(bits: np.ndarray, spec: list, dtype: str) -> dict:
    """Tensors of ``dtype`` (views of ``bits``) from [[name, shape], ...]."""
    import torch

    flat = torch.from_numpy(bits.view(np.int16 if bits.itemsize == 2 else np.int32)).view(getattr(torch, dtype))
    out, pos = {}, 0
    for name, shape in spec:
        n = int(np.prod(shape)) if shape else 1
        out[name] = flat[pos: pos + n].view(*shape) if shape else flat[pos]
        pos += n
    return out


# -- writing (the learner) ---------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    uri: str
    kind: str  # "full", "delta" or "adapter"
    checksum: str
    bytes: int  # what a producer that has the previous version reads
    seconds: float = 0.0  # encoding and writing it


class PolicyWriter:
    """Writes each version, as a delta where that is smaller; one per learner. ``publish_async``
    takes the weights' bits at once and encodes and writes them on a thread of its own, one
    version after another, so the learner trains on meanwhile."""

    def __init__(self, run_dir: str, dtype: str, full_every: int = FULL_EVERY):
        """``full_every``: a full base every N versions (1: every version full, no deltas)."""
        self.root, self.dtype, self.full_every = policy_root(run_dir), dtype, full_every
        self.previous: tuple[int, np.ndarray] | None = None  # (version, bits) of the last written
        self.kinds: dict[str, str | None] = {}  # version directory -> its kind, as read or written
        self.chain_bytes = 0  # deltas written since the last base
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="prl-policy")  # one: versions written in order

    def publish(self, version: int, tensors: dict, adapter: bool = False, last_batch_seq: int = -1) -> Published:
        """Write ``tensors`` (the model's weights, or a LoRA adapter's) as policy ``version``,
        trained on the batches up to ``last_batch_seq``."""
        return self.publish_async(version, tensors, adapter, last_batch_seq).result()

    def publish_async(self, version: int, tensors: dict, adapter: bool = False, last_batch_seq: int = -1) -> Future:
        """Take a snapshot of ``tensors`` now, on their device (the caller may change the tensors
        after); copy it to the host, encode and write it as ``version`` on the writer's thread.
        The future's result is the Published."""
        spec = [[n, list(tensors[n].shape)] for n in tensors]
        snapshot = [flat_weights(tensors, list(tensors), self.dtype)]  # the writer empties it
        return self.worker.submit(self.write, version, snapshot, spec, adapter, last_batch_seq)

    def write(self, version: int, snapshot: list, spec: list, adapter: bool, last_batch_seq: int) -> Published:
        """Write the weights in ``snapshot`` (a list of one flat tensor, emptied as soon as they
        are on the host: a GPU snapshot is not held while the version is encoded and written)."""
        t0 = time.perf_counter()
        bits = host_bits(snapshot.pop())  # a GPU snapshot comes to the host here, off the training thread
        meta = {"version": version, "dtype": self.dtype, "tensors": spec, "checksum": weights_checksum(bits),
                "last_batch_seq": last_batch_seq}
        if adapter:
            kind, files = "adapter", {"adapter.safetensors": storage.safetensors_chunks(unflatten(bits, spec, self.dtype))}
        else:
            kind, files = self.encode(version, bits, spec)
        meta |= {"kind": kind, "base": version - 1 if kind == "delta" else version}
        files["version.json"] = json.dumps(meta).encode()
        size = sum(len(b) if isinstance(b, bytes) else sum(memoryview(c).nbytes for c in b) for b in files.values())
        uri = storage.retried(lambda: storage.write_versioned(self.root, version_name(version), files, keep=1 << 30,
                                                              meta={"version": version}), f"policy version {version}")
        self.previous = (version, bits)
        self.kinds[version_name(version)] = kind
        storage.retried(self.prune, "policy pruning")
        return Published(uri, kind, meta["checksum"], size, time.perf_counter() - t0)

    def encode(self, version: int, bits: np.ndarray, spec: list) -> tuple[str, dict]:
        """("delta", files) against the previous version when it is one step back, not a base's
        turn, and the chain since the last base stays within the weights' size; else ("full", files)."""
        prev = self.previous
        if prev is not None and prev[0] == version - 1 and version % self.full_every and prev[1].shape == bits.shape:
            blob = encode_delta(bits, prev[1])
            if self.chain_bytes + len(blob) <= bits.nbytes:  # a late joiner reads at most twice the weights
                self.chain_bytes += len(blob)
                return "delta", {"delta.zst": blob}
        self.chain_bytes = 0
        return "full", {"weights.safetensors": storage.safetensors_chunks(unflatten(bits, spec, self.dtype))}


    def prune(self) -> None:
        """Delete versions older than the ``KEEP_BASES``-th newest full base: what a late
        joiner needs is the newest base and the deltas after it."""
        names = storage.list_versions(self.root, "v-")
        for n in names:
            if n not in self.kinds:
                self.kinds[n] = _kind(self.root, n)
        bases = [n for n in names if self.kinds[n] == "full"][-KEEP_BASES:]
        if len(bases) == KEEP_BASES:
            storage.prune(self.root, keep=len(names) - names.index(bases[0]), current=names[-1])
            self.kinds = {n: k for n, k in self.kinds.items() if n >= bases[0]}


def _kind(root: str, name: str) -> str | None:
    try:
        return json.loads(storage.read_verified(f"{root.rstrip('/')}/{name}", "version.json")).get("kind")
    except Exception:  # being written, or torn: not a base to keep a chain for
        return None


def version_whole(uri: str) -> bool:
    """Whether a version directory still holds its manifest and version.json (the pruner
    deletes a version's files one by one)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(uri.rstrip("/"))
    return all(fs.exists(f"{root}/{name}") for name in (storage.MANIFEST, "version.json"))


def newest_version(run_dir: str) -> int:
    """The newest version written under ``<run_dir>/policy`` (0: none): a resumed learner
    never announces a number up to it again."""
    names = storage.list_versions(policy_root(run_dir), "v-")
    return int(names[-1].split("-")[1]) if names else 0


# -- reading (the producers) -------------------------------------------------------------------
class PolicyReader:
    """Rebuilds announced versions from storage and verifies them; keeps the last one's bits,
    so the next delta costs only its own bytes."""

    def __init__(self, expected: dict[str, tuple[int, ...]]):
        self.expected = expected  # name -> shape of every tensor the model has (a full version must match)
        self.current: tuple[int, np.ndarray, list] | None = None  # (version, bits, spec)

    def read(self, uri: str, version: int, kind: str, checksum: str) -> dict:
        """The tensors of ``version`` at ``uri``, rebuilt and checked against ``checksum`` (the
        announcement's); VersionRejected with the reason otherwise. Nothing is kept on failure."""
        meta = read_meta(uri, version)
        if meta["kind"] != kind or meta["checksum"] != checksum:
            raise VersionRejected("version_mismatch", f"{uri} holds a {meta['kind']} version with checksum "
                                                      f"{meta['checksum']}, the announcement says {kind} {checksum}")
        if kind == "adapter":
            bits = flat_bits(storage.read_safetensors(uri, "adapter.safetensors"), [n for n, _ in meta["tensors"]], meta["dtype"])
        else:
            self.check_shapes(meta["tensors"], uri)
            bits = self.rebuild(uri, meta)
        if weights_checksum(bits) != checksum:
            raise VersionRejected("checksum_mismatch", f"{uri}: the rebuilt weights' checksum is not {checksum}")
        if kind != "adapter":
            self.current = (version, bits, meta["tensors"])
        return unflatten(bits, meta["tensors"], meta["dtype"])

    def check_shapes(self, spec: list, uri: str) -> None:
        shapes = {name: tuple(shape) for name, shape in spec}
        if shapes != self.expected:
            wrong = sorted(set(shapes.items()) ^ set(self.expected.items()))[:3]
            raise VersionRejected("weights_do_not_fit", f"{uri}: names or shapes differ from the model's, e.g. {wrong}")

    def rebuild(self, uri: str, meta: dict) -> np.ndarray:
        """A full version's bits, or a delta's applied to its base: the one held if it is the
        previous version, else the chain back to the last full base in storage (a late joiner)."""
        if meta["kind"] == "full":
            return flat_bits(storage.read_safetensors(uri, "weights.safetensors"), [n for n, _ in meta["tensors"]],
                             meta["dtype"])
        base = meta["version"] - 1
        if self.current is not None and self.current[0] == base:
            old = self.current[1]
        else:
            sibling = uri.rstrip("/").rsplit("/", 1)[0] + "/" + version_name(base)
            old = self.rebuild(sibling, read_meta(sibling, base))
        return apply_delta(old, storage.read_verified(uri, "delta.zst"))


def read_meta(uri: str, version: int) -> dict:
    """A version's version.json, checksum-verified, saying it is ``version``."""
    try:
        meta = json.loads(storage.read_verified(uri, "version.json"))
    except (storage.StorageError, ValueError, OSError) as exc:
        raise VersionRejected("unreadable_version", f"{uri}: {str(exc)[:200]}") from None
    if meta.get("version") != version or meta.get("kind") not in ("full", "delta", "adapter"):
        raise VersionRejected("version_mismatch", f"{uri} holds version {meta.get('version')} ({meta.get('kind')}), "
                                                  f"not {version}")
    return meta
