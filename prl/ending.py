"""The end of a run, as its scheduler declares it: ``<run_dir>/finished.json``, naming the
learner version the run finished at, written once that version's evaluation is answered (or
given up) and the scheduler's last snapshot is taken. Producers serving the learner's last
version answer evaluation requests until it is there, however late a request comes (a
scheduler restarted at the end asks again); a service started after it loads nothing and
finishes at once (prl/cli/services.py).
"""

from __future__ import annotations

import json
import time

import fsspec

from prl.storage import replace_file

NAME = "finished.json"


def declare_finished(run_dir: str, learner_version: int) -> None:
    """Say that the run finished at ``learner_version`` (a continued run declares again, later)."""
    fs, path = fsspec.core.url_to_fs(f"{run_dir.rstrip('/')}/{NAME}")
    fs.makedirs(path.rpartition("/")[0], exist_ok=True)
    replace_file(fs, path, json.dumps({"learner_version": learner_version, "finished_at": time.time()}).encode())


def finished_version(run_dir: str) -> int:
    """The learner version the run was declared finished at; -1 if it was not, or cannot be
    read now (storage unreachable: the caller asks again later), or the file is not one this
    module wrote."""
    fs, path = fsspec.core.url_to_fs(f"{run_dir.rstrip('/')}/{NAME}")
    try:
        version = json.loads(fs.cat_file(path)).get("learner_version")
    except (OSError, ValueError, AttributeError):
        return -1
    return version if type(version) is int else -1  # not a bool
