"""`prl explain PROBLEM_ID`: why the scheduler did what it did with one problem, and what
became of its rollouts, from the run directory (the scheduler's last snapshot, the rollout
archive, the learner's last checkpoint). Read-only; works on a running or finished run."""

from __future__ import annotations

import numpy as np

from prl.errors import UsageError
from prl.formulas import group_advantages, has_signal, rollout_age

STATES = {0: "choosable", 1: "in flight", 2: "in the solved pool", 3: "in the unsolved pool", 4: "queued for retest",
          5: "retired"}


def command(args, cfg) -> int:
    print(explain(cfg, args.problem_id))
    return 0


def explain(cfg, problem_id: str) -> str:
    from prl.scheduler.snapshot import read_snapshot
    from prl.tasks import train_problems

    snap = read_snapshot(cfg.run.run_dir)  # a wrong --run-dir first: it is the likelier mistake
    if snap is None:
        raise UsageError(f"no scheduler snapshot under {cfg.run.run_dir}/scheduler yet (scheduler.snapshot_every)")
    problems = train_problems(cfg.task)
    index = {p.id: i for i, p in enumerate(problems)}
    if problem_id not in index:
        raise UsageError(f"{problem_id!r} is not a training problem of this run's task (e.g. {problems[0].id!r})")
    state, fresh, replay, _ = snap
    sampler, group = restore_sampler(cfg, problems, state)
    i = index[problem_id]
    uses_label = cfg.scheduler.strategy == "success_variance" and cfg.scheduler.priority.prior == "group"
    lines = [f"{problem_id}{f' (group {group[i]!r})' if uses_label else ''} at learner version {state['learner_version']}:"]
    lines += why(sampler, i, cfg.scheduler) if cfg.scheduler.strategy == "success_variance" else \
        why_uniform(sampler, i, cfg.scheduler.strategy)
    lines += history(cfg, problem_id, state["learner_version"], replay)
    return "\n".join(lines)


def why_uniform(s, i: int, strategy: str) -> list[str]:
    """A uniform sampler's problem i: how often tried, and whether the drop rule left it out."""
    dropped = ("; never solved after a whole group, so dropped: not drawn again "
               "(scheduler.uniform_drop_unsolved)") if i in s.dropped else ""
    return [f"  chosen uniformly (strategy {strategy}); tried {int(s.attempts[i])} rollouts{dropped}"]


def restore_sampler(cfg, problems, state: dict):
    from prl.scheduler.samplers import make_sampler
    from prl.scheduler.service import problem_groups

    names, labels, start = problem_groups(cfg, problems)
    sampler = make_sampler(cfg.scheduler, labels, cfg.run.seed, start, cfg.sampling.group_size)
    sampler.load_state_dict(state["sampler"])
    return sampler, [names[g] for g in labels]


PRIOR_WORDS = {  # prior -> (where it comes from, whose rate, whose never-tried problems it is drawn with)
    "group": ("from its group", "group", "its group"),
    "pooled": ("from the whole pool", "pool", "the pool"),
    "flat": ("flat", None, "the pool"),  # no shared rate, and no label reaches the sampler
}

WEIGHT_WORDS = {"variance": "p(1-p)", "signal": "1 - p^G - (1-p)^G (chance of a signal)",
                "solvable": "1 - (1-p)^G (chance of a solve)"}


def why(s, i: int, cfg) -> list[str]:
    """The sampler's view of problem i: its state, estimate, priority and what follows."""
    st, prio = int(s.state[i]), s.priority(i)
    a, b = (float(np.asarray(v).reshape(-1)[0]) for v in s.prior(np.asarray([i])))
    g = int(s.group[i])
    start_words = ", the expected success of its answer-likelihood bin" if s.start_given else ""
    source, shared, drawn_with = PRIOR_WORDS[cfg.priority.prior]
    out = [f"  state: {STATES[st]}" + (" (never tried)" if s.last_tested[i] < 0 and st == 0 else ""),
           f"  outcomes: {s.successes[i]:g} solved of {s.attempts[i]:g} rollouts"
           f"{' (decayed to version ' + str(s.version) + ')' if cfg.priority.half_life_versions else ''}, last tested at version "
           f"{s.last_tested[i]}; prior Beta({a:.2f}, {b:.2f}) {source}"
           + (f" ({shared} rate {float(s.group_rate(g)):.3f} over first tries, from a start of {s.group_start[g]:.3f}{start_words})"
              if s.shared_prior else ""),
           f"  priority {WEIGHT_WORDS[cfg.priority.weight]} = {prio:.4f}"]
    if st == 0:
        choosable = np.flatnonzero(s._state_np == 0)
        w = s.priorities(choosable)
        out.append(f"  a pick is this problem with probability {prio / w.sum():.4f} ({prio / w.mean():.2f}x the average "
                   f"of {len(choosable)} choosable problems)" if s.last_tested[i] >= 0 else
                   f"  never tried: drawn with {drawn_with}'s never-tried "
                   f"problems (priority {s.unseen_priority(g):.4f} each"
                   + (f"; each due once by the group's first pass's end, virtual time {s.unseen_deadline[g]:.3f}, "
                      f"now {s.now:.3f}" if cfg.priority.unseen_clock == "periodic" else "") + "), "
                   f"and {cfg.priority.unseen_share:.0%} of dispatches go to never-tried problems"
                   + (" round-robin over groups" if s.num_groups > 1 else ", in a fixed random order"))
    elif st in (2, 3):
        out.append(f"  its last {abs(int(s.streak[i]))} completions were all {'solved' if st == 2 else 'failed'}: out of the draw; "
                   f"every {cfg.priority.retest_interval} versions {cfg.priority.retest_share:.0%} of the pool is queued for "
                   f"retest, longest-untested first (retests take at most {cfg.priority.retest_cap:.0%} of dispatches)")
    elif st == 5:
        out.append("  retired: a producer could not serve it (see the archive's error column below)")
    return out


def history(cfg, problem_id: str, learner_version: int, replay: list) -> list[str]:
    """Every archived group of the problem and what became of its rollouts."""
    groups, trained = archived(cfg, problem_id), trained_ids(cfg)
    if not groups:
        return ["  no archived group (scheduler.archive, or not answered yet)"]
    in_buffer = {r.rollout_id: r for r in replay if r.problem_id == problem_id}
    out = [f"  {len(groups)} archived group(s):"]
    for g, accepted_at_version in groups:
        if g.error:
            out.append(f"    v{g.policy_version}: not served: {g.error}")
            continue
        adv = group_advantages(g.rewards, scale_by_std=cfg.scheduler.advantage_std)
        ids = [f"{g.dispatch_id}/{k}" for k in range(len(g.rollouts))]
        out.append(f"    v{g.policy_version} (accepted at learner v{accepted_at_version}): rewards "
                   f"{''.join('1' if r > 0 else '0' for r in g.rewards)}, |A| {np.mean(np.abs(adv)):.2f}: "
                   + fates(ids, g.rewards, trained, in_buffer, learner_version, cfg.scheduler.tau_max))
    return out


def fates(ids: list[str], rewards, trained: set, in_buffer: dict, version: int, tau_max: int) -> str:
    """What became of a group's rollouts: trained fresh, in the replay buffer (with age and
    |A|, the replay priority), or not trained and why."""
    n_trained = sum(i in trained for i in ids)
    parts = [f"{n_trained}/{len(ids)} trained"]
    if not n_trained and not has_signal(rewards):
        parts.append("all rewards equal: no signal (dropped by the zero-variance filter)")
    buffered = [in_buffer[i] for i in ids if i in in_buffer]
    if buffered:
        age = rollout_age(version, buffered[0].policy_version)
        a = sorted(abs(r.advantage) for r in buffered)
        parts.append(f"{len(buffered)} in the replay buffer (age {age}, evicted past age {tau_max}; "
                     f"|A| {a[0]:.2f}-{a[-1]:.2f}, drawn in proportion to (|A| + eps)^alpha)")
    elif n_trained:
        parts.append("none left in the replay buffer (evicted by age, or replay off)")
    return "; ".join(parts)


def archived(cfg, problem_id: str) -> list[tuple]:
    from prl.scheduler.archive import groups_from_table, read_archive
    from prl.scheduler.archive import root as archive_root

    try:
        table = read_archive(archive_root(cfg.run.run_dir))
    except FileNotFoundError:
        return []
    table = table.filter(np.asarray(table["problem_id"].to_pylist()) == problem_id)
    return list(zip(groups_from_table(table), table["learner_version"].to_pylist()))


def trained_ids(cfg) -> set[str]:
    """Fresh rollouts the learner's last checkpoint remembers training."""
    from prl.learner.checkpoint import read_state
    from prl.learner.checkpoint import latest_uri

    uri = latest_uri(cfg.run.run_dir)
    return set(read_state(uri).get("trained_rollouts", [])) if uri else set()
