"""`prl run`: the whole pipeline in one process on the in-memory transport.

Scheduler, producer and learner run as threads over one in-process broker, exactly the
code that runs as separate services over Kafka. The run directory receives the
checkpoints, metrics.jsonl and learning_curve.png.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import fsspec
import structlog

from prl import logs
from prl.cli import fixable, keep_config
from prl.cli.console import Console, summary_table
from prl.cli.interrupt import Interrupt
from prl.devices import limit_heap_fragmentation
from prl.errors import UsageError, one_line
from prl.metrics import MetricsSink, read_run_metrics
from prl.plots import learning_curve, priority_histogram
from prl.scheduler.evaluation import MAX_ATTEMPTS
from prl.storage import check_writable
from prl.trackers import make_trackers
from prl.transport.memory import MemoryBroker, MemoryTransport

log = structlog.get_logger("run")


LOCAL_PRODUCER = "local"  # the one producer's name: a rerun of one run.seed samples the same stream
OUTPUTS = ("learning_curve.png", "priority_histogram.png", "summary.json")  # made again by every run
FINISH_S = 60.0  # how long the scheduler may take for its last snapshot before the run stops it
STOP_WAIT_S = 30.0  # how long a stopped service's call in progress is waited for


def command(args, cfg) -> int:
    """`prl run`: the pipeline in one process; a bar and one line per evaluation on the
    console, a summary table at the end, the summary as JSON in <run_dir>/summary.json."""
    check_writable(cfg.run.run_dir)
    done = checkpoint_step(cfg.run.run_dir)
    if done is not None and done >= cfg.learner.max_steps:  # nothing to train: keep the finished run's summary
        raise UsageError(f"{cfg.run.run_dir} holds a checkpoint of step {done}, at or past learner.max_steps "
                         f"{cfg.learner.max_steps}: raise --max-steps to continue that run, or give a new --run-dir")
    native_log = None if args.verbose else run_log(cfg.run.run_dir)  # torch's and vLLM's C++ warnings go there
    with Interrupt(json_lines=cfg.run.log_format == "json") as interrupt, logs.native_output_to(native_log):
        summary = run_pipeline(cfg, progress=not args.no_progress, stop=interrupt.event,
                               max_seconds=args.max_minutes * 60 if args.max_minutes else None)
    summary["interrupted_by"] = interrupt.signal_name
    run_dir = cfg.run.run_dir.rstrip("/")
    with fsspec.open(f"{run_dir}/summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    if cfg.run.log_format == "json":
        print(json.dumps({"event": "run_finished", **summary}), file=sys.stderr)
    else:
        fs, root = fsspec.core.url_to_fs(run_dir)
        files = [f"{run_dir}/{name}" for name in OUTPUTS if fs.exists(f"{root}/{name}")]  # no curve without evaluation
        log_file = f"{run_dir}/prl.log" if run_log(cfg.run.run_dir) else "the log"  # as the user wrote the directory
        print(summary_table(summary, files) + f"; details in {log_file}", file=sys.stderr)
    return interrupt.exit_code


def run_log(run_dir: str) -> str | None:
    """Where `prl run` writes its log: <run_dir>/prl.log on a local disk (None on object stores)."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return f"{path.rstrip('/')}/prl.log" if local else None


def checkpoint_step(run_dir: str) -> int | None:
    """The step of the run directory's latest checkpoint (None: none, or one the learner will
    have to judge)."""
    from prl.learner.checkpoint import latest_uri, read_state
    from prl.storage import StorageError

    try:
        uri = latest_uri(run_dir)
        return int(read_state(uri)["step"]) if uri else None
    except (StorageError, ValueError, KeyError, TypeError):
        return None


def clear_outputs(run_dir: str) -> None:
    """Remove what an earlier run in this directory drew or summarised (it would be stale)."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    for name in OUTPUTS:
        if fs.exists(f"{path.rstrip('/')}/{name}"):
            fs.rm(f"{path.rstrip('/')}/{name}")


def run_pipeline(cfg, progress: bool = True, max_rollouts: int | None = None, max_seconds: float | None = None,
                 stop: threading.Event | None = None) -> dict:
    """Run until the learner reaches ``learner.max_steps``, or has trained on batches that
    took ``max_rollouts`` generated rollouts, or ``max_seconds`` of wall time are nearly up
    (training stops one step and one evaluation before the limit); then have the fleet
    evaluate the last version and stop the scheduler and producer. ``stop`` ends it after the
    current step, with a checkpoint of that step and no final evaluation. Return start/end
    accuracy."""
    if cfg.task.environment:
        limit_heap_fragmentation()
    metrics = MetricsSink(cfg.run.run_dir, trackers=make_trackers(cfg, "run"))
    budget = Budget(max_rollouts, max_seconds)
    learner, scheduler, producer = services(cfg, metrics)
    keep_config(cfg)  # once it started: a start that failed (a typo in a --set) leaves the directory as it was
    clear_outputs(cfg.run.run_dir)
    first_step = learner.version  # a continued run starts past 0
    background = Background([scheduler, producer])
    console = Console(cfg.learner.max_steps, learner.version, cfg.run.log_format, enabled=progress, max_seconds=max_seconds,
                      rollouts_before=scheduler.rollouts_generated,
                      evaluated_before=tuple(e.version for e in scheduler.evaluator.done()))
    console.t0 = budget.t0  # the wall time counts from the start, model loading included
    stop = stop or threading.Event()
    ended = False
    try:
        train(learner, scheduler, background, budget, console, stop)
        wind_down(cfg, learner, scheduler, producer, background, console, stop.is_set())
        ended = True
    finally:
        console.close()
        background.stop()
        learner.close()
        metrics.close()
        if not ended or background.failures:
            draw_what_ran(cfg, scheduler)
    if background.failures:
        raise background.failures[0]
    draw(cfg, scheduler)
    summary = summarize(learner, scheduler, first_step, budget.elapsed())
    log.info("run_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
    return summary


def services(cfg, metrics):
    """The learner, scheduler and producer over one in-process broker. The broker is new: what
    an earlier `prl run` of the directory had in flight or sent ahead went with its process, and
    the scheduler and learner are told so (rather than wait for it)."""
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    learner = Learner(cfg, transport, metrics)
    scheduler = Scheduler(cfg, transport, metrics, new_broker=True)
    learner.pass_over_batches_through(scheduler.lost_seq)
    producer = Producer(cfg, transport, metrics, producer_id=LOCAL_PRODUCER, beside_learner=True)
    return learner, scheduler, producer


def wind_down(cfg, learner, scheduler, producer, background: "Background", console: Console, stopped: bool) -> None:
    """The fleet evaluates the version the run ended at (unless it was stopped) and generates
    nothing else, the generators stop, and the last step is checkpointed whole, however the run
    ended: the same command continues from it, and `prl model export` reads it without a chain
    of deltas."""
    if not stopped:
        producer.answer_evaluations_only()
        learner.announce_written(wait=True)  # versions are written in the background
        evaluating = bool(cfg.learner.eval_every and scheduler.heldout)
        # Its snapshot holds the last evaluation: a continued run does not repeat it.
        scheduler.ask_to_finish(evaluate=learner.version if evaluating else None)
        if evaluating:
            wait_for_evaluation(cfg, learner, scheduler, background, console)
        background.join(scheduler, timeout=FINISH_S)
    background.stop()
    if learner.saved_version != learner.version:
        learner.save()


def wait_for_evaluation(cfg, learner, scheduler, background: "Background", console: Console) -> None:
    """Wait for the fleet's answers for the version the run ended at (its budget's, or the last
    step's) and any earlier evaluation's still out, at most as long as the scheduler waits for them."""
    version, evaluator = learner.version, scheduler.evaluator
    patience = time.monotonic() + cfg.scheduler.dispatch_timeout_s * MAX_ATTEMPTS
    while not (evaluator.settled(version, started=True) and not evaluator.running()) \
            and background.alive() and time.monotonic() < patience:
        background.stopped.wait(0.05)  # the scheduler's thread finishes the evaluations
    console.update(learner, scheduler)


def draw(cfg, scheduler) -> None:
    run_dir = cfg.run.run_dir.rstrip("/")
    learning_curve(read_run_metrics(run_dir), f"{run_dir}/learning_curve.png")
    priority_histogram(scheduler.sampler.priorities(), scheduler.sampler.success_rates(), f"{run_dir}/priority_histogram.png",
                       f"scheduler at the end ({cfg.scheduler.strategy})")


def draw_what_ran(cfg, scheduler) -> None:
    """A run that failed still leaves the curves of what it did (a continued run had removed the
    earlier ones); a failure to draw them is logged, the run's own failure is what is raised."""
    try:
        draw(cfg, scheduler)
    except Exception as exc:
        log.warning("curves_not_drawn", error=one_line(exc))


def summarize(learner, scheduler, first_step: int, seconds: float) -> dict:
    """What the run did: steps (from ``first_step``, past 0 for a run continued from its
    checkpoint), rollouts generated (the scheduler's count: the learner's is the last trained
    batch's, fewer than an evaluation line shows), held-out accuracy at the first and the newest
    version evaluated."""
    done = {e.version: e.figures for e in scheduler.evaluator.done()}
    start, evaluated_at = done.get(first_step, {}), max(done, default=-1)
    end = done.get(evaluated_at, {})
    return {"steps": learner.version, "first_step": first_step, "evaluated_at": evaluated_at, "seconds": round(seconds, 1),
            "rollouts_generated": scheduler.rollouts_generated,
            "accuracy_start": start.get("accuracy"), "accuracy_end": end.get("accuracy"), "start": start, "end": end}


def train(learner, scheduler, background: "Background", budget: "Budget", console: Console, stop: threading.Event) -> None:
    """Step the learner until it is done, a background service stops, ``stop`` is set, or the
    budget is spent."""
    while not background.stopped.is_set() and not stop.is_set():
        done = learner.step()
        budget.observe(learner.version)
        console.update(learner, scheduler)
        if done or budget.spent(learner, scheduler):
            return


class Budget:
    """When to stop: a rollout count, or wall time less what one more step, the final
    evaluation and the last checkpoint will take (each as long as the last of its kind)."""

    def __init__(self, max_rollouts: int | None, max_seconds: float | None):
        self.max_rollouts, self.max_seconds = max_rollouts, max_seconds
        self.t0 = time.perf_counter()
        self.version, self.version_at, self.step_seconds = -1, self.t0, 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def observe(self, version: int) -> None:
        if version != self.version:
            now = time.perf_counter()
            if self.version >= 0:
                self.step_seconds = now - self.version_at
            self.version, self.version_at = version, now

    def spent(self, learner, scheduler) -> bool:
        if self.max_rollouts is not None and learner.rollouts_generated >= self.max_rollouts:
            return True
        if self.max_seconds is None:
            return False
        done = scheduler.evaluator.done()
        final_eval = done[-1].figures["eval_seconds"] if done else 0.0
        return self.elapsed() + self.step_seconds + final_eval + learner.checkpoint_seconds >= self.max_seconds


class Background:
    """The scheduler and producer, each on a thread; a failure stops the whole run. A thread
    still in its call STOP_WAIT_S after the stop (a producer's generation call is not
    interrupted) is left to end with the process: what it raises then is not a failure."""

    def __init__(self, services: list):
        self.stopped, self.abandoned = threading.Event(), threading.Event()
        self.failures: list[BaseException] = []
        self.services = services
        self.threads = [threading.Thread(target=_guarded, args=(s, self.stopped, self.failures, self.abandoned),
                                         name=s.name, daemon=True) for s in services]
        for t in self.threads:
            t.start()

    def join(self, service, timeout: float) -> None:
        """Wait for ``service`` to finish on its own (at most ``timeout`` seconds)."""
        self.threads[self.services.index(service)].join(timeout)

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads) and not self.stopped.is_set()

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=STOP_WAIT_S)
        left = [t.name for t in self.threads if t.is_alive()]
        if left and not self.abandoned.is_set():
            self.abandoned.set()
            log.warning("services_left_running", services=left, waited_s=STOP_WAIT_S,
                        why="still in a call at the stop (a generation call is not interrupted); they end with the process")


def _guarded(service, stop: threading.Event, failures: list, abandoned: threading.Event) -> None:
    """Run a service thread; if it fails, stop the whole run (instead of hanging) and keep
    the error for the caller, unless the run had left it running at its end."""
    try:
        service.run(stop)
    except BaseException as exc:
        if abandoned.is_set():  # the process is ending under it (vLLM shuts its engine down at exit)
            log.info("left_service_ended", service=service.name, error=one_line(exc))
            return
        if fixable(exc):  # the person's to fix (ServiceStopped, a full disk, ...): no traceback
            log.error("service_stopped", service=service.name, reason=one_line(exc))
        else:
            log.exception("service_failed", service=service.name)
        failures.append(exc)
        stop.set()


