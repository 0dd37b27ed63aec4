"""Problem datasets through fsspec: Parquet or JSONL, local or remote (s3://, gs://, ...).

Accepted layouts, per row:
- plain: ``id``, ``prompt`` (text), ``answer`` (text), optional group column;
- verl-style Parquet: ``prompt`` as a chat list of {role, content} messages and the answer
  in ``reward_model.ground_truth``; ``id`` from ``extra_info.index`` when there is no ``id``;
- either with an optional ``env_args`` (an object, or its JSON text): the arguments of the
  problem's environment, for runs with ``task.environment`` (prl/environments.py).

A missing column, an empty prompt or a duplicate id fails with a DatasetError naming the
file and the row.
"""

from __future__ import annotations

import json

import fsspec
import pyarrow as pa

from prl.storage import looked_under
from prl.tasks.addition import Problem


class DatasetError(ValueError):
    pass


DATASET_HINT = "task.train_path / task.heldout_path; `prl data reasoning-gym` makes a dataset"


def read_rows(uri: str, hint: str = DATASET_HINT) -> list[dict]:
    """The rows of a .parquet or .jsonl file; a missing or unreadable file is one DatasetError
    naming it (and, if missing, ``hint``: which setting names it, what makes one)."""
    try:
        return _read_rows(uri)
    except FileNotFoundError:
        raise DatasetError(f"{uri}: no such file{looked_under(uri)} ({hint})") from None
    except pa.ArrowException as exc:
        raise DatasetError(f"{uri}: not a readable Parquet file ({exc}); write it again") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{uri}: not UTF-8 text ({exc.reason}); save it as UTF-8") from None


def _read_rows(uri: str) -> list[dict]:
    if uri.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(uri, "rb") as f:
            return pq.read_table(f).to_pylist()
    if uri.endswith(".jsonl") or uri.endswith(".json"):
        rows = []
        with fsspec.open(uri, "rt") as f:
            for n, line in enumerate(f):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DatasetError(f"{uri}: line {n + 1}: not JSON ({exc.msg})") from None
        return rows
    raise DatasetError(f"{uri}: unknown format (expected .parquet or .jsonl)")


def _answer(row: dict):
    if row.get("answer") is not None:
        return row["answer"]
    rm = row.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        return rm["ground_truth"]
    return None


def _env_args(row: dict, where: str) -> str:
    """The row's environment arguments as JSON text ("" without any)."""
    args = row.get("env_args")
    if args is None or args == "":
        return ""
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise DatasetError(f"{where}: env_args must be an object (or its JSON text)")
    return json.dumps(parsed, sort_keys=True)


def _difficulty(value) -> int:
    """An integer difficulty: 2, or 2.0 (a pandas column with a gap is float); else 0 (a label)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _id(row: dict, n: int):
    if row.get("id") is not None:
        return row["id"]
    extra = row.get("extra_info")
    if isinstance(extra, dict) and extra.get("index") is not None:
        return extra["index"]
    return None


def load_problems(uri: str, group_field: str | None = None) -> list[Problem]:
    """Problems of a dataset file, validated row by row; an integer ``difficulty`` column
    splits the held-out accuracy, ``group_field`` (if set) labels each problem's group."""
    rows = read_rows(uri)
    problems, seen = [], set()
    for n, row in enumerate(rows):
        where = f"{uri}: row {n + 1}"  # counted as people count, from 1
        pid, answer, prompt = _id(row, n), _answer(row), row.get("prompt")
        if pid is None:
            raise DatasetError(f"{where}: missing column 'id' (or extra_info.index)")
        if answer is None:
            raise DatasetError(f"{where}: missing column 'answer' (or reward_model.ground_truth)")
        if prompt is None:
            raise DatasetError(f"{where}: missing column 'prompt'")
        chat = isinstance(prompt, list)
        if chat:
            if not prompt or not all(isinstance(m, dict) and m.get("content") for m in prompt):
                raise DatasetError(f"{where}: empty prompt")
            prompt = json.dumps([{"role": m.get("role", "user"), "content": m["content"]} for m in prompt])
        elif not str(prompt).strip():
            raise DatasetError(f"{where}: empty prompt")
        pid = str(pid)
        if pid in seen:
            raise DatasetError(f"{where}: duplicate id {pid!r}")
        seen.add(pid)
        if group_field and row.get(group_field) is None:
            raise DatasetError(f"{where}: missing column {group_field!r} (task.group_field)")
        difficulty = row.get("difficulty")
        group = str(row[group_field]) if group_field else ""
        problems.append(Problem(pid, str(prompt), str(answer), _difficulty(difficulty), group, chat, _env_args(row, where)))
    if not problems:
        raise DatasetError(f"{uri}: no rows")
    return problems
