"""Offline work on a rollout archive (scheduler/archive.py): `prl replay report|whatif|publish|train`.

- report:  success-rate trajectories, priority and age distributions, reward by version (PNGs
           and a table);
- whatif:  replay the archived outcomes through each selection strategy and compare what each
           would have chosen and how much generation it would have spent on zero-signal groups;
- publish: archived groups as TrainBatches on a run's batch topic, rate-limited, so a learner
           reproduces the training;
- train:   the learner, offline, on the archived groups.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter, defaultdict

import numpy as np

from scheduler.advantages import has_signal
from scheduler.archive import groups_from_table, read_archive
from schemas import RolloutGroup, TrainBatch

STRATEGIES = ("uniform", "dapo_filter", "success_variance")


def _progress(total: int, desc: str, enabled: bool = True):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="group", dynamic_ncols=True, disable=not enabled)


def load_groups(uri: str) -> list[RolloutGroup]:
    """Served groups of the archive, in acceptance order."""
    return [g for g in groups_from_table(read_archive(uri)) if not g.error and g.rollouts]


def difficulty(problem_id: str) -> str:
    """The problem's group for plots and priors: the id's prefix before ':' (e.g. add2)."""
    return problem_id.split(":", 1)[0]


# -- report ----------------------------------------------------------------------------------
def report(uri: str, out_dir: str) -> dict:
    """PNGs under ``out_dir`` and a per-version table (returned and printed by the CLI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from prl.plots import priority_histogram, save_png

    table = read_archive(uri)
    groups = [g for g in groups_from_table(table) if g.rollouts]
    ages = np.asarray(table["learner_version"].to_numpy() - table["policy_version"].to_numpy())
    by_version: dict[int, list[RolloutGroup]] = defaultdict(list)
    for g in groups:
        by_version[g.policy_version].append(g)
    rows = []
    for v in sorted(by_version):
        gs = by_version[v]
        rewards = [r for g in gs for r in g.rewards]
        rows.append({"policy_version": v, "groups": len(gs), "rollouts": len(rewards),
                     "mean_reward": float(np.mean(rewards)), "solved_share": float(np.mean([r > 0 for r in rewards])),
                     "signal_share": float(np.mean([has_signal(g.rewards) for g in gs]))})

    out = out_dir.rstrip("/")
    versions = [r["policy_version"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(versions, [r["mean_reward"] for r in rows], "k-o", ms=3, label="mean reward")
    ax.plot(versions, [r["signal_share"] for r in rows], "--", label="groups with signal")
    ax.set_xlabel("policy version")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title("reward by policy version")
    save_png(fig, f"{out}/reward_by_version.png", 110)

    # Success-rate trajectory of each difficulty: solved share per version.
    fig, ax = plt.subplots(figsize=(7, 4))
    for d in sorted({difficulty(g.problem_id) for g in groups}):
        xs, ys = [], []
        for v in sorted(by_version):
            rs = [r > 0 for g in by_version[v] if difficulty(g.problem_id) == d for r in g.rewards]
            if rs:
                xs.append(v)
                ys.append(float(np.mean(rs)))
        ax.plot(xs, ys, "-o", ms=2, label=d)
    ax.set_xlabel("policy version")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("success-rate trajectories by difficulty")
    save_png(fig, f"{out}/success_trajectories.png", 110)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(ages, bins=np.arange(ages.min(), ages.max() + 2) - 0.5 if len(ages) else 1, color="tab:blue")
    ax.set_xlabel("age at acceptance (learner version - policy version)")
    ax.set_ylabel("groups")
    ax.set_title("rollout age")
    save_png(fig, f"{out}/age_histogram.png", 110)

    solved, attempts = Counter(), Counter()
    for g in groups:
        solved[g.problem_id] += sum(r > 0 for r in g.rewards)
        attempts[g.problem_id] += len(g.rewards)
    rates = np.asarray([solved[p] / attempts[p] for p in attempts])
    priority_histogram(rates * (1 - rates), rates, f"{out}/priority_histogram.png", "archive: final success rates")
    return {"versions": rows, "groups": len(groups), "problems": len(attempts),
            "age_mean": float(ages.mean()) if len(ages) else 0.0, "age_max": int(ages.max()) if len(ages) else 0,
            "pngs": [f"{out}/{n}.png" for n in ("reward_by_version", "success_trajectories", "age_histogram", "priority_histogram")]}


def format_report(rep: dict) -> str:
    lines = [f"{rep['groups']} groups over {rep['problems']} problems; age mean {rep['age_mean']:.2f}, max {rep['age_max']}",
             f"{'version':>7} {'groups':>7} {'rollouts':>9} {'mean reward':>12} {'solved':>7} {'signal':>7}"]
    for r in rep["versions"]:
        lines.append(f"{r['policy_version']:>7} {r['groups']:>7} {r['rollouts']:>9} {r['mean_reward']:>12.3f} "
                     f"{r['solved_share']:>7.3f} {r['signal_share']:>7.3f}")
    lines += ["", *(f"wrote {p}" for p in rep["pngs"])]
    return "\n".join(lines)


# -- whatif ----------------------------------------------------------------------------------
def whatif(uri: str, out_dir: str | None, strategies=STRATEGIES, rounds: int | None = None, per_round: int = 16,
           seed: int = 0, progress: bool = True) -> dict:
    """Each strategy chooses problems from the archived ones; the outcome of a choice is the
    problem's next archived group (cycling). Counts what each chose and what it spent on
    zero-signal groups."""
    from schemas.config import SchedulerConfig

    groups = load_groups(uri)
    outcomes: dict[str, list[list[float]]] = defaultdict(list)
    for g in groups:
        outcomes[g.problem_id].append(g.rewards)
    problems = sorted(outcomes)
    index_of_group = {d: i for i, d in enumerate(sorted({difficulty(p) for p in problems}))}
    rounds = rounds or max(1, math.ceil(len(groups) / per_round))
    results = {}
    from scheduler.samplers import make_sampler

    for strategy in strategies:
        sampler = make_sampler(SchedulerConfig(strategy=strategy), [index_of_group[difficulty(p)] for p in problems], seed)
        cursor = Counter()
        chosen: Counter = Counter()
        spent = zero_signal = trained_rollouts = 0
        with _progress(rounds * per_round, f"whatif {strategy}", progress) as bar:
            for version in range(rounds):
                sampler.on_version(version)
                picks = sampler.next(per_round, set())
                solved, attempts = [], []
                for i in picks:
                    p = problems[i]
                    rewards = outcomes[p][cursor[p] % len(outcomes[p])]
                    cursor[p] += 1
                    chosen[p] += 1
                    spent += len(rewards)
                    signal = has_signal(rewards)
                    zero_signal += 0 if signal else len(rewards)
                    trained_rollouts += len(rewards) if (signal or strategy == "uniform") else 0
                    solved.append(sum(r > 0 for r in rewards))
                    attempts.append(len(rewards))
                if picks:
                    sampler.observe_many(picks, solved, attempts, version)
                bar.update(per_round)
        results[strategy] = {"rollouts_generated": spent, "zero_signal_rollouts": zero_signal,
                             "zero_signal_share": zero_signal / max(1, spent), "rollouts_trained": trained_rollouts,
                             "distinct_problems": len(chosen), "top_problems": chosen.most_common(5)}
    if out_dir:
        _whatif_png(results, out_dir.rstrip("/") + "/whatif.png")
    return {"rounds": rounds, "per_round": per_round, "problems": len(problems), "strategies": results}


def _whatif_png(results: dict, out_uri: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from prl.plots import save_png

    names = list(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [results[n]["zero_signal_share"] for n in names], color="tab:red")
    ax.set_ylabel("generation spent on zero-signal groups")
    ax.set_ylim(0, 1)
    ax.set_title("what-if: strategies on the archived outcomes")
    save_png(fig, out_uri, 110)


def format_whatif(res: dict) -> str:
    lines = [f"{res['rounds']} rounds of {res['per_round']} over {res['problems']} archived problems",
             f"{'strategy':<18} {'generated':>9} {'zero-signal':>11} {'share':>6} {'trained':>8} {'distinct':>8}  most chosen"]
    for name, r in res["strategies"].items():
        top = ", ".join(f"{p} x{n}" for p, n in r["top_problems"][:3])
        lines.append(f"{name:<18} {r['rollouts_generated']:>9} {r['zero_signal_rollouts']:>11} {r['zero_signal_share']:>6.2f} "
                     f"{r['rollouts_trained']:>8} {r['distinct_problems']:>8}  {top}")
    return "\n".join(lines)


# -- publish / train -------------------------------------------------------------------------
def to_batches(groups: list[RolloutGroup], groups_per_batch: int, max_tokens: int) -> list[TrainBatch]:
    """The groups, in archive order, as TrainBatches (fresh only: the archive has no replay).

    Batch ``seq`` is stamped with policy version ``seq``, the version a learner starting from
    scratch has when it takes it, so its staleness filter keeps every archived rollout (the
    original versions belong to another run's clock); the behaviour log-probs are kept."""
    import dataclasses

    from scheduler.batches import compose_batch

    batches, pending, seq, generated = [], list(groups), 0, 0
    while pending:
        chunk, pending = pending[:groups_per_batch], pending[groups_per_batch:]
        chunk = [dataclasses.replace(g, policy_version=seq) for g in chunk]
        generated += sum(len(g.rollouts) for g in chunk)
        comp = compose_batch(chunk, seq=seq, learner_version=seq, rollouts_generated=generated, tau_max=10**9,
                             max_tokens=max_tokens, buffer=None, replay_ratio=0.0, warmup_updates=0)
        pending = comp.leftover + pending
        if comp.batch is not None:
            batches.append(comp.batch)
            seq += 1
    return batches


def publish(cfg, transport, uri: str, rate: float, progress: bool = True) -> int:
    """Archived groups as batches on ``<run>.batches``, at most ``rate`` batches per second."""
    from schemas import encode, headers
    from schemas.topics import BATCHES, topic_name

    batches = to_batches(load_groups(uri), cfg.scheduler.groups_per_batch, cfg.scheduler.max_batch_tokens)
    transport.ensure_topics(cfg.run.name)
    pub = transport.publisher()
    with _progress(len(batches), "publish", progress) as bar:
        for b in batches:
            t0 = time.monotonic()
            pub.publish(topic_name(cfg.run.name, BATCHES), encode(b), headers=headers(b))
            pub.flush()
            bar.update(1)
            if rate > 0:
                time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t0)))  # the rate limit itself
    pub.close()
    return len(batches)


def train(cfg, uri: str, progress: bool = True) -> dict:
    """The learner offline on the archive: batches written to a file, then consumed from it."""
    from learner.service import Learner
    from learner.sources import write_batches
    from prl.transport.memory import MemoryTransport

    batches = to_batches(load_groups(uri), cfg.scheduler.groups_per_batch, cfg.scheduler.max_batch_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/batches.arrow"
        write_batches(path, batches)
        cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"batches_from": path})})
        learner = Learner(cfg, MemoryTransport())
        with _progress(len(batches), "train", progress) as bar:
            while not learner.step():
                bar.n = learner.version
                bar.refresh()
        learner.close()
    return {"batches": len(batches), "steps": learner.version, "checkpoint": learner.checkpoint_uri}
