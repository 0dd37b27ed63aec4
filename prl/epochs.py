"""One writer per role: a scheduler or learner claims an *epoch* as it starts, one above every
epoch its role claimed before, and stamps it on every batch or policy version it publishes.
Readers use a record only if its epoch is the newest its role has claimed, the way Kafka fences
a zombie transactional producer by its producer epoch: a scheduler or learner that was replaced
(a Deployment rollout's overlap, a pod cut off by a partition that comes back) cannot get a
batch or a version used, and stops itself at its next write.

Claims are files in the run directory, ``<run_dir>/epochs/<role>/epoch-00000003``, so every
service of the run sees them without a broker of its own.
"""

from __future__ import annotations

import json
import os
import socket
import time

import fsspec

ROLES = ("scheduler", "learner")


def _dir(run_dir: str, role: str) -> tuple:
    return fsspec.core.url_to_fs(f"{run_dir.rstrip('/')}/epochs/{role}")


def newest(run_dir: str, role: str) -> int:
    """The newest epoch ``role`` has claimed in this run (0: none yet)."""
    fs, path = _dir(run_dir, role)
    fs.invalidate_cache(path)  # s3fs caches listings: another process's claim would go unseen
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return 0
    return max((int(n[6:]) for n in names if n.startswith("epoch-") and n[6:].isdigit()), default=0)


def claim(run_dir: str, role: str) -> int:
    """Claim the next epoch of ``role``; return it. Two writers starting in the same instant may
    claim the same number (object stores have no exclusive create); the later claim is then the
    one a third start goes above."""
    epoch = newest(run_dir, role) + 1
    fs, path = _dir(run_dir, role)
    fs.makedirs(path, exist_ok=True)
    who = {"host": socket.gethostname(), "pid": os.getpid(), "claimed_at": time.time()}
    fs.pipe_file(f"{path}/epoch-{epoch:08d}", json.dumps(who).encode())
    return epoch


def fenced(run_dir: str, role: str, epoch: int) -> str | None:
    """Why a record stamped ``epoch`` by ``role`` must not be used (its writer was replaced, or
    claimed no such epoch), or None."""
    current = newest(run_dir, role)
    if epoch == current:
        return None
    if epoch < current:
        return f"epoch {epoch} of a {role} replaced by epoch {current}"
    return f"epoch {epoch}: no {role} of this run claimed it (newest {current})"
