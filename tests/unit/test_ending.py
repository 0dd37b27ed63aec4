"""The scheduler's declaration that a run is finished, as producers and restarted services read it."""

import pytest

from prl.ending import NAME, declare_finished, finished_version


def test_a_declaration_is_read_back_and_a_later_one_replaces_it(tmp_path):
    run_dir = str(tmp_path / "run")
    assert finished_version(run_dir) == -1
    declare_finished(run_dir, 200)
    assert finished_version(run_dir) == 200
    declare_finished(run_dir, 400)  # the run continued with a higher learner.max_steps
    assert finished_version(run_dir) == 400


@pytest.mark.parametrize("text", ["", "{not json", "[200]", '{"learner_version": "200"}', '{"learner_version": true}'])
def test_a_file_this_module_did_not_write_declares_nothing(tmp_path, text):
    (tmp_path / NAME).write_text(text)
    assert finished_version(str(tmp_path)) == -1
