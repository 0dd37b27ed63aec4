"""`prl scheduler|producer|learner`: one service over the configured transport (Kafka in
a deployment), until SIGTERM (the current step finishes) or until it cannot go on."""

from __future__ import annotations

import signal
import sys
import threading


def command(args, cfg) -> int:
    from prl.metrics import MetricsSink
    from prl.service import ServiceStopped
    from prl.storage import StorageError, check_writable
    from prl.transport import TransportError, make_transport

    name = args.command
    try:
        check_writable(cfg.run.run_dir)
        transport = make_transport(cfg.transport)
        transport.ensure_topics(cfg.run.name)
        service = service_class(name)(cfg, transport, MetricsSink(cfg.run.run_dir, filename=f"metrics-{name}.jsonl"))
    except (StorageError, TransportError, ServiceStopped) as exc:
        print(f"prl {name}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        service.run(stop, http_port=cfg.run.http_port, http_host=cfg.run.http_host)
    except ServiceStopped as exc:
        print(f"prl {name}: {exc}", file=sys.stderr)
        return 1
    return 0


def service_class(name: str):
    if name == "scheduler":
        from scheduler.service import Scheduler

        return Scheduler
    if name == "producer":
        from producers.service import Producer

        return Producer
    from learner.service import Learner

    return Learner
