"""The built-in addition task as a small dataset file, for tests that want a pool of a few
dozen problems (the built-in pool has 1,880)."""

import json
from pathlib import Path

from prl.tasks.addition import heldout_set, train_pool


def small_addition(directory, train=(20, 20), heldout: int | None = None) -> list[str]:
    """Config overrides for ``train[d-1]`` training problems of d digits (and, if asked,
    ``heldout`` held-out ones per difficulty), written as JSONL under ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = {"train": train_pool(list(train))}
    if heldout:
        files["test"] = heldout_set(heldout, len(train))
    for name, problems in files.items():
        rows = [{"id": p.id, "prompt": p.prompt, "answer": p.answer, "difficulty": p.difficulty} for p in problems]
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = [f"task.train_path={json.dumps(str(directory / 'train.jsonl'))}"]
    if heldout:
        out.append(f"task.heldout_path={json.dumps(str(directory / 'test.jsonl'))}")
    return out
