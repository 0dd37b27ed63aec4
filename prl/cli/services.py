"""`prl scheduler|producer|learner`: one service over the configured transport (Kafka in
a deployment), until SIGTERM (the current step finishes) or until it cannot go on (one line,
exit 2: prl/cli/__init__.py)."""

from __future__ import annotations

import signal
import threading


def command(args, cfg) -> int:
    from prl.metrics import MetricsSink
    from prl.storage import check_writable
    from prl.trackers import make_trackers
    from prl.transport import make_transport, require_shared

    name = args.command
    if not (name == "learner" and cfg.learner.batches_from):  # an offline learner needs no one
        require_shared(cfg.transport, ", or run the whole pipeline in one process with `prl run`")
    check_writable(cfg.run.run_dir)
    transport = make_transport(cfg.transport)
    transport.ensure_topics(cfg.run.name)
    metrics = MetricsSink(cfg.run.run_dir, filename=f"metrics-{name}.jsonl", trackers=make_trackers(cfg, name))
    service = service_class(name)(cfg, transport, metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        service.run(stop, http_port=cfg.run.http_port, http_host=cfg.run.http_host)
    finally:
        metrics.close()
    return 0


def service_class(name: str):
    if name == "scheduler":
        from prl.scheduler.service import Scheduler

        return Scheduler
    if name == "producer":
        from prl.producers.service import Producer

        return Producer
    from prl.learner.service import Learner

    return Learner
