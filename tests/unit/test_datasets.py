import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prl.tasks.datasets import DatasetError, load_problems


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_jsonl_plain(tmp_path):
    uri = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt": "1+1=", "answer": "2", "difficulty": 1},
                                             {"id": "b", "prompt": "9+9=", "answer": "81", "difficulty": 2}])
    problems = load_problems(uri)
    assert [(p.id, p.prompt, p.answer, p.difficulty, p.group) for p in problems] == [("a", "1+1=", "2", 1, ""),
                                                                                     ("b", "9+9=", "81", 2, "")]
    assert [p.group for p in load_problems(uri, group_field="difficulty")] == ["1", "2"]  # the label, when asked for


def test_a_difficulty_column_with_gaps_still_splits_the_held_out_accuracy(tmp_path):
    """pandas writes an integer column with a missing value as float: 2.0 was read as 0."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "prompt": ["1+1=", "2+2=", "3+3=", "4+4="],
                             "answer": ["2", "4", "6", "8"], "difficulty": [1.0, None, 2.0, 2.5]}), path)
    assert [p.difficulty for p in load_problems(str(path))] == [1, 0, 2, 0]


def test_verl_style_parquet_through_fsspec():
    table = pa.Table.from_pylist([
        {"prompt": [{"role": "user", "content": "What is 2+2?"}], "reward_model": {"ground_truth": "4", "style": "rule"},
         "data_source": "gsm8k", "extra_info": {"index": 7}},
    ])
    with fsspec.open("memory://ds/train.parquet", "wb") as f:
        pq.write_table(table, f)
    (p,) = load_problems("memory://ds/train.parquet", group_field="data_source")
    assert p.id == "7" and p.answer == "4" and p.group == "gsm8k" and p.chat
    assert json.loads(p.prompt) == [{"role": "user", "content": "What is 2+2?"}]


@pytest.mark.parametrize("rows, message", [
    ([{"id": "a", "prompt": "x", "answer": "1"}, {"id": "b", "prompt": "y"}], "row 2: missing column 'answer' (or reward_model.ground_truth)"),
    ([{"id": "a", "prompt": "x", "answer": "1"}, {"id": "a", "prompt": "y", "answer": "2"}], "row 2: duplicate id 'a'"),
    ([{"id": "a", "prompt": "  ", "answer": "1"}], "row 1: empty prompt"),
    ([{"prompt": "x", "answer": "1"}], "row 1: missing column 'id' (or extra_info.index)"),
    ([{"id": "a", "prompt": "x", "answer": "1"}], "row 1: missing column 'level' (task.group_field)"),
])
def test_bad_rows_name_file_and_row(tmp_path, rows, message):
    uri = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError) as exc:
        load_problems(uri, group_field="level" if "level" in message else None)
    assert str(exc.value) == f"{uri}: {message}"


@pytest.mark.parametrize("name, content, message", [
    ("missing.parquet", None, "no such file (task.train_path / task.heldout_path; `prl data reasoning-gym` makes a dataset)"),
    ("cut.parquet", b"PAR1", "not a readable Parquet file ("),
    ("latin1.jsonl", b'{"id": "\xe9"}\n', "not UTF-8 text (invalid continuation byte); save it as UTF-8"),
])
def test_an_unreadable_file_is_one_line_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DatasetError) as exc:
        load_problems(str(path))
    assert str(exc.value).startswith(f"{path}: {message}")


def test_a_relative_path_that_names_nothing_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=f"^runs/data/t.parquet: no such file under {tmp_path} \\(task.train_path"):
        load_problems("runs/data/t.parquet")


def test_scheduler_runs_on_a_dataset(tmp_path):
    from prl.transport.memory import MemoryTransport
    from prl.scheduler.service import Scheduler
    from prl.schemas.config import load_config

    uri = write_jsonl(tmp_path / "d.jsonl", [{"id": f"p{i}", "prompt": f"{i}+1=", "answer": str(i + 1)[::-1],
                                              "difficulty": i % 2} for i in range(10)])
    cfg = load_config(overrides=[f"task.train_path='{uri}'", "task.group_field='difficulty'", "scheduler.groups_per_batch=2",
                                 "scheduler.max_in_flight=4", f"run.run_dir='{tmp_path}'"])
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    s = Scheduler(cfg, transport)
    s.step()
    assert len(s.in_flight) == 4 and s.group_names == ["0", "1"]
