"""Versioned directories in object storage (fsspec): data first, manifest, then ``latest``.

Used for learner checkpoints and scheduler snapshots. Layout under ``root``::

    <name>/<file>...         the data files
    <name>/manifest.json     sha256 of every data file, written after them
    latest                   {"name": <name>, ...}, written last

A crash mid-write leaves at worst a directory without a manifest, which ``latest`` never
points at; reads check every checksum. Older directories beyond ``keep`` are deleted only
after a newer one is complete.
"""

from __future__ import annotations

import hashlib
import json

import fsspec


class StorageError(RuntimeError):
    pass


def write_file(root: str, name: str, fname: str, data: bytes) -> str:
    """One data file of ``root/name`` (e.g. written by another process); returns its sha256."""
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/" + name)
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/{fname}", data)
    return hashlib.sha256(data).hexdigest()


def write_versioned(root: str, name: str, files: dict[str, bytes], keep: int, meta: dict | None = None,
                    written: dict[str, str] | None = None) -> str:
    """Write ``files`` under ``root/name``, then the manifest (covering ``written`` too: files
    already there, name -> sha256), then ``latest``; return the URI."""
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/" + name)
    fs.makedirs(path, exist_ok=True)
    for fname, data in files.items():
        fs.pipe_file(f"{path}/{fname}", data)
    manifest = {**(written or {}), **{fname: hashlib.sha256(data).hexdigest() for fname, data in files.items()}}
    fs.pipe_file(f"{path}/manifest.json", json.dumps(manifest).encode())
    fs.pipe_file(path.rsplit("/", 1)[0] + "/latest", json.dumps({**(meta or {}), "name": name}).encode())
    prune(root, keep, current=name)
    return root.rstrip("/") + "/" + name


def list_versions(root: str, prefix: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.exists(path):
        return []
    return sorted(n for n in (p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) if n.startswith(prefix))


def prune(root: str, keep: int, current: str) -> None:
    prefix = current.rsplit("-", 1)[0] + "-"
    older = [n for n in list_versions(root, prefix) if n != current]
    fs, path = fsspec.core.url_to_fs(root)
    for name in older[: max(0, len(older) - (keep - 1))]:
        fs.rm(f"{path}/{name}", recursive=True)


def read_latest(root: str) -> dict | None:
    fs, path = fsspec.core.url_to_fs(root.rstrip("/") + "/latest")
    if not fs.exists(path):
        return None
    return json.loads(fs.cat_file(path))


def latest_uri(root: str) -> str | None:
    latest = read_latest(root)
    return None if latest is None else root.rstrip("/") + "/" + latest["name"]


def has_file(uri: str, fname: str) -> bool:
    """Whether the manifest of ``uri`` lists ``fname``."""
    fs, path = fsspec.core.url_to_fs(uri)
    return fname in json.loads(fs.cat_file(f"{path}/manifest.json"))


def read_verified(uri: str, fname: str) -> bytes:
    """One file of a versioned directory, checked against its manifest."""
    fs, path = fsspec.core.url_to_fs(uri)
    manifest = json.loads(fs.cat_file(f"{path}/manifest.json"))
    data = fs.cat_file(f"{path}/{fname}")
    if hashlib.sha256(data).hexdigest() != manifest.get(fname):
        raise StorageError(f"{uri}/{fname}: checksum does not match the manifest")
    return data
