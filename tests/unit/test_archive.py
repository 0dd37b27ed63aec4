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


def without_model_masks(path) -> None:
    """Rewrite an archive file as the release before model masks wrote it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    rollouts = table["rollouts"].combine_chunks()
    inner = rollouts.values
    old = pa.StructArray.from_arrays([inner.field(n.name) for n in inner.type if n.name != "model_mask"],
                                     fields=[n for n in inner.type if n.name != "model_mask"])
    table = table.set_column(table.schema.get_field_index("rollouts"), "rollouts", pa.ListArray.from_arrays(rollouts.offsets, old))
    pq.write_table(table, path)


def test_an_archive_of_the_previous_release_reads_with_every_token_the_models(tmp_path):
    """Archives written before model masks existed (no model_mask column in the rollouts) read
    as they were: every completion token the model's; beside newer files too."""
    from prl.scheduler.archive import groups_from_table, read_outcomes

    archive = RolloutArchive(str(tmp_path / "archive"), max_rows=3)
    for g in make_groups(6):
        archive.add(g, 0)
    archive.close()
    old, new = sorted((tmp_path / "archive").rglob("*.parquet"))[:2]
    without_model_masks(old)
    groups = groups_from_table(read_archive(str(tmp_path / "archive")))
    assert len(groups) == 6 and all(len(r.model_mask) == 0 for g in groups for r in g.rollouts)
    assert [len(g.turns) for g in read_outcomes(str(tmp_path / "archive"))] == [4] * 6


def archive_with_copies_and_errors(tmp_path):
    """60 groups over 6 versions, 5 of them archived twice (a restarted scheduler), 2 errors."""
    import dataclasses

    groups = make_groups(60)
    groups[7] = dataclasses.replace(groups[7], rollouts=[], error="prompt_too_long")
    groups[33] = dataclasses.replace(groups[33], rollouts=[], error="prompt_too_long")
    archive = RolloutArchive(str(tmp_path / "archive"), max_rows=7)
    for g in groups:
        archive.add(g, learner_version=g.policy_version + 2)
    archive.close()
    again = RolloutArchive(str(tmp_path / "archive"))
    for g in groups[40:45]:
        again.add(g, learner_version=99)
    again.close()
    return str(tmp_path / "archive"), groups


def test_statistics_read_outcomes_without_the_tokens(tmp_path):
    """A report or whatif over a run's archive reads each group's problem, versions, rewards
    and turns, and none of the token columns: the same outcomes as the whole groups give."""
    from prl.episodes import model_turns
    from prl.scheduler.archive import OUTCOME_COLUMNS, groups_from_table, read_outcomes

    uri, groups = archive_with_copies_and_errors(tmp_path)
    whole = read_archive(uri)
    expected = [(g.problem_id, g.policy_version, lv, g.rewards, [model_turns(r.model_mask) for r in g.rollouts])
                for g, lv in zip(groups_from_table(whole), whole["learner_version"].to_pylist()) if g.rollouts]
    outcomes = read_outcomes(uri)
    assert [(o.problem_id, o.policy_version, o.learner_version, o.rewards, o.turns) for o in outcomes] == expected
    assert len(outcomes) == 58 and {o.learner_version for o in outcomes} == {2, 3, 4, 5, 6, 7}  # first copies only
    read = read_archive(uri, OUTCOME_COLUMNS).schema
    assert read.field("rollouts").type.value_type.names == ["reward", "model_mask"]
    assert "prompt_ids" not in read.names


def test_one_problems_groups_are_read_whole_and_alone(tmp_path):
    """`prl explain` reads one problem's groups, tokens and all, each dispatch once."""
    from prl.scheduler.archive import groups_from_table

    uri, groups = archive_with_copies_and_errors(tmp_path)
    wanted = groups[41].problem_id  # one of the groups archived twice
    mine = groups_from_table(read_archive(uri, problem_id=wanted))
    theirs = [g for g in groups if g.problem_id == wanted]
    assert [g.dispatch_id for g in mine] == [g.dispatch_id for g in theirs]  # archived twice, read once
    def tokens(gs):
        return [[list(map(int, r.completion_ids)) for r in g.rollouts] for g in gs]

    assert tokens(mine) == tokens(theirs)
    assert read_archive(uri, problem_id="never:archived").num_rows == 0


def test_a_file_outside_a_version_folder_is_named_in_one_line(tmp_path):
    archive = RolloutArchive(str(tmp_path / "archive"))
    for g in make_groups(5):
        archive.add(g, 0)
    archive.close()
    stray = tmp_path / "archive" / "part-by-hand.parquet"
    stray.write_bytes(next((tmp_path / "archive").rglob("part-*.parquet")).read_bytes())
    with pytest.raises(StorageError, match=f"archive file {stray} is not in a policy_version=<V> folder"):
        read_archive(str(tmp_path / "archive"))


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


def test_the_archive_streams_whole_groups_in_order_a_file_at_a_time(tmp_path, monkeypatch):
    """`prl replay train` and `publish` take every group, tokens and all, in the order and with
    the copies dropped as the whole table gives them, each file read whole once, when its first
    group is due."""
    from prl.scheduler import archive as archive_module
    from prl.scheduler.archive import ArchivedGroups, groups_from_table

    uri, _ = archive_with_copies_and_errors(tmp_path)
    expected = groups_from_table(read_archive(uri))
    whole_reads = []
    real = archive_module.read_part
    monkeypatch.setattr(archive_module, "read_part", lambda fs, path, columns, problem_id: (
        whole_reads.append(path) if columns is None else None) or real(fs, path, columns, problem_id))
    groups = ArchivedGroups(uri)
    assert len(groups) == len(expected) == 60 and whole_reads == []
    stream = iter(groups)
    first = next(stream)
    assert first.dispatch_id == expected[0].dispatch_id and len(whole_reads) == 1
    rest = list(stream)
    assert [g.dispatch_id for g in [first, *rest]] == [g.dispatch_id for g in expected]
    assert [g.rewards for g in [first, *rest]] == [g.rewards for g in expected]
    assert len(whole_reads) == len(set(whole_reads))  # no file read whole twice


def test_a_write_the_store_refused_keeps_its_groups_for_the_next_flush(tmp_path, monkeypatch):
    """Adding a group never fails on storage (the scheduler has taken the result out of flight
    by then): a timed write the store refuses waits for the next flush, the snapshot's, which
    writes every group once; a refused flush keeps them too."""
    import prl.scheduler.archive as archive_module

    real, refusing = archive_module.replace_file, [True]

    def replace_file(fs, path, data):
        if refusing[0]:
            raise ConnectionRefusedError(111, "Connect call failed")
        real(fs, path, data)

    monkeypatch.setattr(archive_module, "replace_file", replace_file)
    archive = RolloutArchive(str(tmp_path / "archive"), flush_every_s=0.0)  # every add is due
    groups = make_groups(6)
    for g in groups[:3]:
        archive.add(g, learner_version=g.policy_version)
    with pytest.raises(ConnectionRefusedError):
        archive.flush()
    refusing[0] = False
    for g in groups[3:]:
        archive.add(g, learner_version=g.policy_version)
    archive.close()
    assert sorted(read_archive(str(tmp_path / "archive"))["dispatch_id"].to_pylist()) == sorted(g.dispatch_id for g in groups)
    assert not archive.pending
