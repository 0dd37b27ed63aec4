"""`prl run`: the whole pipeline in one process on the in-memory transport.

Scheduler, producer and learner run as threads over one in-process broker, exactly the
code that runs as separate services over Kafka. The run directory receives the
checkpoints, metrics.jsonl and learning_curve.png.
"""

from __future__ import annotations

import threading
import time

import structlog

from prl.metrics import MetricsSink, read_metrics
from prl.plots import learning_curve
from prl.service import ServiceStopped
from prl.transport.memory import MemoryBroker, MemoryTransport

log = structlog.get_logger("run")


def run_pipeline(cfg, progress: bool = True, max_rollouts: int | None = None, max_seconds: float | None = None) -> dict:
    """Run until the learner reaches ``learner.max_steps``, or has trained on batches that
    took ``max_rollouts`` generated rollouts, or ``max_seconds`` of wall time are nearly up
    (the final evaluation included: training stops one evaluation's duration before the
    limit); then evaluate once more. Return start/end accuracy and where the time went."""
    from learner.service import Learner
    from producers.service import Producer
    from scheduler.service import Scheduler

    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    metrics = MetricsSink(cfg.run.run_dir)
    t0 = time.perf_counter()
    learner = Learner(cfg, transport, metrics)
    start = dict(getattr(learner, "last_eval", {}))
    services = [Scheduler(cfg, transport, metrics), Producer(cfg, transport, metrics)]
    stop = threading.Event()
    failures: list[BaseException] = []
    threads = [threading.Thread(target=_guarded, args=(s, stop, failures), name=s.name, daemon=True) for s in services]
    for t in threads:
        t.start()
    bar = _progress(cfg.learner.max_steps, learner.version) if progress else None
    try:
        while not stop.is_set():
            done = learner.step()
            if bar is not None:
                bar.n = learner.version
                bar.set_postfix(acc=f"{learner.last_eval.get('accuracy', 0):.3f}" if hasattr(learner, "last_eval") else "-")
                bar.refresh()
            if _budget_spent(learner, t0, max_rollouts, max_seconds):
                if cfg.learner.eval_every and learner.heldout and learner.version % cfg.learner.eval_every:
                    learner.evaluate()
                break
            if done:
                break
    finally:
        stop.set()
        learner.close()
        for t in threads:
            t.join(timeout=30)
        if bar is not None:
            bar.close()
    if failures:
        raise failures[0]
    rows = read_metrics(metrics.path)
    learning_curve(rows, cfg.run.run_dir.rstrip("/") + "/learning_curve.png")
    end = dict(getattr(learner, "last_eval", {}))
    summary = {
        "steps": learner.version,
        "seconds": round(time.perf_counter() - t0, 1),
        "rollouts_generated": learner.rollouts_generated,
        "accuracy_start": start.get("accuracy"),
        "accuracy_end": end.get("accuracy"),
        "start": start,
        "end": end,
    }
    log.info("run_finished", **{k: v for k, v in summary.items() if not isinstance(v, dict)})
    return summary


def _budget_spent(learner, t0: float, max_rollouts: int | None, max_seconds: float | None) -> bool:
    if max_rollouts is not None and learner.rollouts_generated >= max_rollouts:
        return True
    if max_seconds is None:
        return False
    final_eval = getattr(learner, "last_eval", {}).get("eval_seconds", 0.0)
    return time.perf_counter() - t0 + final_eval >= max_seconds


def _guarded(service, stop: threading.Event, failures: list) -> None:
    """Run a service thread; if it fails, stop the whole run (instead of hanging) and keep
    the error for the caller."""
    try:
        service.run(stop)
    except ServiceStopped as exc:
        log.error("service_stopped", service=service.name, reason=str(exc))
        failures.append(exc)
        stop.set()
    except BaseException as exc:
        log.exception("service_failed", service=service.name)
        failures.append(exc)
        stop.set()


def _progress(total: int, initial: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="learner steps", unit="step", dynamic_ncols=True)
