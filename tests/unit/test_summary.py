"""The lines `prl run` ends with, for a new run and for one continued from its checkpoint."""

import json
import time

import pytest

from prl.cli.console import summary_table


def test_a_new_run_shows_start_and_end_accuracy():
    text = summary_table({"seconds": 5, "steps": 10, "first_step": 0, "rollouts_generated": 1408,
                          "start": {"accuracy": 0.332}, "end": {"accuracy": 0.354}}, ["a.png"])
    assert text.splitlines() == ["prl run finished in 5 s: 10 steps, 1,408 rollouts generated",
                                 "  held-out accuracy        start     end",
                                 "  overall                  0.332   0.354",
                                 "wrote a.png"]


def test_a_continued_run_names_its_steps_and_shows_no_start_it_did_not_measure():
    text = summary_table({"seconds": 6, "steps": 70, "first_step": 60, "rollouts_generated": 9344, "start": {},
                          "end": {"accuracy": 0.4}}, ["a.png"])
    assert text.splitlines()[:3] == ["prl run finished in 6 s: steps 60 -> 70 (continued from its checkpoint), "
                                     "9,344 rollouts generated",
                                     "  held-out accuracy          end",
                                     "  overall                  0.400"]
    assert "nan" not in text


def test_a_dataset_without_levels_shows_no_difficulty_row_repeating_overall():
    text = summary_table({"seconds": 9, "steps": 4, "first_step": 0, "rollouts_generated": 896,
                          "start": {"accuracy": 0.1, "accuracy_d0": 0.1}, "end": {"accuracy": 0.2, "accuracy_d0": 0.2}}, [])
    assert "difficulty 0" not in text and "  overall                  0.100   0.200" in text.splitlines()


def test_an_interrupted_run_says_what_stopped_it_how_to_go_on_and_when_it_was_last_evaluated():
    text = summary_table({"seconds": 13, "steps": 53, "first_step": 0, "rollouts_generated": 6912,
                          "interrupted_by": "SIGINT", "evaluated_at": 50,
                          "start": {"accuracy": 0.332}, "end": {"accuracy": 0.394}}, ["a.png"])
    assert text.splitlines()[:4] == ["prl run stopped by SIGINT after 13 s: 53 steps, 6,912 rollouts generated",
                                     "  checkpoint of step 53 written; the same command continues from it",
                                     "  held-out accuracy        start step 50",
                                     "  overall                  0.332   0.394"]

    before_any_step = summary_table({"seconds": 4, "steps": 0, "first_step": 0, "rollouts_generated": 0,
                                     "interrupted_by": "SIGTERM", "start": {}, "end": {}}, [])
    assert before_any_step.splitlines()[1] == "  nothing trained yet; the same command starts again"


def test_an_evaluation_line_shows_the_newest_mismatch_measured_though_its_step_had_no_age_0_rollout(capsys):
    """Only a step that trains age-0 rollouts measures the engine-trainer mismatch (on 2 CPU
    cores, about one in eight): the line shows the newest one measured, not none."""
    from types import SimpleNamespace

    from prl.cli.console import Console, mismatch_text

    evaluation = SimpleNamespace(version=4, rollouts_generated=512, started_at=time.time(), figures={"accuracy": 0.5})
    done = []
    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: list(done)), groups_returned=8,
                                groups_with_signal=6, counters={})
    learner = SimpleNamespace(counters={}, rollouts_generated=512, version=3,
                              last_stats={"mismatch/kl": 2e-4, "mean_reward": 0.3})
    console = Console(10, 0, fmt="json")
    console.update(learner, scheduler)
    learner.version, learner.last_stats = 4, {"mean_reward": 0.4}  # a step of stale and replayed rollouts only
    done.append(evaluation)
    console.update(learner, scheduler)
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert line["step"] == 4 and (line["mismatch_kl"], line["mismatch_step"]) == (2e-4, 3) and line["reward"] == 0.4
    assert mismatch_text(line) == "  mismatch-KL 2.0e-04 (step 3)"
    assert mismatch_text({**line, "mismatch_step": 4}) == "  mismatch-KL 2.0e-04"


def test_an_evaluation_line_shows_the_policys_entropy_on_the_last_steps_fresh_rollouts(capsys):
    from types import SimpleNamespace

    from prl.cli.console import Console

    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: [SimpleNamespace(
        version=4, rollouts_generated=512, started_at=time.time(), figures={"accuracy": 0.5})]),
                                groups_returned=8, groups_with_signal=6, counters={})
    learner = SimpleNamespace(counters={}, rollouts_generated=512, version=4,
                              last_stats={"mean_reward": 0.4, "entropy": 0.9, "fresh/entropy": 0.734})
    console = Console(10, 0, fmt="console", enabled=True)
    console.update(learner, scheduler)
    console.close()
    assert "reward 0.400  entropy 0.73  held-out 0.500" in capsys.readouterr().err


def test_the_summary_counts_every_rollout_generated_not_the_last_trained_batchs():
    """The last evaluation line said 26,240 rollouts, the summary under it 26,112: the learner's
    count is the one its last batch carried; producers went on generating after it."""
    from types import SimpleNamespace

    from prl.cli.run import summarize

    evaluations = [SimpleNamespace(version=0, figures={"accuracy": 0.3}), SimpleNamespace(version=200, figures={"accuracy": 0.4})]
    scheduler = SimpleNamespace(rollouts_generated=26_368, evaluator=SimpleNamespace(done=lambda: evaluations))
    learner = SimpleNamespace(version=200, rollouts_generated=26_112)
    summary = summarize(learner, scheduler, 0, 81.0)
    assert summary["rollouts_generated"] == 26_368 and summary["accuracy_end"] == 0.4


def test_a_console_that_is_not_a_terminal_gets_a_plain_line_when_none_came_for_a_while(capsys):
    """Redirected to a file or a pod's log, a progress bar is one endless line of redraws. The
    line gives the rollouts generated: before the first step, minutes on a CPU, the only sign
    that the run is working."""
    from types import SimpleNamespace

    from prl.cli.console import PLAIN_PROGRESS_S, Console

    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: []))
    learner = SimpleNamespace(version=3, last_stats={})
    console = Console(10, 0, fmt="console", enabled=True, max_seconds=900)
    assert console.bar is None  # capsys's stderr is not a terminal
    console.update(learner, scheduler)
    assert capsys.readouterr().err == ""
    console.last_line_at -= PLAIN_PROGRESS_S
    console.update(learner, scheduler)
    learner.version = 4
    console.update(learner, scheduler)
    console.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("learner steps 3/10  ") and lines[0].endswith(" of 900 s  384 rollouts")


def test_an_evaluation_line_gives_the_rollouts_until_it_was_asked_and_their_rate(capsys):
    """The step-0 line read 'rollouts 0 (22/s)': the count when the evaluation was asked, the rate
    from the learner's count when the line was shown, steps later. Both are of the moment it
    was asked now; a continued run counts from this process's start."""
    from types import SimpleNamespace

    from prl.cli.console import Console

    done = []
    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: list(done)), groups_returned=8,
                                groups_with_signal=6, counters={})
    learner = SimpleNamespace(counters={}, rollouts_generated=4096, version=12, last_stats={})
    console = Console(100, 10, fmt="json", rollouts_before=1000)
    console.t0 -= 20  # this process started 20 s ago
    done += [SimpleNamespace(version=10, rollouts_generated=1000, started_at=time.time() - 19.5, figures={"accuracy": 0.5}),
             SimpleNamespace(version=12, rollouts_generated=3000, started_at=time.time(), figures={"accuracy": 0.6})]
    console.update(learner, scheduler)
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert (first["rollouts"], first["rollouts_per_s"]) == (1000, 0.0)
    assert second["rollouts"] == 3000 and second["rollouts_per_s"] == pytest.approx(100, rel=0.01)


def test_before_any_step_a_line_shows_no_reward_or_zero_signal_share(capsys):
    """The step-0 evaluation can be shown before a step or a returned group: it read
    'reward 0.000 ... zero-signal 1.00', figures of nothing."""
    from types import SimpleNamespace

    from prl.cli.console import Console

    evaluation = SimpleNamespace(version=0, rollouts_generated=0, started_at=time.time(), figures={"accuracy": 0.332})
    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: [evaluation]), groups_returned=0,
                                groups_with_signal=0, counters={})
    learner = SimpleNamespace(counters={}, rollouts_generated=0, version=0, last_stats={})
    console = Console(10, 0, fmt="console", enabled=True)
    console.update(learner, scheduler)
    [line] = capsys.readouterr().err.splitlines()
    assert line.split() == ["step", "0", "rollouts", "0", "(0/s)", "held-out", "0.332", "replay", "0.00", "stale", "0"]


def test_a_continued_run_does_not_show_again_the_evaluations_of_the_run_before(capsys):
    """Continued, `prl run` showed every earlier evaluation again, each beside the reward, entropy
    and replay share of now ('step 0 ... reward 0.429 ... replay 0.33'): only its own are shown."""
    from types import SimpleNamespace

    from prl.cli.console import Console

    done = [SimpleNamespace(version=v, rollouts_generated=100 * v, started_at=time.time(), figures={"accuracy": 0.5})
            for v in (0, 10, 20, 30)]
    scheduler = SimpleNamespace(rollouts_generated=384, evaluator=SimpleNamespace(done=lambda: list(done)), groups_returned=8,
                                groups_with_signal=6, counters={})
    learner = SimpleNamespace(counters={}, version=30, last_stats={"mean_reward": 0.4})
    console = Console(40, 20, fmt="json", rollouts_before=2000, evaluated_before=(0, 10, 20))
    console.update(learner, scheduler)
    assert [json.loads(line)["step"] for line in capsys.readouterr().err.splitlines()] == [30]


def test_a_budget_keeps_time_for_the_last_checkpoint_too():
    """`--max-minutes`: training stops when one more step, the final evaluation and the last
    checkpoint (each as long as the last of its kind) would not fit; the checkpoint, seconds
    for a real model on a CPU, was not counted."""
    from types import SimpleNamespace

    from prl.cli.run import Budget

    budget = Budget(None, 100.0)
    budget.t0 -= 45.0  # 45 s spent
    budget.step_seconds = 10.0
    evaluation = SimpleNamespace(figures={"eval_seconds": 30.0})
    scheduler = SimpleNamespace(evaluator=SimpleNamespace(done=lambda: [evaluation]))
    learner = SimpleNamespace(rollouts_generated=0, checkpoint_seconds=0.0)
    assert not budget.spent(learner, scheduler)  # 85 s of 100
    learner.checkpoint_seconds = 20.0
    assert budget.spent(learner, scheduler)  # 105 s
