"""`prl scheduler|producer|learner`: one service over Kafka (a deployment, or services started
by hand on one machine), until the run is finished (exit 0, or with --when-finished wait, as in
a pod, wait for SIGTERM), until SIGTERM or Ctrl-C (the current step finishes; a second stops at
once) or until it cannot go on (one line, exit 2: prl/cli/__init__.py). Each writes its metrics to
<run_dir>/metrics-<service>.jsonl (a producer's file is named after its id)."""

from __future__ import annotations

from prl.cli.interrupt import Interrupt
from prl.devices import limit_heap_fragmentation
from prl.service import Service


def command(args, cfg) -> int:
    from prl.metrics import MetricsSink
    from prl.storage import check_writable
    from prl.trackers import make_trackers
    from prl.transport import make_transport
    from prl.transport.memory import MemoryTransport

    name = args.command
    if cfg.task.environment:
        limit_heap_fragmentation()
    check_writable(cfg.run.run_dir)
    offline = name == "learner" and args.batches_from  # trains from a file: no broker needed
    transport = MemoryTransport() if offline else make_transport(cfg.transport)
    transport.ensure_topics(cfg.run.name)
    if name == "producer":  # several share a run directory: each file is named after its producer
        from prl.producers.service import default_producer_id

        args.id = args.id or default_producer_id()
    filename = f"metrics-{name}-{args.id}.jsonl" if name == "producer" else f"metrics-{name}.jsonl"
    metrics = MetricsSink(cfg.run.run_dir, filename=filename, trackers=make_trackers(cfg, name))
    service = make_service(name, cfg, transport, metrics, args)
    if name == "learner":  # the run's owner, once it started: commands given its directory alone start from this config
        from prl.cli import keep_config

        keep_config(cfg)
    try:
        with Interrupt(json_lines=cfg.run.log_format == "json") as interrupt:  # a second Ctrl-C stops at once
            service.run(interrupt.event, http=args.http or "", when_finished=args.when_finished)
    finally:
        metrics.close()
    return 0


class Finished(Service):
    """What a service started on a run its scheduler has declared finished at
    ``learner.max_steps`` runs instead: no model, snapshot or checkpoint loaded (a producer's
    engine takes minutes on a GPU); it finishes at its first step."""

    def __init__(self, name: str, cfg, transport, metrics):
        self.name = name
        super().__init__(cfg, transport, metrics)

    def step(self) -> bool:
        return True


def make_service(name: str, cfg, transport, metrics, args) -> Service:
    from prl.ending import finished_version

    if (done := finished_version(cfg.run.run_dir)) >= cfg.learner.max_steps:
        service = Finished(name, cfg, transport, metrics)
        service.log.info("run_already_finished", learner_version=done,
                         fix="raise learner.max_steps to train on; each service continues from its checkpoint or snapshot")
        return service
    if name == "scheduler":
        from prl.scheduler.service import Scheduler

        return Scheduler(cfg, transport, metrics)
    if name == "producer":
        from prl.producers.service import Producer

        return Producer(cfg, transport, metrics, producer_id=args.id)
    from prl.learner.service import Learner

    return Learner(cfg, transport, metrics, batches_from=args.batches_from)
