"""Versioned directories in object storage (fsspec): data first, manifest, then ``latest``.

Used for learner checkpoints and scheduler snapshots. Layout under ``root``::

    <name>/<file>...         the data files
    <name>/manifest.json     a checksum of every data file, written after them
    latest                   {"name": <name>, ...}, written last

A crash mid-write leaves at worst a directory without a manifest, which ``latest`` never
points at; reads check every checksum. Checksums are CRC-32C (``crc32c:<hex>``, hardware
speed, computed beside the write: a SHA-256 would cost more than the write itself);
manifests from before carry a SHA-256 hex digest, which reads still accept. A file may be
given as bytes or as a sequence of buffers (streamed, never joined in memory: see
:func:`safetensors_chunks`). Older directories beyond ``keep`` are deleted only after a
newer one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import crc32c
import fsspec
import structlog

from prl.errors import one_line

Data = bytes | Iterable  # bytes, or buffers written one after the other
log = structlog.get_logger("storage")

MANIFEST = "manifest.json"  # in every versioned directory, written after its data
CHECKPOINT_WEIGHTS = "model.safetensors"  # a learner checkpoint's files that producers read too
CHECKPOINT_STATE = "state.json"


class StorageError(RuntimeError):
    pass


# Exception classes (or their bases) that say object storage could not be reached: a refused,
# reset or timed-out connection, from the OS, aiohttp or botocore. A passing fault, unlike a
# request refused (permissions, a missing bucket) or a full disk. A bare TimeoutError is not one:
# an engine or a thread pool raises it too, and a store's timeouts come as aiohttp's or botocore's.
UNREACHABLE = frozenset({"ConnectionError", "ClientConnectionError", "EndpointConnectionError",
                         "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError"})
# A write that finds object storage unreachable is tried again after a growing wait (doubling to
# the longest) for this long, then fails: a service does not lose work to a storage restart.
RETRY_WAITS_S, RETRY_FOR_S = (0.5, 5.0), 600.0


def relative_local(path: str) -> bool:
    """Whether ``path`` is a local path relative to the working directory (not a URI)."""
    return bool(path) and "://" not in path and not os.path.isabs(path)


def looked_under(path: str) -> str:
    """For a message about ``path`` not found: " under <working directory>" if it is relative."""
    return f" under {os.getcwd()}" if relative_local(path) else ""


def unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error that led to it, says object storage could not be reached."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__name__ in UNREACHABLE for c in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def retried(write: Callable, what: str):
    """``write()``, tried again while object storage is unreachable (each failure logged as
    ``storage_error`` with the wait, the first success after as ``storage_recovered``), for at
    most RETRY_FOR_S; then, and at once for any other error, the error is raised. For writes
    that may be repeated: every write here is whole or not at all."""
    wait, longest = RETRY_WAITS_S
    since = None
    while True:
        try:
            result = write()
        except Exception as exc:
            now = time.monotonic()
            since = since or now
            if not unreachable(exc) or now - since >= RETRY_FOR_S:
                raise
            log.warning("storage_error", what=what, error=one_line(exc)[:300], retry_in_s=wait)
            time.sleep(wait)
            wait = min(2 * wait, longest)
            continue
        if since is not None:
            log.info("storage_recovered", what=what, seconds=round(time.monotonic() - since, 1))
        return result


def check_writable(uri: str, what: str = "run.run_dir") -> None:
    """Raise StorageError (one line: the path and what to change) unless a file can be
    written and removed under ``uri``."""
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        fs.makedirs(path, exist_ok=True)
        probe = f"{path.rstrip('/')}/.prl-write-check-{os.getpid()}"
        fs.pipe_file(probe, b"ok")
        fs.rm(probe)
    except Exception as exc:  # permissions, a missing bucket, bad credentials, a read-only disk...
        reason = getattr(exc, "strerror", None) or one_line(exc)[:200]
        raise StorageError(f"cannot write to {what} {uri}: {reason}; choose a location you can write") from None


def checksum(data: bytes) -> str:
    return f"crc32c:{crc32c.crc32c(data):08x}"


def _write(fs, path: str, data: Data) -> str:
    """Write ``data`` to ``path``; return its checksum. Buffers are checksummed on a second
    thread while they are written (both release the GIL), so the checksum costs no time
    next to the write."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        fs.pipe_file(path, bytes(data))
        return checksum(data)
    crc = 0

    def extend(chunk) -> None:  # one worker: runs in submission order
        nonlocal crc
        crc = crc32c.crc32c(chunk, crc)

    with ThreadPoolExecutor(1) as checksummer, fs.open(path, "wb") as f:
        pending = []
        for chunk in data:
            pending.append(checksummer.submit(extend, chunk))
            f.write(chunk)
        for done in pending:
            done.result()
    return f"crc32c:{crc:08x}"


def _verify(data: bytes, expected: str | None) -> bool:
    if expected is None:
        return False
    if expected.startswith("crc32c:"):
        return checksum(data) == expected
    return hashlib.sha256(data).hexdigest() == expected  # manifests written before crc32c


def write_file(root: str, name: str, fname: str, data: Data) -> str:
    """One data file of ``root/name`` (e.g. written by another process); returns its checksum."""
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/" + name)
    fs.makedirs(path, exist_ok=True)
    return _write(fs, f"{path}/{fname}", data)


def write_versioned(root: str, name: str, files: dict[str, Data], keep: int, meta: dict | None = None,
                    written: dict[str, str] | None = None, prune_in_background: bool = False) -> str:
    """Write ``files`` under ``root/name``, then the manifest (covering ``written`` too: files
    already there, name -> checksum), then ``latest``; return the URI. Older versions beyond
    ``keep`` are deleted afterwards, on a background thread if asked (deleting a large
    checkpoint takes about as long as a third of writing one; see :func:`wait_for_pruning`)."""
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/" + name)
    fs.makedirs(path, exist_ok=True)
    manifest = dict(written or {})
    for fname, data in files.items():
        manifest[fname] = _write(fs, f"{path}/{fname}", data)
    fs.pipe_file(f"{path}/{MANIFEST}", json.dumps(manifest).encode())
    replace_file(fs, path.rsplit("/", 1)[0] + "/latest", json.dumps({**(meta or {}), "name": name}).encode())
    if prune_in_background:
        _pruner.submit(_prune_logged, root, keep, name)
    else:
        prune(root, keep, current=name)
    return root.rstrip("/") + "/" + name


def list_versions(root: str, prefix: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.exists(path):
        return []
    return sorted(n for n in (p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) if n.startswith(prefix))


def prune(root: str, keep: int, current: str) -> None:
    """Delete the versions older than ``current`` beyond ``keep`` (``current`` counted); a
    newer one, perhaps still being written, is never touched."""
    prefix = current.rsplit("-", 1)[0] + "-"
    older = [n for n in list_versions(root, prefix) if n < current]
    fs, path = fsspec.core.url_to_fs(root)
    for name in older[: max(0, len(older) - (keep - 1))]:
        fs.rm(f"{path}/{name}", recursive=True)


_pruner = ThreadPoolExecutor(1, thread_name_prefix="prl-prune")  # one worker: deletions in order


def _prune_logged(root: str, keep: int, current: str) -> None:
    try:
        prune(root, keep, current)
    except Exception as exc:  # a failed deletion loses nothing; the next prune retries it
        log.warning("prune_failed", root=root, current=current, error=repr(exc))


def wait_for_pruning() -> None:
    """Return once every background deletion submitted so far has finished."""
    _pruner.submit(lambda: None).result()


def replace_file(fs, path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: on a local disk a temporary file renamed over it
    (a rename is atomic); an object store's PUT is atomic already."""
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        fs.pipe_file(path, data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


VERSION_NAME = re.compile(r"^[A-Za-z]+-\d+$")  # step-00000012, snap-00000042


def read_latest(root: str) -> dict | None:
    """The ``latest`` pointer, if there is one and it names a version directory of ``root``
    (a bare ``<prefix>-NNNNNNNN``: no path, nothing outside the root); else None, with one
    log line naming the file when it exists but is not such a pointer."""
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/latest")
    if not fs.exists(path):
        return None
    try:
        latest = json.loads(fs.cat_file(path))
        if not (isinstance(latest, dict) and isinstance(latest.get("name"), str) and VERSION_NAME.match(latest["name"])):
            raise ValueError(f"names no version directory: {str(latest)[:100]}")
    except ValueError as exc:
        log.warning("latest_unreadable", file=f"{root.rstrip('/')}/latest", error=str(exc)[:200])
        return None
    return latest


def latest_uri(root: str) -> str | None:
    latest = read_latest(root)
    return None if latest is None else root.rstrip("/") + "/" + latest["name"]


def candidates(root: str, prefix: str) -> list[str]:
    """Version directories to resume from, best first: the one ``latest`` names, then every
    other one with a manifest (complete), newest first. A reader tries them in order and
    takes the first that verifies."""
    first = latest_uri(root)
    out = [first] if first else []
    fs, path = fsspec.core.url_to_fs(root)
    for name in reversed(list_versions(root, prefix)):
        uri = root.rstrip("/") + "/" + name
        if uri != first and fs.exists(f"{path}/{name}/{MANIFEST}"):
            out.append(uri)
    return out


def first_readable(uris: list[str], read, what: str, fatal: tuple = ()):
    """``(uri, read(uri))`` for the first of ``uris`` that reads without error (checksums
    verify, files parse); each one skipped is logged in one line naming it. None if none reads.
    An error of a ``fatal`` kind, or storage that cannot be reached, is raised at once (no
    older version would mend it)."""
    for uri in uris:
        try:
            return uri, read(uri)
        except fatal:
            raise
        except Exception as exc:  # a torn, tampered or unparsable version: fall back to an older one
            if unreachable(exc):  # not the version's fault: resuming from an older one would lose work
                raise
            log.warning(f"{what}_unusable", uri=uri, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    return None


def has_file(uri: str, fname: str) -> bool:
    """Whether the manifest of ``uri`` lists ``fname``."""
    fs, path = fsspec.core.url_to_fs(uri)
    return fname in json.loads(fs.cat_file(f"{path}/{MANIFEST}"))


def read_verified(uri: str, fname: str) -> bytes:
    """One file of a versioned directory, checked against its manifest."""
    fs, path = fsspec.core.url_to_fs(uri)
    manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
    data = fs.cat_file(f"{path}/{fname}")
    if not _verify(data, manifest.get(fname)):
        raise StorageError(f"{uri}/{fname}: checksum does not match the manifest")
    return data


def read_checked(uri: str, expected: str) -> bytes:
    """One file, checked against the checksum its reader was given."""
    fs, path = fsspec.core.url_to_fs(uri)
    data = fs.cat_file(path)
    if not _verify(data, expected):
        raise StorageError(f"{uri}: checksum does not match {expected}")
    return data


def read_safetensors(uri: str, fname: str) -> dict:
    """The tensors of one safetensors file of a versioned directory, checked against its manifest."""
    from safetensors.torch import load

    return load(read_verified(uri, fname))


SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def safetensors_chunks(tensors: dict) -> list:
    """torch tensors as a safetensors file, in buffers that view the tensors' memory (the
    header, then each tensor's bytes): no copy of the whole file is made."""
    import torch

    header, offset, views = {}, 0, []
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        header[name] = {"dtype": SAFETENSORS_DTYPES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + raw.numel()]}
        offset += raw.numel()
        views.append(memoryview(raw.numpy()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text, *views]
