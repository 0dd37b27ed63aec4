"""`prl replay report|whatif|train` as people type them: the figures on the console, the PNGs,
and `--json PATH` with the same figures; wrong numbers stop with one line."""

import json

import pytest

from prl.cli import main
from scheduler.archive import RolloutArchive
from tests.support.groups import make_groups


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "archive"
    writer = RolloutArchive(str(path))
    for g in make_groups(60):
        writer.add(g, learner_version=g.policy_version)
    writer.close()
    return path


@pytest.mark.parametrize("action, key, pngs", [
    ("report", "versions", ["reward_by_version.png", "success_trajectories.png"]),
    ("whatif", "strategies", ["whatif.png"]),
])
def test_report_and_whatif_print_draw_and_write_json(tmp_path, capsys, archive, action, key, pngs):
    out, figures = tmp_path / "replay", tmp_path / f"{action}.json"
    code = main(["replay", action, str(archive), "--out", str(out), "--no-progress", "--json", str(figures)])
    assert code == 0
    assert f"wrote {figures}" in capsys.readouterr().out
    assert key in json.loads(figures.read_text())
    assert all((out / png).stat().st_size > 0 for png in pngs)


@pytest.mark.parametrize("argv, line", [
    (["replay", "publish", "--rate", "-1"], "argument --rate: '-1' is not a number >= 0"),
    (["run", "--max-steps", "0"], "argument --max-steps: '0' is not a whole number >= 1"),
    (["run", "--max-minutes", "nan"], "argument --max-minutes: 'nan' is not a number > 0"),
    (["inspect", "tail", "rollouts", "--limit", "0"], "argument --limit: '0' is not a whole number >= 1"),
    (["inspect", "tail", "rollouts", "--min-reward", "x"], "argument --min-reward: 'x' is not a finite number"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_wrong_number_is_one_line(capsys, argv, line):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err
