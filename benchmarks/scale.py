"""`prl bench scale`: how many producers one scheduler keeps up with, on this machine.

The real scheduler (`prl scheduler`, its own process) on the real broker (tansu), fed by
simulated producers (threads of ``--producer-processes`` helper processes): consumer-group
members that answer each dispatch with a synthetic rollout group (G rollouts of ``--tokens``
completion tokens with log-probs, a realistic mix of all-wrong, all-right and mixed rewards)
after a simulated generation time, stamped with the newest version the learner announced; and
a learner that only acknowledges (its own process; it announces a new version per batch). The
producer count is ramped until the scheduler falls behind (the groups it has not accepted yet
keep growing); where it keeps up at every step, the summary says so: the simulated producers
capped the offer, and the sustained figure is a floor of what the scheduler carries.
Reported per step: groups/s and MB/s offered and accepted, the scheduler's CPU per group and
where its time goes (decode, statistics, compose and replay, encode, Kafka I/O, snapshots),
the cores each process used, dispatch latency p50/p99 (issued -> readable by any producer,
seen by a reader in its own process outside the producers' group, and the scheduler's side of it,
issued -> acknowledged by the broker, from its histogram; the time a dispatch then
queues for a busy producer is reported apart, it depends on ``--max-in-flight``, not on the
scheduler); and raw kafka-python moving the same bytes (one producer, one consumer) as the
ceiling, and a raw kafka-python probe (small messages, publish -> consume, its own process)
running through the ramp: the broker's latency under the same load. The ramp runs once per mode in the same invocation, on the same broker: batches that
copy the rollouts or claim-check them (references the learner fetches), each with producers
sending every completion or groups without a signal as their rewards only, so bytes per
trained rollout and throughput are compared side by side."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import count, output_file, positive, write_json
from prl.metrics import bucket_quantile
from prl.transport.kafka import FETCH_MAX_WAIT_MS  # the raw latency probe waits as the services' consumers do

SPAWN = multiprocessing.get_context("spawn")  # helper processes start clean, without the producers' threads
REWARD_MIX = ((0.5, [0.0] * 8), (0.2, [1.0] * 8), (0.3, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]))  # wrong, right, mixed


class Templates:
    """Pre-built rollouts (random tokens and log-probs) reused for every simulated group;
    with ``rewards_only``, groups without a signal carry their rewards only, as producers
    send them with producer.drop_zero_signal_completions."""

    def __init__(self, tokens: int, group_size: int, rewards_only: bool, seed: int = 0):
        from prl.producers.service import rewards_only as strip
        from prl.formulas import has_signal
        from prl.schemas import Rollout

        rng = np.random.default_rng(seed)
        self.prompt = rng.integers(3, 16, 40, dtype=np.int32)
        self.by_mix = [[Rollout(rng.integers(3, 16, tokens, dtype=np.int32), -rng.random(tokens, dtype=np.float32) - 0.01,
                                r, "length", "") for r in rewards[:group_size]] for _, rewards in REWARD_MIX]
        if rewards_only:
            self.by_mix = [g if has_signal([r.reward for r in g]) else strip(g) for g in self.by_mix]
        self.weights = np.array([w for w, _ in REWARD_MIX])

    def group(self, d, version: int, producer_id: str, rng):
        from prl.schemas import RolloutGroup

        rollouts = self.by_mix[int(rng.choice(len(self.by_mix), p=self.weights))]
        return RolloutGroup(d.dispatch_id, d.problem_id, version, producer_id, self.prompt, d.sampling.temperature,
                            rollouts, 0.05, 0.0, time.time())


class PolicyFollower(threading.Thread):
    """The newest version the learner announced, as every producer follows it (real producers
    load each announced version and stamp their groups with it)."""

    def __init__(self, transport, run: str):
        super().__init__(daemon=True, name="policy-follower")
        from prl.schemas.topics import POLICY, topic_name

        self.sub = transport.subscriber([topic_name(run, POLICY)], group=None, from_beginning=True)
        self.version = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from prl.schemas import PolicyVersion, decode

        while not self.stop.is_set():
            for m in self.sub.poll(0.2):
                self.version = max(self.version, decode(m.value, PolicyVersion).version)
        self.sub.close()


class SimProducer(threading.Thread):
    """One simulated generation pod: takes up to ``per_call`` dispatches, "generates" for
    ``call_s``, publishes one group per dispatch, commits."""

    def __init__(self, transport, run: str, name: str, templates: Templates, policy: PolicyFollower, per_call: int,
                 call_s: float, stats: dict):
        super().__init__(daemon=True, name=name)
        from prl.schemas.topics import PROBLEMS, ROLLOUTS, topic_name

        self.sub = transport.subscriber([topic_name(run, PROBLEMS)], group=f"{run}.producers")
        self.pub = transport.publisher()
        self.rollouts_topic = topic_name(run, ROLLOUTS)
        self.templates, self.policy, self.per_call, self.call_s, self.stats = templates, policy, per_call, call_s, stats
        self.stop = threading.Event()
        self.rng = np.random.default_rng(hash(name) % 2**32)

    def run(self) -> None:
        from prl.schemas import Dispatch, decode, encode, headers

        while not self.stop.is_set():
            msgs = self.sub.poll(0.2, max_records=self.per_call)
            if not msgs:
                continue
            taken = time.time()
            dispatches = [decode(m.value, Dispatch) for m in msgs]
            self.stats["latency"] += [taken - d.issued_at for d in dispatches]
            version = self.policy.version  # the weights this call generates with
            time.sleep(self.call_s)  # generation
            for d in dispatches:
                value = encode(g := self.templates.group(d, version, self.name, self.rng))
                self.pub.publish(self.rollouts_topic, value, key=d.problem_id.encode(), headers=headers(g))
                self.stats["groups"] += 1
                self.stats["bytes"] += len(value)
            self.pub.flush()
            self.sub.commit()
        self.sub.close()
        self.pub.close()


LEARNER_COUNTERS = ("batches", "trained_rollouts", "batch_bytes", "fetched_bytes", "cached_bytes")


def quiet() -> None:
    """Warnings and errors only on the console (kafka-python's: errors only, its raw clients
    here warn about what is meant); the benchmark prints its own figures."""
    import logging

    from prl import logs

    logs.configure("console", "warning")
    logging.getLogger("kafka").setLevel(logging.ERROR)


def running(stop, parent: int) -> bool:
    """A helper process goes on until told to stop or its parent is gone (killed)."""
    return not stop.is_set() and os.getppid() == parent


def watch_dispatches(config: str, stop, latencies) -> None:
    """Reads the problems topic outside the producers' group (every partition, from the end)
    and records how long each dispatch took from the scheduler's clock to being readable by
    any producer: the latency the scheduler and broker add, apart from queueing for a busy
    producer (which ``latency`` in SimProducer includes). Its own process, so the simulated
    producers' threads do not delay what it sees."""
    from prl.transport.kafka import KafkaTransport
    from prl.schemas import Dispatch, decode
    from prl.schemas.config import load_config
    from prl.schemas.topics import PROBLEMS, topic_name

    quiet()
    cfg, parent = load_config(config), os.getppid()
    sub = KafkaTransport(cfg.transport.kafka).subscriber([topic_name(cfg.run.name, PROBLEMS)], group=None, from_beginning=False)
    while running(stop, parent):
        seen = [time.time() - decode(m.value, Dispatch).issued_at for m in sub.poll(0.2, max_records=500)]
        if seen:
            latencies.put(seen)
    sub.close()


def acknowledge_batches(config: str, stop, counters, step_s: float = 0.0) -> None:
    """The learner that only acknowledges, in its own process: reads every batch (fetching
    claim-checked rollouts too), announces a version per batch, ``step_s`` after reading it
    (a training step's time); ``counters`` (shared, in LEARNER_COUNTERS order) add up what it read."""
    from prl.learner.service import FETCH_CACHE_BYTES
    from prl.learner.sources import GroupCache, resolve_batch
    from prl.transport.kafka import KafkaTransport
    from prl.schemas import PolicyVersion, decode, encode, headers
    from prl.schemas.config import load_config
    from prl.schemas.topics import BATCHES, POLICY, topic_name

    quiet()
    cfg, parent = load_config(config), os.getppid()
    transport = KafkaTransport(cfg.transport.kafka)
    sub = transport.subscriber([topic_name(cfg.run.name, BATCHES)], group=f"{cfg.run.name}.learner")
    pub, groups, version = transport.publisher(), GroupCache(transport.reader(), FETCH_CACHE_BYTES), 0
    while running(stop, parent):
        for m in sub.poll(0.2, max_records=1):
            batch, fetched, cached = resolve_batch(decode(m.value), groups, oldest_version=version - cfg.scheduler.tau_max)
            stop.wait(step_s)
            version += 1
            for i, n in enumerate((1, len(batch.rollouts), len(m.value), fetched, cached)):
                counters[i] += n
            record = PolicyVersion(version, "", batch.seq, time.time())
            pub.publish(topic_name(cfg.run.name, POLICY), encode(record), key=b"run", headers=headers(record))
            pub.flush()
            sub.commit()
    sub.close()
    pub.close()


class Side:
    """A helper process of the benchmark (the learner, the watcher, the probe, simulated
    producers), stopped by an event; ``target(config, stop_event, shared, *extra)``."""

    def __init__(self, target, config: Path, shared, *extra):
        self.stop_event = SPAWN.Event()
        self.proc = SPAWN.Process(target=target, args=(str(config), self.stop_event, shared, *extra), daemon=True)
        self.proc.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


def run_producers(config: str, stop, totals, commands, queued, ready, tokens: int, per_call: int, call_s: float) -> None:
    """A helper process of simulated producers: sets ``ready`` once it can start them, starts a
    SimProducer thread for each name a command brings, and every 0.1 s adds up what they sent
    into ``totals`` (groups, bytes) and passes on the times dispatches queued until taken."""
    import queue as queue_module

    from prl.transport.kafka import KafkaTransport
    from prl.schemas.config import load_config

    quiet()
    cfg, parent = load_config(config), os.getppid()
    transport = KafkaTransport(cfg.transport.kafka)
    templates = Templates(tokens, 8, cfg.producer.drop_zero_signal_completions)
    policy = PolicyFollower(transport, cfg.run.name)
    policy.start()
    threads: list[SimProducer] = []
    ready.set()
    while running(stop, parent):
        try:
            for name in commands.get(timeout=0.1):
                threads.append(SimProducer(transport, cfg.run.name, name, templates, policy, per_call, call_s,
                                           {"latency": [], "groups": 0, "bytes": 0}))
                threads[-1].start()
        except queue_module.Empty:
            pass
        totals[0], totals[1] = sum(t.stats["groups"] for t in threads), sum(t.stats["bytes"] for t in threads)
        waited = []
        for t in threads:  # taken from the front: the thread only appends
            seen = len(t.stats["latency"])
            waited += t.stats["latency"][:seen]
            del t.stats["latency"][:seen]
        if waited:
            queued.put(waited)
    for t in [*threads, policy]:
        t.stop.set()
    for t in [*threads, policy]:  # each closes its clients; at exit, kafka-python would close them under it
        t.join(5)


def producer_names(have: int, want: int, processes: int) -> list[list[str]]:
    """The names of producers ``have`` .. ``want - 1``, dealt round-robin to ``processes``."""
    return [[f"sim-{i}" for i in range(have, want) if i % processes == k] for k in range(processes)]


class ProducerPool:
    """The simulated producers, spread round-robin over ``processes`` helper processes so that
    the load they offer is not capped by one interpreter (real producers are pods of their own)."""

    def __init__(self, config: Path, processes: int, tokens: int, per_call: int, call_s: float, timeout_s: float = 120.0):
        self.queued, self.count = SPAWN.Queue(), 0  # times until taken, from every process
        self.sent = [SPAWN.Array("d", 2) for _ in range(processes)]  # each process's groups and bytes sent
        self.commands = [SPAWN.Queue() for _ in range(processes)]  # names of producers to start
        ready = [SPAWN.Event() for _ in range(processes)]
        self.sides = [Side(run_producers, config, sent, commands, self.queued, up, tokens, per_call, call_s)
                      for sent, commands, up in zip(self.sent, self.commands, ready)]
        self.pids = [side.proc.pid for side in self.sides]
        deadline = time.monotonic() + timeout_s
        for side, up in zip(self.sides, ready):  # imported and connected: steps measure producers, not start-up
            while not up.wait(0.2):
                if not side.proc.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"a simulated producers' process did not start within {timeout_s:.0f} s "
                                       f"(exit code {side.proc.exitcode})")

    def grow(self, producers: int) -> None:
        """Start producers until there are ``producers``."""
        for commands, names in zip(self.commands, producer_names(self.count, producers, len(self.sides))):
            if names:
                commands.put(names)
        self.count = max(self.count, producers)

    def totals(self) -> tuple[float, float]:
        """Groups and bytes sent so far, all processes (as of their last report, at most 0.1 s old)."""
        return sum(sent[0] for sent in self.sent), sum(sent[1] for sent in self.sent)

    def stop(self) -> None:
        for side in self.sides:
            side.stop()


def drain(queue) -> list[float]:
    """Every latency a helper process has put on ``queue`` so far."""
    import queue as queue_module

    out: list[float] = []
    while True:
        try:
            out += queue.get_nowait()
        except queue_module.Empty:
            return out


def cpu_seconds(pid: int | list[int]) -> float:
    """User + system CPU seconds of a process, or of several together (Linux /proc)."""
    if isinstance(pid, list):
        return sum(cpu_seconds(p) for p in pid)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def last_metrics(run_dir: Path) -> dict:
    """The scheduler's last complete metrics line ({} before its first batch). The scheduler is
    still running: a line it is writing at this moment has no newline yet and is not read."""
    path = run_dir / "metrics-scheduler.jsonl"
    text = path.read_text() if path.exists() else ""
    complete = text[: text.rfind("\n") + 1].splitlines()
    return json.loads(complete[-1]) if complete else {}


def scheduler_figures(run_dir: Path) -> dict:
    """The scheduler's last metrics line: groups accepted and seconds per phase."""
    last = last_metrics(run_dir)
    return {"accepted": last.get("scheduler/groups_returned", 0), "dispatched": last.get("scheduler/dispatched", 0),
            "dispatch_to_ack_ms": last.get("scheduler/dispatch_to_ack_ms", 0),
            "dispatch_to_ack_buckets": {k.rsplit("/", 1)[1]: v for k, v in last.items()
                                        if k.startswith("scheduler/dispatch_to_ack_ms_bucket/")},
            "seconds": {k.split("/", 2)[2]: v for k, v in last.items() if k.startswith("scheduler/seconds/")}}


MODES = ("copy", "claim_check", "copy+rewards_only", "claim_check+rewards_only")


POOL = (80, 8000, 20000, 20000)  # addition problems of 1-4 digits: a pool of 48,080


def write_config(path: Path, bootstrap: str, run: str, run_dir: Path, args, mode: str) -> Path:
    from tests.support.addition import small_addition
    from tests.support.servers import write_kafka_config

    (task,) = small_addition(path.parent / "pool", POOL)
    return write_kafka_config(
        path, bootstrap, run, str(run_dir),
        run={"log_format": "json"},
        transport={"kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000, "max_message_bytes": 64 << 20,
                             "partitions": max(args.producers)}},  # one partition per producer
        task={"train_path": task.split("=", 1)[1].strip('"')},
        sampling={"group_size": 8, "max_tokens": args.tokens},
        scheduler={"groups_per_batch": args.groups_per_batch, "max_in_flight": args.max_in_flight, "max_batches_ahead": 4,
                   "claim_check": mode.startswith("claim_check"), "dispatch_timeout_s": 600.0},
        producer={"drop_zero_signal_completions": mode.endswith("+rewards_only")},
        learner={"max_steps": 10**9},  # the simulated learner's versions never reach it
    )


def ramp(args, bootstrap: str, broker_pid: int | None, work: Path, mode: str) -> list[dict]:
    from tests.support.servers import Process
    from prl.transport.kafka import KafkaTransport
    from prl.schemas.config import load_config

    run, run_dir = f"scale{int(time.time())}{mode.replace('+', '')}", work / mode
    config = write_config(work / f"{mode}.toml", bootstrap, run, run_dir, args, mode)
    cfg = load_config(config)
    transport = KafkaTransport(cfg.transport.kafka)
    transport.ensure_topics(run)
    scheduler = Process([sys.executable, "-m", "prl.cli", "scheduler", "--config", str(config)], log_path=work / f"scheduler-{mode}.log")
    counters, latencies = SPAWN.Array("d", len(LEARNER_COUNTERS)), {"dispatch": SPAWN.Queue(), "probe": SPAWN.Queue()}
    learner, watcher = Side(acknowledge_batches, config, counters), Side(watch_dispatches, config, latencies["dispatch"])
    probe = Side(probe_broker, config, latencies["probe"])
    pool = ProducerPool(config, args.producer_processes, args.tokens, args.per_call, args.call_s)
    latencies["queued"] = pool.queued
    steps = []
    try:
        for producers in args.producers:
            pool.grow(producers)
            pids = {"scheduler": scheduler.proc.pid, "broker": broker_pid, "producers": pool.pids,
                    "learner": learner.proc.pid, "watcher": watcher.proc.pid, "probe": probe.proc.pid}
            steps.append(measure(pool, latencies, pids, run_dir, counters, args.seconds, producers))
            for name, side in (("learner", learner), ("watcher", watcher), ("probe", probe)):
                if not side.proc.is_alive():  # its figures would be zeros: stop, with its traceback above
                    raise RuntimeError(f"the benchmark's {name} process died (exit code {side.proc.exitcode})")
            print(f"{mode:>24} " + format_step(steps[-1]), flush=True)
            if len(steps) > 1 and all(behind(s) for s in steps[-2:]):
                break  # two steps in a row behind: groups pile up unaccepted
    finally:
        pool.stop()
        for side in (learner, watcher, probe):
            side.stop()
        scheduler.stop()
    return steps


def percentile_ms(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else None


def behind(step: dict) -> bool:
    """More than 10% of the offered groups were not accepted within the step."""
    return step["backlog_growth_per_s"] > 0.1 * step["offered_groups_per_s"]


def cores_used(pids: dict, before: dict, dt: float) -> dict:
    """CPU cores each process used over ``dt`` seconds (the broker's: none when not ours)."""
    return {name: (cpu_seconds(pid) - before[name]) / dt for name, pid in pids.items() if pid}


def measure(pool: ProducerPool, latencies: dict, pids: dict, run_dir: Path, counters, seconds: float, producers: int) -> dict:
    time.sleep(seconds / 3)  # settle after adding producers
    cpu_before = {name: cpu_seconds(p) for name, p in pids.items() if p}
    groups0, bytes0 = pool.totals()
    sched0, learner0 = scheduler_figures(run_dir), dict(zip(LEARNER_COUNTERS, counters[:]))
    for queue in latencies.values():
        drain(queue)
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    groups, nbytes = (now - before for now, before in zip(pool.totals(), (groups0, bytes0)))
    sched = scheduler_figures(run_dir)
    accepted = sched["accepted"] - sched0["accepted"]
    learner_stats, seen, probed = dict(zip(LEARNER_COUNTERS, counters[:])), drain(latencies["dispatch"]), drain(latencies["probe"])
    queued = drain(latencies["queued"])
    trained = learner_stats["trained_rollouts"] - learner0["trained_rollouts"]
    broker_bytes = nbytes + learner_stats["batch_bytes"] - learner0["batch_bytes"]
    cores = cores_used(pids, cpu_before, dt)
    ack_buckets = {b: n - sched0["dispatch_to_ack_buckets"].get(b, 0) for b, n in sched["dispatch_to_ack_buckets"].items()}
    return {
        "producers": producers, "offered_groups_per_s": groups / dt, "accepted_groups_per_s": accepted / dt,
        "backlog_growth_per_s": (groups - accepted) / dt, "MB_per_s_in": nbytes / dt / 1e6,
        "scheduler_cpu_per_s": cores["scheduler"], "cores_used": cores,
        "scheduler_cpu_ms_per_group": 1e3 * cores["scheduler"] * dt / max(1, accepted),
        "phase_seconds_per_s": {k: (v - sched0["seconds"].get(k, 0.0)) / dt for k, v in sched["seconds"].items()},
        "dispatch_latency_p50_ms": percentile_ms(seen, 0.5),
        "dispatch_latency_p99_ms": percentile_ms(seen, 0.99),
        "dispatch_latency_mean_ms": 1e3 * float(np.mean(seen)) if seen else None,
        "dispatch_to_ack_mean_ms": (sched["dispatch_to_ack_ms"] - sched0["dispatch_to_ack_ms"])
        / max(1, sched["dispatched"] - sched0["dispatched"]),  # the scheduler's part: issued -> acknowledged by the broker
        **{f"dispatch_to_ack_p{round(100 * q)}_ms": bucket_quantile(ack_buckets, q) for q in (0.5, 0.99)},
        "broker_probe_latency_p50_ms": percentile_ms(probed, 0.5), "broker_probe_latency_p99_ms": percentile_ms(probed, 0.99),
        "queued_until_taken_p50_ms": percentile_ms(queued, 0.5),
        "trained_rollouts_per_s": trained / dt,
        "broker_bytes_written_per_trained_rollout": broker_bytes / max(1, trained),
        "batch_bytes_per_trained_rollout": (learner_stats["batch_bytes"] - learner0["batch_bytes"]) / max(1, trained),
        "learner_fetched_bytes_per_trained_rollout": (learner_stats["fetched_bytes"] - learner0["fetched_bytes"]) / max(1, trained),
        "learner_cached_bytes_per_trained_rollout": (learner_stats["cached_bytes"] - learner0["cached_bytes"]) / max(1, trained),
    }


def format_step(s: dict) -> str:
    phases = " ".join(f"{k} {v:.2f}" for k, v in sorted(s["phase_seconds_per_s"].items()))
    return (f"{s['producers']:>4} producers: offered {s['offered_groups_per_s']:7.1f} groups/s ({s['MB_per_s_in']:6.1f} MB/s), "
            f"accepted {s['accepted_groups_per_s']:7.1f}/s, backlog +{s['backlog_growth_per_s']:.1f}/s, scheduler CPU "
            f"{s['scheduler_cpu_per_s']:.2f} cores ({s['scheduler_cpu_ms_per_group']:.2f} ms/group; {phases}), dispatch "
            f"latency p50/p99 {s['dispatch_latency_p50_ms'] or 0:.0f}/{s['dispatch_latency_p99_ms'] or 0:.0f} ms (raw probe "
            f"{s.get('broker_probe_latency_p50_ms') or 0:.0f}/{s.get('broker_probe_latency_p99_ms') or 0:.0f} ms; mean "
            f"{s['dispatch_latency_mean_ms'] or 0:.0f} ms, of which issued -> acknowledged {s['dispatch_to_ack_mean_ms']:.0f}, its p50/p99 <= "
            f"{s.get('dispatch_to_ack_p50_ms') or 0:.0f}/{s.get('dispatch_to_ack_p99_ms') or 0:.0f}; queued until "
            f"taken p50 {(s['queued_until_taken_p50_ms'] or 0) / 1e3:.1f} s), "
            f"{s['broker_bytes_written_per_trained_rollout'] / 1e3:.1f} kB written per trained rollout; cores used: "
            + ", ".join(f"{k} {v:.2f}" for k, v in s["cores_used"].items()))


def raw_ceiling(bootstrap: str, tokens: int, seconds_hint: int = 400) -> dict:
    """Raw kafka-python moving the same message bytes: one producer then one consumer."""
    from benchmarks.system import bench_kafka, rollout_groups

    groups = rollout_groups(seconds_hint, tokens, 8)
    out = bench_kafka(bootstrap, groups, 64 << 20, repeats=3)
    return {"raw_MB_per_s": out["raw_MB_per_s"], "raw_groups_per_s": out["raw_rollouts_per_s"] / 8,
            "prl_transport_MB_per_s": out["prl_MB_per_s"]}


def ramp_end(steps: list[dict]) -> str:
    """What ended a ramp: the scheduler falling behind, or (it kept up at every step) the
    simulated producers offering no more, so the sustained figure is a floor, not its limit."""
    late = [s for s in steps if behind(s)]
    if late:
        return f"the scheduler fell behind at {late[0]['producers']} producers"
    top = max(steps, key=lambda s: s["offered_groups_per_s"])
    return (f"the scheduler kept up at every step, so this is a floor: the offer peaked at "
            f"{top['offered_groups_per_s']:.0f} groups/s ({top['producers']} producers, using "
            f"{top['cores_used']['producers']:.2f} cores)")


def summary_line(mode: str, steps: list[dict], ceiling: dict) -> dict:
    """Prints the best sustained step of a ramp (the most groups accepted by a step that kept
    up; the best step if none did) against the raw ceiling and what ended the ramp; returns that
    step with ``ramp_end``."""
    kept_up = [s for s in steps if not behind(s)] or steps
    best = max(kept_up, key=lambda s: s["accepted_groups_per_s"]) | {"ramp_end": ramp_end(steps)}
    bytes_per_group = best["MB_per_s_in"] * 1e6 / max(1e-9, best["offered_groups_per_s"])
    against_raw = ("fewer bytes per group than the raw figure moves: not compared with it"
                   if mode.endswith("+rewards_only") else
                   f"raw kafka-python, same bytes: {ceiling['raw_MB_per_s']:.1f} MB/s ({ceiling['raw_groups_per_s']:.1f} "
                   f"groups/s) -> {best['accepted_groups_per_s'] / ceiling['raw_groups_per_s']:.2f}x raw (goal >= 0.5)")
    print(f"{mode}: sustained {best['accepted_groups_per_s']:.1f} groups/s "
          f"({best['accepted_groups_per_s'] * bytes_per_group / 1e6:.1f} MB/s) with {best['producers']} producers "
          f"({best['ramp_end']}); "
          f"{against_raw}; dispatch latency p99 "
          f"{best['dispatch_latency_p99_ms'] or 0:.0f} ms (the scheduler's side, issued -> acknowledged: p99 <= "
          f"{best.get('dispatch_to_ack_p99_ms') or 0:.0f} ms; goal < 100; raw kafka-python publish -> consume on this broker: "
          f"p99 {best['broker_probe_latency_p99_ms'] or 0:.0f} ms at that step, p50 {ceiling['raw_latency_p50_ms']:.0f} and "
          f"p99 {ceiling['raw_latency_p99_ms']:.0f} ms idle); "
          f"{best['broker_bytes_written_per_trained_rollout'] / 1e3:.1f} kB written per trained rollout")
    return best


def raw_probe(bootstrap: str, fetch_max_wait_ms: int, keep_going, interval_s: float = 0.02):
    """Raw kafka-python, publish + flush of a small message every ``interval_s`` -> a consumer
    of every partition of its own topic, while ``keep_going()``: yields the latencies each
    poll saw (the broker's own delivery latency, the floor under the dispatch latency)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"latency{time.time_ns()}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=fetch_max_wait_ms)
    consumer.assign([TopicPartition(topic, i) for i in range(4)])
    consumer.seek_to_end()
    consumer.poll(100)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)

    def send():
        while keep_going():
            producer.send(topic, str(time.time()).encode())
            producer.flush()
            time.sleep(interval_s)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        while keep_going():
            yield [time.time() - float(r.value) for records in consumer.poll(200).values() for r in records]
    finally:
        sender.join(5)
        producer.close()
        consumer.close()


def raw_latency(bootstrap: str, fetch_max_wait_ms: int, messages: int = 300, interval_s: float = 0.02) -> dict:
    """The raw probe on an otherwise idle broker, for ``messages`` messages."""
    latency: list[float] = []
    deadline = time.monotonic() + messages * interval_s * 3 + 10
    for seen in raw_probe(bootstrap, fetch_max_wait_ms, lambda: len(latency) < messages and time.monotonic() < deadline,
                          interval_s):
        latency += seen
    return {"raw_latency_p50_ms": percentile_ms(latency, 0.5), "raw_latency_p99_ms": percentile_ms(latency, 0.99)}


def probe_broker(config: str, stop, latencies) -> None:
    """The raw probe in its own process during the ramp: the broker's latency under the same
    load as the scheduler's dispatches."""
    from prl.schemas.config import load_config

    quiet()
    cfg, parent = load_config(config), os.getppid()
    kafka = cfg.transport.kafka
    for seen in raw_probe(kafka.bootstrap_servers, FETCH_MAX_WAIT_MS, lambda: running(stop, parent), interval_s=0.05):
        if seen:
            latencies.put(seen)


def compare_bytes(baseline: str, base_steps: list[dict], mode: str, steps: list[dict]) -> list[dict]:
    """Broker bytes written per trained rollout of two modes at each producer count both ran
    (the same offered load), printed and returned."""
    by_count = {s["producers"]: s for s in base_steps}
    rows = []
    for step in steps:
        if (base := by_count.get(step["producers"])) is None:
            continue
        old, new = base["broker_bytes_written_per_trained_rollout"], step["broker_bytes_written_per_trained_rollout"]
        if not old or not new:  # a step too short for either mode to train anything has no such figure
            continue
        rows.append({"producers": step["producers"], baseline: old, mode: new, "less": 1 - new / old,
                     "learner_fetched": step["learner_fetched_bytes_per_trained_rollout"],
                     "learner_cached": step["learner_cached_bytes_per_trained_rollout"]})
    print(f"all broker bytes written per trained rollout, {baseline} -> {mode} (goal >= 40% less): " + "; ".join(
        f"{r['producers']} producers {r[baseline] / 1e3:.1f} -> {r[mode] / 1e3:.1f} kB ({100 * r['less']:.0f}% less)"
        for r in rows))
    if baseline == mode.replace("claim_check", "copy"):
        print(f"{mode}: the learner fetched, per trained rollout (+ what its group cache saved fetching again): " + "; ".join(
            f"{r['producers']} producers {r['learner_fetched'] / 1e3:.1f} kB (+{r['learner_cached'] / 1e3:.1f})" for r in rows))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench scale", description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=count, nargs="+", default=[1, 2, 4, 8, 16, 32, 64], help="the ramp of simulated producers")
    ap.add_argument("--tokens", type=count, default=2000, help="completion tokens per rollout")
    ap.add_argument("--per-call", type=count, default=8, help="dispatches a simulated producer takes per generation call")
    ap.add_argument("--producer-processes", type=count, default=1,
                    help="helper processes the simulated producers are spread over (threads in each), so one "
                         "interpreter does not cap the load they offer")
    ap.add_argument("--call-s", type=positive, default=0.5, help="simulated generation time per call")
    ap.add_argument("--seconds", type=positive, default=20.0, help="measurement time per ramp step")
    ap.add_argument("--groups-per-batch", type=count, default=32)
    ap.add_argument("--max-in-flight", type=count, default=1024, help="the scheduler's dispatches in flight (2x what 64 producers take per call)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                    help="to ramp, in turn on the same broker: batches that copy or claim-check the rollouts, and "
                         "+rewards_only: producers send groups without a signal as their rewards only")
    ap.add_argument("--bootstrap", help="an existing broker (default: start tansu)")
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)
    quiet()

    from tests.support.servers import KafkaBroker

    with tempfile.TemporaryDirectory() as tmp:
        broker = None if args.bootstrap else KafkaBroker(log_path=Path(tmp) / "broker.log")
        bootstrap = args.bootstrap or broker.bootstrap
        try:
            broker_pid = broker.proc.pid if broker is not None else None
            runs = {mode: ramp(args, bootstrap, broker_pid, Path(tmp), mode) for mode in args.modes}
            ceiling = raw_ceiling(bootstrap, args.tokens) | raw_latency(bootstrap, FETCH_MAX_WAIT_MS)
        finally:
            if broker is not None:
                broker.stop()
    best = {mode: summary_line(mode, steps, ceiling) for mode, steps in runs.items()}
    pairs = (("copy", "claim_check"), ("copy+rewards_only", "claim_check+rewards_only"),
             ("copy", "copy+rewards_only"), ("copy", "claim_check+rewards_only"))
    bytes_per_trained = {f"{base} -> {mode}": compare_bytes(base, runs[base], mode, runs[mode])
                         for base, mode in pairs if base in runs and mode in runs}
    write_json(args, runs=runs, ceiling=ceiling, best=best, bytes_per_trained_rollout=bytes_per_trained)
    return 0


if __name__ == "__main__":
    sys.exit(main())
