"""`prl replay report|whatif|train` as people type them: the figures on the console, the PNGs,
and `--json PATH` with the same figures; wrong numbers stop with one line."""

import json

import pytest

from prl.cli import main
from prl.scheduler.archive import RolloutArchive
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
    out, figures = tmp_path / "replay", tmp_path / "new" / f"{action}.json"  # its directory is made
    code = main(["replay", action, str(archive), "--out", str(out), "--no-progress", "--json", str(figures)])
    assert code == 0
    assert f"wrote {figures}" in capsys.readouterr().out
    assert key in json.loads(figures.read_text())
    assert all((out / png).stat().st_size > 0 for png in pngs)


@pytest.mark.parametrize("action, line", [
    ("report", "holds no served rollout group"), ("whatif", "holds no served rollout group"),
    ("train", "carries completions (only problems the producers could not serve, or groups sent as their rewards alone)"),
])
def test_an_archive_of_problems_nobody_could_serve_is_one_line(tmp_path, capsys, action, line):
    """A run whose every problem was retired (chat prompts for a model without a chat template)
    archives error groups only: report drew empty plots, whatif raised ValueError, train trained 0
    steps and named an empty checkpoint."""
    from dataclasses import replace

    writer = RolloutArchive(str(tmp_path / "archive"))
    for g in make_groups(8):
        writer.add(replace(g, rollouts=[], error="NoChatTemplate: chat prompt"), learner_version=0)
    writer.close()
    assert main(["replay", action, str(tmp_path / "archive"), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err and not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.parametrize("argv, line", [
    (["replay", "publish", "--rate", "-1"], "argument --rate: '-1' is not a number >= 0"),
    (["run", "--max-steps", "0"], "argument --max-steps: '0' is not a whole number >= 1"),
    (["run", "--max-minutes", "nan"], "argument --max-minutes: 'nan' is not a number > 0"),
    (["inspect", "tail", "rollouts", "--limit", "0"], "argument --limit: '0' is not a whole number >= 1"),
    (["inspect", "tail", "rollouts", "--min-reward", "x"], "argument --min-reward: 'x' is not a finite number"),
    (["replay", "whatif", "--json", f"{__file__}/w.json"], f"argument --json: cannot write '{__file__}/w.json': {__file__} is not a"),
    (["replay", "report", "--json", "."], "argument --json: '.' is a directory, not a file name"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_wrong_number_is_one_line(capsys, argv, line):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert line in err and "Traceback" not in err


def test_success_trajectories_are_one_line_per_difficulty_or_one_for_a_dataset_without_them():
    from dataclasses import replace

    from prl.cli.replay import success_by_difficulty

    groups = make_groups(60)
    by_version = {}
    for g in groups:
        by_version.setdefault(g.policy_version, []).append(g)
    assert sorted(success_by_difficulty(by_version)) == ["add1", "add2", "add3"]
    dataset = {v: [replace(g, problem_id=f"basic_arithmetic-train-{g.dispatch_id}") for g in gs]
               for v, gs in by_version.items()}  # ids without a difficulty prefix: 60 would-be lines
    lines = success_by_difficulty(dataset)
    assert list(lines) == ["all problems"] and len(lines["all problems"][0]) == len(by_version)


def test_the_console_table_of_a_long_run_shows_ranges_of_versions_and_loses_no_rollout():
    """A run of thousands of versions made a table of thousands of lines; --json keeps each."""
    from prl.cli.replay import TABLE_ROWS, format_report, version_ranges

    rows = [{"policy_version": v, "groups": 1 + v % 3, "rollouts": 8 * (1 + v % 3), "mean_reward": v / 1000,
             "solved_share": v / 1000, "signal_share": 0.5, "turns_mean": 1.0} for v in range(0, 1000, 2)]
    ranges = version_ranges(rows, TABLE_ROWS)
    assert len(ranges) == TABLE_ROWS and ranges[0]["versions"] == "0-48" and ranges[-1]["versions"] == "950-998"
    assert sum(r["rollouts"] for r in ranges) == sum(r["rollouts"] for r in rows)
    overall = sum(r["mean_reward"] * r["rollouts"] for r in rows) / sum(r["rollouts"] for r in rows)
    assert sum(r["mean_reward"] * r["rollouts"] for r in ranges) / sum(r["rollouts"] for r in ranges) == pytest.approx(overall)
    rep = {"versions": rows, "groups": 1000, "problems": 10, "age_mean": 0.5, "age_max": 2, "pngs": []}
    text = format_report(rep)
    assert len(text.splitlines()) == 2 + TABLE_ROWS + 1 and "500 versions in 20 ranges; --json PATH writes each" in text
    assert [r["versions"] for r in version_ranges(rows[:3], TABLE_ROWS)] == ["0", "2", "4"]


def test_off_a_terminal_a_long_job_says_its_progress_in_plain_lines(tmp_path, capsys, archive):
    from prl.cli.console import PLAIN_PROGRESS_S, progress_bar

    with progress_bar(10, "train", unit="batch") as bar:  # capsys's stderr is not a terminal
        bar.update(3)
        bar.said_at -= PLAIN_PROGRESS_S
        bar.update(4)
        assert bar.n == 7
    assert [line.split("  ")[0] for line in capsys.readouterr().err.splitlines()] == ["train: 7/10 batches"] * 2
    assert main(["replay", "whatif", str(archive), "--out", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "whatif priority: " in err



def test_publishing_an_archive_with_nothing_to_train_fences_no_scheduler(tmp_path):
    """`prl replay publish` claims the run's scheduler epoch (fencing a live scheduler) to write
    batches; given no group with completions, it claimed it and published nothing."""
    from dataclasses import replace

    from prl import epochs
    from prl.cli.replay import publish
    from prl.errors import UsageError
    from prl.scheduler.archive import ArchivedGroups
    from prl.schemas.config import load_config
    from prl.transport.memory import MemoryTransport

    writer = RolloutArchive(str(tmp_path / "archive"))
    for g in make_groups(8):
        writer.add(replace(g, rollouts=[], error="NoChatTemplate: chat prompt"), learner_version=0)
    writer.close()
    live = epochs.claim(str(tmp_path / "run"), "scheduler")
    cfg = load_config(None, [f"run.run_dir='{tmp_path / 'run'}'"])
    with pytest.raises(UsageError, match="nothing to train"):
        publish(cfg, MemoryTransport(), ArchivedGroups(str(tmp_path / "archive")), rate=0, progress=False)
    assert epochs.newest(str(tmp_path / "run"), "scheduler") == live
