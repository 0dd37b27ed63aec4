"""What `prl run` shows on the terminal: a progress bar and one line per evaluation, then a
summary table. Everything else goes to the log file (``<run_dir>/prl.log``). With
``run.log_format = "json"`` there is no bar and every line is a JSON object. Where the console is
not a terminal (a file, a pod's log) a bar would be one endless line of redraws: instead a
plain progress line comes when no line has come for ``PLAIN_PROGRESS_S``; so do the bars of
offline jobs (``progress_bar``: `prl replay`)."""

from __future__ import annotations

import json
import sys
import time

PLAIN_PROGRESS_S = 60.0


class Console:
    """The bar counts learner steps toward ``total_steps``, or, for a run bounded by wall time
    (``max_seconds``, `prl run --max-minutes`), seconds toward that bound with the step beside it."""

    def __init__(self, total_steps: int, first_step: int, fmt: str = "console", enabled: bool = True,
                 max_seconds: float | None = None, rollouts_before: int = 0, evaluated_before: tuple[int, ...] = ()):
        """``rollouts_before``, ``evaluated_before``: what the run had generated, and the versions
        whose evaluation it had shown, before this process (a continued run): the figures a line
        gives beside an accuracy are of its moment, which is past."""
        self.fmt, self.enabled, self.total_steps, self.max_seconds = fmt, enabled, total_steps, max_seconds
        self.rollouts_before = rollouts_before
        self.bar = None
        self.plain = enabled and fmt == "console" and not sys.stderr.isatty()
        if enabled and fmt == "console" and not self.plain:
            from tqdm import tqdm

            if max_seconds:
                bar = dict(total=round(max_seconds), desc="wall time", bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s{postfix}")
            else:
                bar = dict(total=total_steps, initial=first_step, desc="learner steps", unit="step")
            self.bar = tqdm(**bar, dynamic_ncols=True, file=sys.stderr)
        self.shown: set[int] = set(evaluated_before)  # versions whose evaluation line was shown
        self.mismatch = None  # (KL, step): the newest engine-trainer mismatch; only a step with age-0 rollouts measures it
        self.t0 = self.last_line_at = time.perf_counter()

    def update(self, learner, scheduler) -> None:
        """After a learner step (or a wait for one): move the bar, the rollouts generated beside
        it (before the first step, what shows the run is working); one line when an evaluation
        happened."""
        rollouts = f"{scheduler.rollouts_generated:,} rollouts"
        if self.bar is not None:
            if self.max_seconds:
                self.bar.n = min(self.bar.total, round(time.perf_counter() - self.t0))
                self.bar.set_postfix_str(f"step {learner.version}/{self.total_steps}, {rollouts}", refresh=False)
            else:
                self.bar.n = learner.version
                self.bar.set_postfix_str(rollouts, refresh=False)
            self.bar.refresh()
        elif self.plain and time.perf_counter() - self.last_line_at >= PLAIN_PROGRESS_S:
            self.emit_progress(learner.version, rollouts)
        if (kl := getattr(learner, "last_stats", {}).get("mismatch/kl")) is not None:
            self.mismatch = (kl, learner.version)
        for e in scheduler.evaluator.done():  # evaluations finish on the scheduler's thread, in any order
            if self.enabled and e.version not in self.shown:
                self.shown.add(e.version)
                self.emit(progress_figures(learner, scheduler, e, self.rate_until(e), self.mismatch))

    def rate_until(self, evaluation) -> float:
        """Rollouts a second from this process's start until ``evaluation`` was asked."""
        started = time.time() - (time.perf_counter() - self.t0)
        return (evaluation.rollouts_generated - self.rollouts_before) / max(evaluation.started_at - started, 1e-9)

    def emit_progress(self, step: int, rollouts: str) -> None:
        seconds = time.perf_counter() - self.t0
        bound = f"{seconds:.0f} of {self.max_seconds:.0f} s" if self.max_seconds else f"{seconds:.0f} s"
        print(f"learner steps {step}/{self.total_steps}  {bound}  {rollouts}", file=sys.stderr, flush=True)
        self.last_line_at = time.perf_counter()

    def emit(self, figures: dict) -> None:
        if self.fmt == "json":
            print(json.dumps({"event": "evaluation", **figures}), file=sys.stderr, flush=True)
            return
        line = (f"step {figures['step']:>5}  rollouts {figures['rollouts']:>8,} ({figures['rollouts_per_s']:,.0f}/s)  "
                + known("reward", figures["reward"], ".3f") + known("entropy", figures["entropy"], ".2f")
                + f"held-out {figures['heldout_accuracy']:.3f}  " + known("zero-signal", figures["zero_signal_share"], ".2f")
                + f"replay {figures['replay_share']:.2f}  stale {figures['stale_dropped']}" + mismatch_text(figures))
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)
        self.last_line_at = time.perf_counter()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "it"):
    """A tqdm bar on a terminal; elsewhere a plain line every ``PLAIN_PROGRESS_S`` and at the end."""
    from tqdm import tqdm

    if enabled and not sys.stderr.isatty():
        return PlainProgress(total, desc, unit)
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=not enabled)


class PlainProgress:
    """What a long offline job says of its progress where a bar would be one line of redraws."""

    def __init__(self, total: int, desc: str, unit: str):
        self.total, self.desc, self.n = total, desc, 0
        self.units = unit + ("es" if unit.endswith(("ch", "s", "x")) else "s")
        self.t0 = self.said_at = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.said_at >= PLAIN_PROGRESS_S:
            self.say()

    def say(self) -> None:
        print(f"{self.desc}: {self.n:,}/{self.total:,} {self.units}  {time.perf_counter() - self.t0:.0f} s", file=sys.stderr,
              flush=True)
        self.said_at = time.perf_counter()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.say()


def known(name: str, value: float | None, fmt: str) -> str:
    """A part of the line that only a step or a returned group makes known (none before)."""
    return "" if value is None else f"{name} {value:{fmt}}  "


def mismatch_text(figures: dict) -> str:
    """The line's mismatch part, naming its step when an earlier step measured it."""
    if figures["mismatch_kl"] is None:
        return ""
    at = "" if figures["mismatch_step"] == figures["step"] else f" (step {figures['mismatch_step']})"
    return f"  mismatch-KL {figures['mismatch_kl']:.1e}{at}"


def progress_figures(learner, scheduler, evaluation, rollouts_per_s: float, mismatch: tuple | None = None) -> dict:
    """One evaluation's line: its version and accuracy, the rollouts generated until it was asked
    and their rate, how the run stands when it is shown (the last step's reward and the policy's
    entropy on its fresh rollouts among it), and the newest engine-trainer mismatch at age 0
    with the step that measured it (None: not yet)."""
    stats = getattr(learner, "last_stats", {})
    returned = scheduler.groups_returned
    stale = learner.counters.get("stale_dropped", 0) + sum(
        v for k, v in scheduler.counters.items() if k.startswith("stale_groups_dropped/"))
    return {"step": evaluation.version, "rollouts": evaluation.rollouts_generated,
            "rollouts_per_s": max(0.0, rollouts_per_s),
            "reward": stats.get("mean_reward"), "entropy": stats.get("fresh/entropy", stats.get("entropy")),
            "heldout_accuracy": evaluation.figures["accuracy"],
            "zero_signal_share": 1 - scheduler.groups_with_signal / returned if returned else None,
            "replay_share": stats.get("replay_share", 0.0), "stale_dropped": stale,
            "mismatch_kl": mismatch[0] if mismatch else None, "mismatch_step": mismatch[1] if mismatch else None}


def summary_table(summary: dict, files: list[str]) -> str:
    """The end of a run, for people: time, steps, held-out accuracy per difficulty, files."""
    first = summary.get("first_step", 0)
    steps = f"steps {first} -> {summary['steps']} (continued from its checkpoint)" if first else f"{summary['steps']} steps"
    how = f"stopped by {summary['interrupted_by']} after" if summary.get("interrupted_by") else "finished in"
    lines = [f"prl run {how} {summary['seconds']:.0f} s: {steps}, {summary['rollouts_generated']:,} rollouts generated"]
    if summary.get("interrupted_by"):
        lines.append(f"  checkpoint of step {summary['steps']} written; the same command continues from it"
                     if summary["steps"] else "  nothing trained yet; the same command starts again")
    start, end = summary.get("start", {}), summary.get("end", {})
    keys = [k for k in end if k.startswith("accuracy")]
    keys = keys if len(keys) > 2 else keys[:1]  # one difficulty (a dataset without levels): its row is the overall one
    if keys:  # a continued run has no start column: its checkpoint is not evaluated again
        at = summary.get("evaluated_at", summary["steps"])
        end_label = "end" if at == summary["steps"] else f"step {at}"  # an interrupted run: its last evaluation
        lines.append(f"  {'held-out accuracy':<22}" + (f"{'start':>8}" if start else "") + f"{end_label:>8}")
        for k in keys:
            label = "overall" if k == "accuracy" else f"difficulty {k.rsplit('_d', 1)[-1]}"
            lines.append(f"  {label:<22}" + (f"{start.get(k, float('nan')):>8.3f}" if start else "") + f"{end[k]:>8.3f}")
    lines.append("wrote " + ", ".join(files))
    return "\n".join(lines)
