"""The rollout archive: files are written whole, and a file that is not Parquet is named."""

import pytest

from prl import storage
from prl.storage import StorageError
from prl.scheduler.archive import RolloutArchive, read_archive
from tests.support.groups import make_groups


def test_archived_groups_read_back_by_version(tmp_path):
    archive = RolloutArchive(str(tmp_path / "archive"), max_rows=7)
    for g in make_groups(30):
        archive.add(g, learner_version=g.policy_version)
    archive.close()
    table = read_archive(str(tmp_path / "archive"))
    assert table.num_rows == 30
    assert sorted(set(table["policy_version"].to_pylist())) == [0, 1, 2]
    assert not [p for p in (tmp_path / "archive").rglob("*") if ".tmp-" in p.name]


def test_a_group_a_restarted_scheduler_archived_again_is_read_once(tmp_path):
    """A scheduler killed after its archive took groups and before its snapshot covered them
    reads them again when restarted, and archives them again (a new writer, new files): the
    reader keeps each dispatch's first copy, so a report or `prl replay train` counts it once."""
    groups = make_groups(20)
    killed = RolloutArchive(str(tmp_path / "archive"))
    for g in groups[:15]:
        killed.add(g, 0)
    killed.flush()  # a timed flush, then kill -9: no snapshot covers groups 10..14
    restarted = RolloutArchive(str(tmp_path / "archive"))
    for g in groups[10:]:
        restarted.add(g, 1)
    restarted.close()
    table = read_archive(str(tmp_path / "archive"))
    assert table["dispatch_id"].to_pylist() == [g.dispatch_id for g in groups]
    assert table["learner_version"].to_pylist() == [0] * 15 + [1] * 5  # the first copy of each


def test_a_write_cut_short_leaves_no_file_the_reader_takes(tmp_path, monkeypatch):
    """A scheduler killed while writing a file (here: the write fails before it is complete)
    leaves the files written before, readable; the cut file is never a .parquet file."""
    archive = RolloutArchive(str(tmp_path / "archive"))
    groups = make_groups(20)
    for g in groups[:10]:
        archive.add(g, 0)
    archive.flush()

    def killed(fd):
        raise OSError(5, "killed mid-write")

    monkeypatch.setattr(storage.os, "fsync", killed)
    for g in groups[10:]:
        archive.add(g, 0)
    with pytest.raises(OSError, match="killed mid-write"):
        archive.flush()
    assert read_archive(str(tmp_path / "archive")).num_rows == 10


def test_a_file_that_is_not_parquet_is_named_in_one_line(tmp_path):
    archive = RolloutArchive(str(tmp_path / "archive"))
    for g in make_groups(5):
        archive.add(g, 0)
    archive.close()
    bad = tmp_path / "archive" / "policy_version=0" / "part-foreign.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(StorageError) as err:
        read_archive(str(tmp_path / "archive"))
    assert str(err.value).startswith(f"archive file {bad} is not readable Parquet (")
    assert "move it out of the archive" in str(err.value)


def test_an_archive_of_the_previous_release_reads_with_every_token_the_models(tmp_path):
    """Archives written before model masks existed (no model_mask column in the rollouts) read
    as they were: every completion token the model's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prl.scheduler.archive import groups_from_table

    archive = RolloutArchive(str(tmp_path / "archive"))
    for g in make_groups(3):
        archive.add(g, 0)
    archive.close()
    for f in (tmp_path / "archive").rglob("*.parquet"):
        table = pq.read_table(f)
        rollouts = table["rollouts"].combine_chunks()
        inner = rollouts.values
        old = pa.StructArray.from_arrays([inner.field(n.name) for n in inner.type if n.name != "model_mask"],
                                         fields=[n for n in inner.type if n.name != "model_mask"])
        table = table.set_column(table.schema.get_field_index("rollouts"), "rollouts",
                                 pa.ListArray.from_arrays(rollouts.offsets, old))
        pq.write_table(table, f)
    groups = groups_from_table(read_archive(str(tmp_path / "archive")))
    assert len(groups) == 3 and all(len(r.model_mask) == 0 for g in groups for r in g.rollouts)


def test_token_columns_are_written_without_a_dictionary_and_read_back_exactly(tmp_path):
    """A dictionary of token ids or log-probs outgrows its page and is dropped after the work
    (scheduler/archive.py); every other column keeps one. The tokens read back as written."""
    import numpy as np
    import pyarrow.parquet as pq

    from prl.scheduler.archive import TOKEN_COLUMNS, groups_from_table

    groups = make_groups(6)
    archive = RolloutArchive(str(tmp_path / "archive"))
    for g in groups:
        archive.add(g, 0)
    archive.close()
    meta = pq.ParquetFile(next((tmp_path / "archive").rglob("*.parquet"))).metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema: "RLE_DICTIONARY" in meta.column(i).encodings for i in range(meta.num_columns)}
    assert set(TOKEN_COLUMNS) <= set(dictionary)  # the names still match the schema
    assert [c for c, has in dictionary.items() if not has] == list(TOKEN_COLUMNS)
    back = {g.dispatch_id: g for g in groups_from_table(read_archive(str(tmp_path / "archive")))}
    for g in groups:
        for r, b in zip(g.rollouts, back[g.dispatch_id].rollouts):
            assert np.array_equal(r.completion_ids, b.completion_ids) and np.array_equal(r.logprobs, b.logprobs)
