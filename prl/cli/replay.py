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

import dataclasses
import itertools
import json
import math
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator

import numpy as np

from prl.cli.parser import write_text
from prl.errors import UsageError
from prl.formulas import bernoulli_variance, group_outcome, has_signal
from prl.scheduler.archive import ArchivedGroups, GroupOutcome, read_outcomes
from prl.schemas import RolloutGroup, TrainBatch
from prl.schemas.config import BUILTIN_STRATEGIES


def _progress(total: int, desc: str, enabled: bool = True, unit: str = "group"):
    from prl.cli.console import progress_bar

    return progress_bar(total, desc, enabled, unit)


def difficulty(problem_id: str) -> str:
    """The problem's group for plots and priors: the id's prefix before ':' (e.g. add2)."""
    return problem_id.split(":", 1)[0]


def served_outcomes(uri: str) -> list[GroupOutcome]:
    """The archive's served groups; an archive of none is one line: nothing to read in it."""
    if not (groups := read_outcomes(uri)):
        raise UsageError(f"the archive under {uri} holds no served rollout group, only problems the producers could "
                         "not serve (the run's prl.log says why): nothing to replay")
    return groups


# -- report ----------------------------------------------------------------------------------
def report(uri: str, out_dir: str) -> dict:
    """PNGs under ``out_dir`` and a per-version table (returned and printed by the CLI)."""
    from prl import plots

    groups = served_outcomes(uri)
    ages = np.asarray([g.learner_version - g.policy_version for g in groups])
    by_version: dict[int, list[GroupOutcome]] = defaultdict(list)
    for g in groups:
        by_version[g.policy_version].append(g)
    rows = [version_row(v, by_version[v]) for v in sorted(by_version)]
    out = out_dir.rstrip("/")
    plots.by_version(rows, f"{out}/reward_by_version.png")
    plots.success_trajectories(success_by_difficulty(by_version), f"{out}/success_trajectories.png")
    plots.age_histogram(ages, f"{out}/age_histogram.png")
    rates = final_success_rates(groups)
    plots.priority_histogram(bernoulli_variance(rates), rates, f"{out}/priority_histogram.png", "archive: final success rates")
    return {"versions": rows, "groups": len(groups), "problems": len(rates),
            "age_mean": float(ages.mean()) if len(ages) else 0.0, "age_max": int(ages.max()) if len(ages) else 0,
            "pngs": [f"{out}/{n}.png" for n in ("reward_by_version", "success_trajectories", "age_histogram", "priority_histogram")]}


def version_row(version: int, groups: list[GroupOutcome]) -> dict:
    """One version's groups: rewards, solved and signal shares, and the model's turns per
    rollout (1 for single-turn tasks; more where episodes used their environment's tools)."""
    rewards = [r for g in groups for r in g.rewards]
    turns = [t for g in groups for t in g.turns]
    return {"policy_version": version, "groups": len(groups), "rollouts": len(rewards),
            "mean_reward": float(np.mean(rewards)), "solved_share": float(np.mean([r > 0 for r in rewards])),
            "signal_share": float(np.mean([has_signal(g.rewards) for g in groups])),
            "turns_mean": float(np.mean(turns)) if turns else 1.0}


MAX_LINES = 10  # difficulties drawn as lines of their own in success_trajectories.png


def success_by_difficulty(by_version: dict[int, list[GroupOutcome]]) -> dict[str, tuple[list[int], list[float]]]:
    """Per difficulty: (policy versions, share of that version's rollouts that solved). Ids
    without a difficulty prefix (a dataset's), or more difficulties than a legend can name,
    make one line over all problems."""
    labels = {g.problem_id: difficulty(g.problem_id) for gs in by_version.values() for g in gs}
    if len(set(labels.values())) > MAX_LINES:
        labels = dict.fromkeys(labels, "all problems")
    out: dict[str, tuple[list[int], list[float]]] = {}
    for d in sorted(set(labels.values())):
        xs, ys = [], []
        for v in sorted(by_version):
            rs = [r > 0 for g in by_version[v] if labels[g.problem_id] == d for r in g.rewards]
            if rs:
                xs.append(v)
                ys.append(float(np.mean(rs)))
        out[d] = (xs, ys)
    return out


def final_success_rates(groups: list[GroupOutcome]) -> np.ndarray:
    """Each archived problem's share of solved rollouts over all its groups."""
    solved, attempts = Counter(), Counter()
    for g in groups:
        solved[g.problem_id] += sum(r > 0 for r in g.rewards)
        attempts[g.problem_id] += len(g.rewards)
    return np.asarray([solved[p] / attempts[p] for p in attempts])


TABLE_ROWS = 20  # the console's version table: more versions are shown as ranges (--json has each)


def format_report(rep: dict) -> str:
    rows = version_ranges(rep["versions"], TABLE_ROWS)
    lines = [f"{rep['groups']} groups over {rep['problems']} problems; age mean {rep['age_mean']:.2f}, max {rep['age_max']}",
             f"{'version':>9} {'groups':>7} {'rollouts':>9} {'mean reward':>12} {'reward>0':>9} {'signal':>7} {'turns':>6}"]
    for r in rows:
        lines.append(f"{r['versions']:>9} {r['groups']:>7} {r['rollouts']:>9} {r['mean_reward']:>12.3f} "
                     f"{r['solved_share']:>9.3f} {r['signal_share']:>7.3f} {r['turns_mean']:>6.2f}")
    if len(rows) < len(rep["versions"]):
        lines.append(f"({len(rep['versions'])} versions in {len(rows)} ranges; --json PATH writes each)")
    lines += ["", *(f"wrote {p}" for p in rep["pngs"])]
    return "\n".join(lines)


def version_ranges(rows: list[dict], at_most: int) -> list[dict]:
    """``version_row``s merged into at most ``at_most`` ranges of equal width in versions (each
    share weighted by what it counts: rollouts, or groups for the signal share); labelled
    "first-last" when a range holds more than one version."""
    if len(rows) <= at_most:
        return [{**r, "versions": str(r["policy_version"])} for r in rows]
    first, last = rows[0]["policy_version"], rows[-1]["policy_version"]
    width = -(-(last - first + 1) // at_most)
    bins: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        bins[(r["policy_version"] - first) // width].append(r)
    out = []
    for b in sorted(bins):
        rs, n, g = bins[b], sum(r["rollouts"] for r in bins[b]), sum(r["groups"] for r in bins[b])
        mean = {k: sum(r[k] * r["rollouts"] for r in rs) / n for k in ("mean_reward", "solved_share", "turns_mean")}
        label = "-".join(dict.fromkeys(str(r["policy_version"]) for r in (rs[0], rs[-1])))
        out.append({"versions": label, "groups": g, "rollouts": n, **mean,
                    "signal_share": sum(r["signal_share"] * r["groups"] for r in rs) / g})
    return out


# -- whatif ----------------------------------------------------------------------------------
def whatif(cfg, uri: str, out_dir: str | None, strategies=BUILTIN_STRATEGIES, rounds: int | None = None,
           per_round: int = 16, progress: bool = True) -> dict:
    """Each strategy (at the run's other settings) chooses problems from the archived ones; the
    outcome of a choice is the problem's next archived group (cycling). Counts what each chose
    and what it spent on zero-signal groups."""
    groups = served_outcomes(uri)
    outcomes: dict[str, list[list[float]]] = defaultdict(list)
    for g in groups:
        outcomes[g.problem_id].append(g.rewards)
    rounds = rounds or max(1, math.ceil(len(groups) / per_round))
    results = {}
    for strategy in strategies:
        with _progress(rounds * per_round, f"whatif {strategy}", progress) as bar:
            results[strategy] = simulate(cfg, strategy, outcomes, rounds, per_round, bar)
    if out_dir:
        from prl import plots

        plots.zero_signal_bars(results, out_dir.rstrip("/") + "/whatif.png")
    return {"rounds": rounds, "per_round": per_round, "problems": len(outcomes), "strategies": results}


def simulate(cfg, strategy: str, outcomes: dict[str, list[list[float]]], rounds: int, per_round: int, bar) -> dict:
    """One strategy's choices over the archived outcomes: what it generated, trained, and
    spent on groups without a signal."""
    from prl.scheduler.samplers import make_sampler

    problems = sorted(outcomes)
    whole = max(len(r) for runs in outcomes.values() for r in runs)  # a whole group's completions
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"strategy": strategy}),
                                 "sampling": cfg.sampling.model_copy(update={"group_size": whole})})
    sampler = make_sampler(cfg, np.zeros(len(problems), dtype=np.int32))
    cursor, chosen = Counter(), Counter()
    spent = zero_signal = trained = 0
    for version in range(rounds):
        sampler.on_version(version)
        picks = sampler.next(per_round, set())
        outcome = []
        for p in (problems[i] for i in picks):
            rewards = outcomes[p][cursor[p] % len(outcomes[p])]
            cursor[p] += 1
            chosen[p] += 1
            spent += len(rewards)
            zero_signal += 0 if has_signal(rewards) else len(rewards)
            trained += len(rewards) if (has_signal(rewards) or not getattr(sampler, "zero_variance_filter", False)) else 0
            outcome.append(group_outcome(rewards, cfg.task.success_threshold))
        if picks:
            solved, attempts, signal = zip(*outcome)
            sampler.observe_many(picks, solved, attempts, version, signal=signal)
        bar.update(per_round)
    return {"rollouts_generated": spent, "zero_signal_rollouts": zero_signal, "zero_signal_share": zero_signal / max(1, spent),
            "rollouts_trained": trained, "distinct_problems": len(chosen), "top_problems": chosen.most_common(5)}


def format_whatif(res: dict) -> str:
    lines = [f"{res['rounds']} rounds of {res['per_round']} over {res['problems']} archived problems",
             f"{'strategy':<18} {'generated':>9} {'zero-signal':>11} {'share':>6} {'trained':>8} {'distinct':>8}  most chosen"]
    for name, r in res["strategies"].items():
        top = ", ".join(f"{p} x{n}" for p, n in r["top_problems"][:3])
        lines.append(f"{name:<18} {r['rollouts_generated']:>9} {r['zero_signal_rollouts']:>11} {r['zero_signal_share']:>6.2f} "
                     f"{r['rollouts_trained']:>8} {r['distinct_problems']:>8}  {top}")
    return "\n".join(lines)


# -- publish / train -------------------------------------------------------------------------
def to_batches(groups: Iterable[RolloutGroup], cfg) -> Iterator[TrainBatch]:
    """The groups, in archive order, as TrainBatches (fresh only: the archive has no replay) of
    ``scheduler.groups_per_batch`` groups within the token budget of one message, made as the
    groups come.

    Batch ``seq`` is stamped with policy version ``seq``, the version a learner starting from
    scratch has when it takes it, so its staleness filter keeps every archived rollout (the
    original versions belong to another run's clock); the behaviour log-probs are kept."""
    from prl.scheduler.batches import compose_batch
    from prl.scheduler.service import BATCH_BYTES_PER_TOKEN

    per_batch, max_tokens = cfg.scheduler.groups_per_batch, cfg.transport.kafka.max_message_bytes // BATCH_BYTES_PER_TOKEN
    source = (g for g in groups if g.has_completions)
    pending, seq, generated = [], 0, 0
    while True:
        pending += itertools.islice(source, max(0, per_batch - len(pending)))
        if not pending:
            return
        chunk, pending = pending[:per_batch], pending[per_batch:]
        chunk = [dataclasses.replace(g, policy_version=seq) for g in chunk]
        generated += sum(len(g.rollouts) for g in chunk)
        comp = compose_batch(chunk, seq=seq, learner_version=seq, rollouts_generated=generated, tau_max=10**9,
                             max_tokens=max_tokens, buffer=None, replay_ratio=0.0, warmup_updates=0)
        pending = comp.leftover + pending
        if comp.batch is not None:
            yield comp.batch
            seq += 1


def publish(cfg, transport, groups: ArchivedGroups, rate: float, progress: bool = True) -> int:
    """Archived groups as batches on ``<run>.batches``, at most ``rate`` batches per second. The
    command is the run's batch writer while it publishes: it claims a scheduler epoch (a running
    scheduler of the run is fenced) and stamps it on every batch. The caller opens the archive
    and the transport first, and the first batch is made before the claim: a command that
    cannot publish fences nothing."""
    from prl import epochs
    from prl.schemas import encode, headers
    from prl.schemas.topics import BATCHES, topic_name

    published = 0
    with _progress(len(groups), "publish", progress) as bar:
        batches = to_batches(counted(groups, bar), cfg)
        if (first := next(batches, None)) is None:
            raise UsageError(nothing_to_train(groups.uri))
        epoch = epochs.claim(cfg.run.run_dir, "scheduler")
        transport.ensure_topics(cfg.run.name)
        pub = transport.publisher()
        for b in itertools.chain([first], batches):
            t0 = time.monotonic()
            b = dataclasses.replace(b, epoch=epoch)
            pub.publish(topic_name(cfg.run.name, BATCHES), encode(b), headers=headers(b))
            pub.flush()
            published += 1
            if rate > 0:
                time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - t0)))  # the rate limit itself
    pub.close()
    return published


def nothing_to_train(uri: str) -> str:
    return (f"no group of the archive under {uri} carries completions (only problems the producers could not serve, "
            "or groups sent as their rewards alone): nothing to train")


def counted(groups: ArchivedGroups, bar) -> Iterator[RolloutGroup]:
    """The served groups, each counted on ``bar`` as it is read."""
    for g in groups:
        bar.update(1)
        if not g.error and g.rollouts:
            yield g


def train(cfg, uri: str, out_dir: str, progress: bool = True) -> dict:
    """The learner offline on the archive, from the base model, into ``out_dir`` (a new run
    directory: one that already holds checkpoints is refused, so a live run is never touched).
    Batches are written to a file and consumed from it; every one is trained."""
    from prl.learner.checkpoint import list_checkpoints
    from prl.learner.service import Learner
    from prl.learner.sources import write_batches
    from prl.transport.memory import MemoryTransport

    if list_checkpoints(out_dir):
        raise UsageError(f"{out_dir} already holds checkpoints (a run lives there); choose a new directory with --out")
    groups = ArchivedGroups(uri)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/batches.arrow"
        with _progress(len(groups), "batches", progress) as bar:
            batches = write_batches(path, to_batches(counted(groups, bar), cfg))
        if not batches:
            raise UsageError(nothing_to_train(uri))
        cfg = cfg.model_copy(update={
            "run": cfg.run.model_copy(update={"run_dir": out_dir}),
            "learner": cfg.learner.model_copy(update={"max_steps": max(1, batches)})})
        learner = Learner(cfg, MemoryTransport(), batches_from=path)
        with _progress(batches, "train", progress, unit="batch") as bar:
            done = False
            while not done:
                done = learner.step()
                bar.update(learner.version - bar.n)
        learner.close()
    return {"batches": batches, "steps": learner.version, "run_dir": out_dir, "checkpoint": learner.checkpoint_uri}


def train_dir(args, cfg) -> str:
    """The run directory `prl replay train` trains into."""
    return args.out or cfg.run.run_dir.rstrip("/") + "/replay-train"


def command(args, cfg) -> int:
    """`prl replay report|whatif|publish|train` on an archive (default <run_dir>/archive)."""
    from prl.scheduler.archive import root as archive_root

    uri = args.archive or archive_root(cfg.run.run_dir)
    progress = not args.no_progress
    if args.action in ("report", "whatif"):
        out = args.out or cfg.run.run_dir.rstrip("/") + "/replay"
        if args.action == "report":
            result = report(uri, out)
            print(format_report(result))
        else:
            result = whatif(cfg, uri, out, progress=progress)
            print(format_whatif(result))
            print(f"\nwrote {out}/whatif.png")
    elif args.action == "publish":
        from prl.transport import make_transport

        groups = ArchivedGroups(uri)  # an archive that is not there fences no scheduler, and needs no broker
        n = publish(cfg, make_transport(cfg.transport), groups, args.rate, progress)
        print(f"published {n} batches to {cfg.run.name}.batches")
        return 0
    else:
        result = train(cfg, uri, train_dir(args, cfg), progress)
        print(f"trained {result['steps']} steps on {result['batches']} archived batches into {result['run_dir']} "
              f"(last checkpoint {result['checkpoint']})")
    if args.json:
        write_text(args.json, json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0
