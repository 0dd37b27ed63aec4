"""`prl bench system`: is the pipeline ever the bottleneck? Three figures, each against its
baseline in the same run:

1. kafka:      RolloutGroups of 2,000-token rollouts through prl's Kafka transport (encode,
               publish, consume, decode) vs raw kafka-python sending and reading the same bytes;
               and 20,000 small messages (dispatches) published before one flush, prl's
               publisher (it keeps each until acknowledged) vs raw kafka-python's producer;
2. checkpoint: a learner checkpoint through fsspec (data, CRC-32C manifest, latest) vs a
               raw copy of the same bytes to the same disk;
3. async:      learner steps per second of the in-process pipeline with simulated generation
               latency, vs the ideal 1 / max(stage time) and vs the same stages run one after
               the other (synchronously).

Starts its own tansu broker unless --bootstrap is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import count, natural, output_file, positive, write_json


# -- 1. Kafka path ---------------------------------------------------------------------------
def rollout_groups(n: int, tokens: int, group_size: int, seed: int = 0):
    from prl.schemas import Rollout, RolloutGroup

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rollouts = [Rollout(rng.integers(0, 150_000, tokens, dtype=np.int32), -rng.random(tokens, dtype=np.float32),
                            1.0, "length", "") for _ in range(group_size)]
        out.append(RolloutGroup(f"d{i}", f"p{i}", 0, "bench", rng.integers(0, 150_000, 200, dtype=np.int32), 1.0, rollouts))
    return out


def taking_turns(transport, repeats: int, prl_once, raw_once, kind: str) -> tuple[float, float]:
    """Median seconds of prl's side and the raw side over ``repeats`` rounds, the sides taking
    turns to go first (so neither always meets a warmer broker), each on a fresh topic of
    ``kind`` (same partitions, same keys)."""
    times = {"prl": [], "raw": []}
    once = {"prl": prl_once, "raw": raw_once}
    for i in range(repeats):
        run = f"bench{int(time.time())}r{i}"
        for side in ("prl", "raw") if i % 2 == 0 else ("raw", "prl"):
            transport.ensure_topics(f"{run}{side}")
            times[side].append(once[side](f"{run}{side}.{kind}"))
    return float(np.median(times["prl"])), float(np.median(times["raw"]))


def bench_kafka(bootstrap: str, groups, max_bytes: int, repeats: int) -> dict:
    """Rollouts/s through prl's transport and through raw kafka-python (:func:`taking_turns`)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from prl.transport.kafka import KafkaTransport
    from prl.schemas import RolloutGroup, decode, encode, headers
    from prl.schemas.config import KafkaConfig

    cfg = KafkaConfig(bootstrap_servers=bootstrap, max_message_bytes=max_bytes)
    transport = KafkaTransport(cfg)
    rollouts = sum(len(g.rollouts) for g in groups)
    decode(encode(groups[0]), RolloutGroup)  # Arrow's first call sets itself up: not a per-group cost
    t0 = time.perf_counter()
    payloads = [encode(g) for g in groups]  # the same bytes, encoded outside the raw timing
    encode_ms = (time.perf_counter() - t0) * 1e3 / len(groups)
    t0 = time.perf_counter()
    for p in payloads:
        decode(p, RolloutGroup)
    decode_ms = (time.perf_counter() - t0) * 1e3 / len(groups)

    def prl_once(topic: str) -> float:
        t0 = time.perf_counter()
        pub = transport.publisher()
        for g in groups:
            pub.publish(topic, encode(g), key=g.problem_id.encode(), headers=headers(g))
        pub.flush()
        sub = transport.subscriber([topic], group=None)
        got = 0
        while got < len(groups):
            got += sum(len(decode(m.value, RolloutGroup).rollouts) > 0 for m in sub.poll(5.0))
        seconds = time.perf_counter() - t0
        sub.close()
        pub.close()
        return seconds

    def raw_once(topic: str) -> float:
        t0 = time.perf_counter()
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type="zstd",
                                 max_request_size=max_bytes, linger_ms=5)
        for i, p in enumerate(payloads):
            producer.send(topic, value=p, key=f"p{i}".encode())
        producer.flush()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_bytes=max_bytes,
                                 max_partition_fetch_bytes=max_bytes)
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)  # as prl's subscriber does: no subscription round trip before the first fetch
        consumer.seek_to_beginning(*parts)
        got = 0
        while got < len(payloads):
            got += sum(len(v) for v in consumer.poll(timeout_ms=5000).values())
        seconds = time.perf_counter() - t0
        consumer.close()
        producer.close()
        return seconds

    prl_s, raw_s = taking_turns(transport, repeats, prl_once, raw_once, "rollouts")
    mb = sum(map(len, payloads)) / 1e6
    return {"rollouts_per_s": rollouts / prl_s, "raw_rollouts_per_s": rollouts / raw_s, "MB": round(mb, 1),
            "prl_MB_per_s": mb / prl_s, "raw_MB_per_s": mb / raw_s, "ratio": raw_s / prl_s, "repeats": repeats,
            "encode_ms_per_group": encode_ms, "decode_ms_per_group": decode_ms}


def dispatches(n: int) -> list[bytes]:
    """``n`` encoded dispatches: the many small messages a scheduler sends between two flushes."""
    from prl.schemas import Dispatch, Sampling, encode

    return [encode(Dispatch(f"d{i}", f"p{i}", f"{i} + {i} =", str(2 * i), 8, Sampling(), 0)) for i in range(n)]


def bench_publish(bootstrap: str, payloads: list[bytes], repeats: int) -> dict:
    """Messages/s of ``payloads`` published and then flushed once, prl's publisher (which keeps
    each until acknowledged) against raw kafka-python's producer with the same settings
    (:func:`taking_turns`)."""
    from kafka import KafkaProducer

    from prl.transport.kafka import KafkaTransport
    from prl.schemas.config import KafkaConfig

    transport = KafkaTransport(KafkaConfig(bootstrap_servers=bootstrap))

    def prl_once(topic: str) -> float:
        pub = transport.publisher()
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            pub.publish(topic, p, key=b"p%d" % i)
        pub.flush()
        seconds = time.perf_counter() - t0
        pub.close()
        return seconds

    def raw_once(topic: str) -> float:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, compression_type="zstd",
                                 linger_ms=5)
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            producer.send(topic, value=p, key=b"p%d" % i)
        producer.flush()
        seconds = time.perf_counter() - t0
        producer.close()
        return seconds

    prl_s, raw_s = taking_turns(transport, repeats, prl_once, raw_once, "problems")
    return {"messages": len(payloads), "messages_per_s": len(payloads) / prl_s, "raw_messages_per_s": len(payloads) / raw_s,
            "ratio": raw_s / prl_s, "repeats": repeats}


# -- 2. checkpoint ---------------------------------------------------------------------------
def bench_checkpoint(params_m: float, repeats: int) -> dict:
    import torch

    from prl.learner import checkpoint
    from prl import storage
    from prl.models import resolve_model_dir

    hidden = 1024
    layers = max(1, int(params_m * 1e6 / (hidden * hidden)))
    model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, hidden)).sum().backward()
    optimizer.step()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    base = resolve_model_dir("builtin:tiny-adder")
    files = {}  # the bytes of one prl checkpoint, read back: what the raw copy writes

    def prl_once(i: int) -> float:
        t0 = time.perf_counter()
        uri = checkpoint.write_checkpoint(f"file://{tmp}/run", i + 1, weights, optimizer, {"last_batch_seq": i}, base, 2)
        seconds = time.perf_counter() - t0  # complete and ``latest`` moved; the superseded one is deleted after
        storage.wait_for_pruning()  # ... and not while the other side is timed
        if not files:  # read back once: every round writes the same files
            src = uri.removeprefix("file://")
            files.update({name: Path(src, name).read_bytes() for name in os.listdir(src)})
        return seconds

    def raw_once(i: int) -> float:
        dst = f"{tmp}/raw-{i}"
        t0 = time.perf_counter()
        os.makedirs(dst)
        for name, data in files.items():  # the same bytes, already in memory, plainly written
            with open(f"{dst}/{name}", "wb") as f:
                f.write(data)
        seconds = time.perf_counter() - t0
        shutil.rmtree(dst)
        return seconds

    prl_times, raw_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        prl_once(0)  # the first write fills ``files``; neither side is timed on a cold start
        for i in range(1, repeats + 1):  # sides take turns going first; each starts with no dirty pages
            for times, once in [(prl_times, prl_once), (raw_times, raw_once)][:: 1 if i % 2 else -1]:
                os.sync()
                times.append(once(i))
    nbytes = sum(map(len, files.values()))
    # The best round of each side: the disk's writeback stalls a round now and then by a
    # second or more, on either side, and a stall only ever adds time (a median of 5 rounds
    # with two stalls in them measured anywhere from 0.27x to 1.74x).
    prl_s, raw_s = min(prl_times), min(raw_times)
    return {"MB": round(nbytes / 1e6, 1), "prl_s": prl_s, "raw_s": raw_s, "prl_MB_per_s": nbytes / 1e6 / prl_s,
            "raw_MB_per_s": nbytes / 1e6 / raw_s, "ratio": raw_s / prl_s, "prl_rounds_s": prl_times, "raw_rounds_s": raw_times}


# -- 3. async pipeline -----------------------------------------------------------------------
class DelayedBackend:
    """The transformers backend with a fixed extra latency per generation call (a stand-in
    for a remote GPU engine)."""

    def __init__(self, inner, latency_s: float):
        self.inner, self.latency_s = inner, latency_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests, **kw):
        out = self.inner.generate(requests, **kw)
        time.sleep(self.latency_s)  # simulated engine time (the benchmark's input, not synchronisation)
        return out


def pipeline_config(run_dir: str, steps: int):
    from prl.schemas.config import load_config

    return load_config(overrides=[
        f"run.run_dir={json.dumps(run_dir)}", f"learner.max_steps={steps}", "learner.eval_every=0",
        "scheduler.strategy='uniform'", "scheduler.groups_per_batch=8",
        "scheduler.max_in_flight=8", "producer.max_dispatches_per_call=8", "scheduler.max_batches_ahead=2",
        "scheduler.replay.ratio=0", "learner.checkpoint_every=1",
    ])


def build(cfg, latency_s):
    from prl.learner.service import Learner
    from prl.generation import make_backend
    from prl.transport.memory import MemoryBroker, MemoryTransport
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    transport = MemoryTransport(MemoryBroker())
    transport.ensure_topics(cfg.run.name)
    backend = DelayedBackend(make_backend("transformers", cfg.model.path, cfg.model.dtype), latency_s)
    return Scheduler(cfg, transport), Producer(cfg, transport, backend=backend), Learner(cfg, transport)


def run_async(cfg, latency_s, warmup: int) -> float:
    scheduler, producer, learner = build(cfg, latency_s)
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in (scheduler, producer)]
    for t in threads:
        t.start()
    t_start = None
    while not learner.step():
        if learner.version == warmup and t_start is None:
            t_start = time.perf_counter()
    elapsed = time.perf_counter() - t_start
    stop.set()
    for t in threads:
        t.join(30)
    return (cfg.learner.max_steps - warmup) / elapsed


def run_sync(cfg, latency_s, warmup: int) -> tuple[float, float, float]:
    """Scheduler -> producer -> learner, one after another, one batch at a time; also times
    each stage (for the ideal)."""
    scheduler, producer, learner = build(cfg, latency_s)
    gen_times, train_times = [], []
    t_start = None
    while learner.version < cfg.learner.max_steps:
        if learner.version == warmup and t_start is None:
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        start_seq = scheduler.next_seq
        while scheduler.next_seq == start_seq:  # generate until one batch is out
            scheduler.step()
            producer.step()
        t1 = time.perf_counter()
        version = learner.version
        while learner.version == version:
            learner.step()
        t2 = time.perf_counter()
        if learner.version > warmup:
            gen_times.append(t1 - t0)
            train_times.append(t2 - t1)
    elapsed = time.perf_counter() - t_start
    return (cfg.learner.max_steps - warmup) / elapsed, float(np.median(gen_times)), float(np.median(train_times))


def bench_async(latency_s: float, steps: int, warmup: int) -> dict:
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sync_sps, gen_s, train_s = run_sync(pipeline_config(f"{tmp}/sync", steps), latency_s, warmup)
    with tempfile.TemporaryDirectory() as tmp:
        async_sps = run_async(pipeline_config(f"{tmp}/async", steps), latency_s, warmup)
    ideal = 1.0 / max(gen_s, train_s)
    return {"latency_s": latency_s, "generate_stage_s": gen_s, "train_stage_s": train_s, "async_steps_per_s": async_sps,
            "ideal_steps_per_s": ideal, "sync_steps_per_s": sync_sps, "ratio": async_sps / ideal,
            "speedup_vs_sync": async_sps / sync_sps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench system", description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["kafka", "checkpoint", "async"], action="append", help="run only these (repeatable)")
    ap.add_argument("--bootstrap", help="an existing broker (default: start tansu)")
    ap.add_argument("--groups", type=count, default=60, help="rollout groups through Kafka")
    ap.add_argument("--tokens", type=count, default=2000, help="tokens per rollout")
    ap.add_argument("--group-size", type=count, default=8)
    ap.add_argument("--messages", type=count, default=20_000, help="dispatches published between two flushes")
    ap.add_argument("--params-m", type=positive, default=50.0, help="checkpointed model size, millions of parameters")
    ap.add_argument("--repeats", type=count, default=5, help="rounds of the kafka figure (median) and the checkpoint figure (best of at least 9)")
    ap.add_argument("--latency", type=positive, default=0.5, help="simulated generation seconds per producer call")
    ap.add_argument("--steps", type=count, default=24)
    ap.add_argument("--warmup", type=natural, default=4)
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)

    from prl import logs

    logs.configure("console", "warning")
    which = args.only or ["kafka", "checkpoint", "async"]
    results = {}
    if "kafka" in which:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's test helpers start tansu
            from tests.support.servers import KafkaBroker

            broker = KafkaBroker()
            bootstrap = broker.bootstrap
        try:
            results["kafka"] = bench_kafka(bootstrap, rollout_groups(args.groups, args.tokens, args.group_size), 64 << 20,
                                           args.repeats)
            results["publish"] = bench_publish(bootstrap, dispatches(args.messages), args.repeats)
        finally:
            if broker is not None:
                broker.stop()
    if "checkpoint" in which:
        results["checkpoint"] = bench_checkpoint(args.params_m, max(args.repeats, 9))
    if "async" in which:
        results["async"] = bench_async(args.latency, args.steps, args.warmup)

    print(f"{'figure':<44}{'prl':>14}{'baseline':>14}{'ratio':>8}{'goal':>8}")
    if "kafka" in results:
        r = results["kafka"]
        label = f"kafka: {args.tokens}-token rollouts/s ({r['MB']} MB)"
        print(f"{label:<44}{r['rollouts_per_s']:>14,.0f}"
              f"{r['raw_rollouts_per_s']:>14,.0f}{r['ratio']:>8.2f}{'>= 0.8':>8}   baseline: raw kafka-python")
        print(f"{'':<44}  of which per group of {args.group_size} x {args.tokens} tokens: encode {r['encode_ms_per_group']:.2f} ms, "
              f"decode (validated) {r['decode_ms_per_group']:.2f} ms")
    if "publish" in results:
        r = results["publish"]
        label = f"kafka: {r['messages']:,} dispatches, then a flush: msg/s"
        print(f"{label:<44}{r['messages_per_s']:>14,.0f}{r['raw_messages_per_s']:>14,.0f}{r['ratio']:>8.2f}{'>= 0.8':>8}"
              "   baseline: raw kafka-python")
    if "checkpoint" in results:
        r = results["checkpoint"]
        label = f"checkpoint MB/s ({r['MB']} MB)"
        print(f"{label:<44}{r['prl_MB_per_s']:>14,.0f}{r['raw_MB_per_s']:>14,.0f}"
              f"{r['ratio']:>8.2f}{'>= 0.7':>8}   baseline: raw copy of the same bytes")
    if "async" in results:
        r = results["async"]
        label = f"async steps/s (gen {r['generate_stage_s']:.2f}s, train {r['train_stage_s']:.2f}s)"
        print(f"{label:<44}"
              f"{r['async_steps_per_s']:>14.3f}{r['ideal_steps_per_s']:>14.3f}{r['ratio']:>8.2f}{'>= 0.9':>8}   baseline: ideal 1/max(stage)")
        print(f"{'':<44}{'':>14}{r['sync_steps_per_s']:>14.3f}{r['speedup_vs_sync']:>8.2f}{'':>8}   baseline: the same stages run synchronously")
    write_json(args, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
