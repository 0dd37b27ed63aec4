"""`prl bench staleness`: does dropping rollouts older than tau_max favour short answers?

A group's age when trained is the number of learner versions between the weights that
generated it and the update that trains it; the scheduler drops it past ``scheduler.tau_max``.
Long completions take longer to generate, so if each group went out when its own completions
ended, long ones would arrive older, be dropped more often, and the trained data would lean
short. `producers/` publishes a generation call's groups together, when the call's longest
completion ends, so every group of a call has the same age whatever its own length.

Measured through the real scheduler (`prl scheduler`, its own process) on the real broker
(tansu): simulated producers (no model; threads of this process) draw each completion's length
from a log-normal distribution, independent of its reward, and take generation time
proportional to the longest completion being decoded (decoding is batched); a learner that only
acknowledges takes ``--step-s`` per batch and announces a version per batch. Two ways of
publishing, one after the other on the same broker, each for the same time and at each
``--tau-max``: ``call``, as `producers/` does, and ``group``, each group as soon as its own
completions end (a streaming producer, not built). Printed side by side: the mean completion
length generated, trained (fresh rollouts) and dropped as stale by the scheduler, the share
dropped, and trained / generated with two standard errors of a random sample of that size;
and a figure (``--png``): per completion length, the share of what could be trained (groups with
a signal) that was, over the run's share, read back from the batches composed in the window.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import count, natural, positive, write_json
from benchmarks.scale import (LEARNER_COUNTERS, REWARD_MIX, SPAWN, PolicyFollower, Side, acknowledge_batches, last_metrics,
                              quiet)

PUBLISH = ("call", "group")
GROUP_SIZE = 8
LENGTH_BINS = 16  # of the completion length, 0 .. --max-tokens, for the figure
STATS = ("rollouts", "tokens", "tokens_squared", "signal_by_length")  # what each simulated producer generated


def publish_after(lengths: list[np.ndarray], ms_per_token: float, publish: str) -> list[float]:
    """Seconds after a call starts at which each of its groups (completion lengths ``lengths``)
    goes out: when its own longest completion ends (``group``), or every group when the call's
    longest ends (``call``). A batched call decodes one token of every running completion per step."""
    ends = [ms_per_token / 1e3 * int(n.max()) for n in lengths]
    return [max(ends)] * len(ends) if publish == "call" else ends


class LengthProducer(threading.Thread):
    """One simulated generation pod: takes up to ``per_call`` dispatches, draws their
    completions' lengths, "decodes" for ``ms_per_token`` per token of the longest one still
    running, and publishes each group when the call ends (``call``) or when its own longest
    completion ends (``group``)."""

    def __init__(self, transport, run: str, name: str, policy: PolicyFollower, args, publish: str):
        super().__init__(daemon=True, name=name)
        from prl.schemas.topics import PROBLEMS, ROLLOUTS, topic_name

        self.sub = transport.subscriber([topic_name(run, PROBLEMS)], group=f"{run}.producers")
        self.pub = transport.publisher()
        self.rollouts_topic = topic_name(run, ROLLOUTS)
        self.policy, self.args, self.publish = policy, args, publish
        # its own figures, so no two threads add to one number
        self.stats = {**dict.fromkeys(STATS, 0), "signal_by_length": np.zeros(LENGTH_BINS, dtype=np.int64)}
        self.stop = threading.Event()
        self.rng = np.random.default_rng(abs(hash(name)) % 2**32)
        self.tokens = self.rng.integers(3, 16, args.max_tokens, dtype=np.int32)
        self.logprobs = -self.rng.random(args.max_tokens, dtype=np.float32) - 0.01

    def lengths(self, n: int) -> np.ndarray:
        drawn = self.rng.lognormal(np.log(self.args.median_tokens), self.args.sigma, n)
        return np.clip(np.rint(drawn), 1, self.args.max_tokens).astype(int)

    def group(self, d, version: int, lengths):
        from prl.schemas import Rollout, RolloutGroup

        rewards = REWARD_MIX[int(self.rng.choice(len(REWARD_MIX), p=[w for w, _ in REWARD_MIX]))][1]
        rollouts = [Rollout(self.tokens[:n], self.logprobs[:n], r, "stop", "") for n, r in zip(lengths, rewards)]
        return RolloutGroup(d.dispatch_id, d.problem_id, version, self.name, self.tokens[:8], d.sampling.temperature,
                            rollouts, 0.0, 0.0, time.time())

    def run(self) -> None:
        from prl.formulas import has_signal
        from prl.schemas import Dispatch, decode, encode, headers

        while not self.stop.is_set():
            msgs = self.sub.poll(0.2, max_records=self.args.per_call)
            if not msgs:
                continue
            start, version = time.monotonic(), self.policy.version  # the weights this call generates with
            dispatches = [decode(m.value, Dispatch) for m in msgs]
            lengths = [self.lengths(d.group_size) for d in dispatches]
            ends = publish_after(lengths, self.args.ms_per_token, self.publish)
            for i in np.argsort(ends, kind="stable"):
                time.sleep(max(0.0, start + ends[i] - time.monotonic()))
                g = self.group(dispatches[i], version, lengths[i])
                self.pub.publish(self.rollouts_topic, encode(g), key=g.problem_id.encode(), headers=headers(g))
                self.pub.flush()
                self.stats["rollouts"] += len(lengths[i])
                self.stats["tokens"] += int(lengths[i].sum())
                self.stats["tokens_squared"] += int((lengths[i] ** 2).sum())
                if has_signal(g.rewards):  # only these can be trained: the figure's denominator
                    made = length_histogram(lengths[i], self.args.max_tokens)
                    self.stats["signal_by_length"] = self.stats["signal_by_length"] + made  # a new array: read whole
            self.sub.commit()
        self.sub.close()
        self.pub.close()


SCHEDULER_COUNTERS = ("trained_fresh_rollouts", "trained_completion_tokens", "stale_fresh_rollouts",
                      "stale_completion_tokens", "groups_returned")


def scheduler_counters(run_dir: Path) -> dict:
    """The scheduler's counters on its last metrics line (0 before its first batch)."""
    last = last_metrics(run_dir)
    return {k: last.get(f"scheduler/{k}", 0) for k in SCHEDULER_COUNTERS}


def length_histogram(lengths, max_tokens: int) -> np.ndarray:
    """Counts of ``lengths`` in LENGTH_BINS equal bins from 0 to ``max_tokens`` (the cap in the last)."""
    return np.histogram(lengths, LENGTH_BINS, (0, max_tokens))[0]


def trained_by_length(transport, run: str, since: float, until: float, max_tokens: int) -> np.ndarray:
    """The completion lengths of the fresh rollouts in the batches composed between ``since``
    and ``until`` (read back from the batch topic), as a histogram."""
    from prl.schemas import TrainBatch, decode
    from prl.schemas.topics import BATCHES, topic_name

    sub = transport.subscriber([topic_name(run, BATCHES)], group=None, from_beginning=True)
    counts, quiet_polls, deadline = np.zeros(LENGTH_BINS, dtype=np.int64), 0, time.monotonic() + 60
    while quiet_polls < 3 and time.monotonic() < deadline:  # read to the end of the topic
        msgs = sub.poll(1.0)
        quiet_polls = 0 if msgs else quiet_polls + 1
        for batch in (decode(m.value, TrainBatch) for m in msgs):
            if since <= batch.created_at <= until:
                counts += length_histogram([len(r.completion_ids) for r in batch.rollouts if not r.is_replay], max_tokens)
    sub.close()
    return counts


def generated(producers: list[LengthProducer]) -> dict:
    """What the simulated producers generated so far, added up."""
    return {k: sum(p.stats[k] for p in producers) for k in STATS}


def write_config(path: Path, bootstrap: str, run: str, run_dir: Path, args, tau_max: int) -> Path:
    from tests.support.servers import write_kafka_config

    return write_kafka_config(
        path, bootstrap, run, str(run_dir),
        run={"log_format": "json", "log_level": "warning", "finish_with_learner": False},
        transport={"kafka": {"bootstrap_servers": bootstrap, "session_timeout_ms": 6000, "max_message_bytes": 64 << 20,
                             "fetch_max_wait_ms": 50, "problem_partitions": args.producers}},
        task={"train_per_digit": [80, 8000, 20000, 20000]},
        sampling={"group_size": GROUP_SIZE, "max_tokens": args.max_tokens},
        scheduler={"groups_per_batch": args.groups_per_batch, "tau_max": tau_max,
                   "max_in_flight": 2 * args.producers * args.per_call,
                   "snapshot_every": 0, "archive": False, "dispatch_timeout_s": 600.0},
    )


def measure(args, bootstrap: str, work: Path, publish: str, tau_max: int) -> dict:
    """One way of publishing at one tau_max: the pipeline started on fresh topics, settled,
    then measured for ``--seconds``."""
    from tests.support.servers import Process
    from prl.transport.kafka import KafkaTransport
    from prl.schemas.config import load_config

    name = f"{publish}-tau{tau_max}"
    run, run_dir = f"stale{int(time.time())}{publish}{tau_max}", work / name
    config = write_config(work / f"{name}.toml", bootstrap, run, run_dir, args, tau_max)
    transport = KafkaTransport(load_config(config).transport.kafka)
    transport.ensure_topics(run)
    scheduler = Process([sys.executable, "-m", "prl.cli", "scheduler", "--config", str(config)],
                        log_path=work / f"scheduler-{name}.log")
    learned = SPAWN.Array("d", len(LEARNER_COUNTERS))  # kept referenced until the learner has read it
    learner = Side(acknowledge_batches, config, learned, args.step_s)
    policy = PolicyFollower(transport, run)
    policy.start()
    producers = [LengthProducer(transport, run, f"sim-{i}", policy, args, publish) for i in range(args.producers)]
    for p in producers:
        p.start()
    try:
        time.sleep(args.seconds / 3)  # settle: groups join, the learner starts taking versions
        before, generated0, version0, since = scheduler_counters(run_dir), generated(producers), policy.version, time.time()
        time.sleep(args.seconds)
        after, generated1, version, until = scheduler_counters(run_dir), generated(producers), policy.version, time.time()
        trained = trained_by_length(transport, run, since, until, args.max_tokens)
    finally:
        for p in [*producers, policy]:
            p.stop.set()
        learner.stop()
        scheduler.stop()
    d = {k: after[k] - before[k] for k in SCHEDULER_COUNTERS}
    n, total, squares, signal = (generated1[k] - generated0[k] for k in STATS)
    mean = total / max(1, n)
    return {
        "publish": publish, "tau_max": tau_max, "versions": version - version0, "rollouts_generated": n,
        "generated_mean_tokens": mean, "generated_sd_tokens": max(0.0, squares / max(1, n) - mean**2) ** 0.5,
        "trained_fresh_rollouts": d["trained_fresh_rollouts"],
        "trained_mean_tokens": d["trained_completion_tokens"] / max(1, d["trained_fresh_rollouts"]),
        "stale_rollouts": d["stale_fresh_rollouts"],
        "stale_mean_tokens": d["stale_completion_tokens"] / max(1, d["stale_fresh_rollouts"]),
        "stale_share": d["stale_fresh_rollouts"] / max(1, d["groups_returned"] * GROUP_SIZE),
        "length_bin_edges": np.linspace(0, args.max_tokens, LENGTH_BINS + 1).tolist(),
        "signal_generated_by_length": signal.tolist(), "trained_by_length": trained.tolist(),
    }


def trained_ratio(r: dict) -> tuple[float, float]:
    """Mean trained length / mean generated length, and two standard errors of it: what a
    random sample of as many generated rollouts would differ by (lengths drawn independently)."""
    ratio = r["trained_mean_tokens"] / max(1e-9, r["generated_mean_tokens"])
    return ratio, 2 * r["generated_sd_tokens"] / max(1e-9, r["generated_mean_tokens"]) / max(1, r["trained_fresh_rollouts"]) ** 0.5


def report(rows: list[dict]) -> None:
    print(f"{'tau_max':>7}  {'publish':<8}{'versions':>9}{'generated':>11}{'trained':>9}{'stale share':>13}"
          f"{'mean tokens: generated':>24}{'trained':>9}{'stale':>7}{'trained / generated (+-2 se)':>30}")
    for r in rows:
        ratio, err = trained_ratio(r)
        print(f"{r['tau_max']:>7}  {r['publish']:<8}{r['versions']:>9}{r['rollouts_generated']:>11,}"
              f"{r['trained_fresh_rollouts']:>9,}{r['stale_share']:>13.2f}{r['generated_mean_tokens']:>24.0f}"
              f"{r['trained_mean_tokens']:>9.0f}{r['stale_mean_tokens'] if r['stale_rollouts'] else float('nan'):>7.0f}"
              f"{f'{ratio:.2f} +- {err:.2f}':>30}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench staleness", description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=count, default=4, help="simulated generation pods")
    ap.add_argument("--per-call", type=count, default=16, help="dispatches per generation call "
                    "(producer.max_dispatches_per_call's default)")
    ap.add_argument("--median-tokens", type=count, default=300, help="median completion length (log-normal)")
    ap.add_argument("--sigma", type=positive, default=0.7, help="log-normal sigma of the completion length")
    ap.add_argument("--max-tokens", type=count, default=1024, help="completion length cap (sampling.max_tokens)")
    ap.add_argument("--ms-per-token", type=positive, default=2.0, help="decoding time per token of a batched call")
    ap.add_argument("--step-s", type=positive, default=0.5, help="the learner's time per batch")
    ap.add_argument("--tau-max", type=natural, nargs="+", default=[2, 4, 8, 16], help="scheduler.tau_max values, each run "
                    "with every way of publishing")
    ap.add_argument("--groups-per-batch", type=count, default=8, help="scheduler.groups_per_batch")
    ap.add_argument("--seconds", type=positive, default=60.0, help="measured time per way of publishing")
    ap.add_argument("--publish", nargs="+", choices=PUBLISH, default=list(PUBLISH), help="ways of publishing to run: "
                    "call (a call's groups together, as producers/ do), group (each as its own completions end)")
    ap.add_argument("--png", default="docs/bench-staleness.png", help="where the figure goes: the trained share by "
                    "completion length, per tau_max and way of publishing")
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = ap.parse_args(argv)
    quiet()

    from tests.support.servers import KafkaBroker

    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(log_path=Path(tmp) / "broker.log")
        try:
            rows = []
            for tau_max in args.tau_max:
                for publish in args.publish:
                    rows.append(measure(args, broker.bootstrap, Path(tmp), publish, tau_max))
                    print(f"tau_max {tau_max}, publish {publish}: {rows[-1]['trained_fresh_rollouts']} rollouts trained, "
                          f"stale share {rows[-1]['stale_share']:.2f}", flush=True)
        finally:
            broker.stop()
    report(rows)
    from prl.plots import trained_share_by_length

    trained_share_by_length(rows, args.png)
    print(f"figure: {args.png}")
    write_json(args, runs=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
