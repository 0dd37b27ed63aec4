"""`prl explain PROBLEM_ID`: why the scheduler did what it did with one problem, and what
became of its rollouts, from the run directory (the scheduler's last snapshot, the rollout
archive, the learner's last checkpoint). Read-only; works on a running or finished run."""

from __future__ import annotations

import numpy as np

from prl.errors import UsageError
from prl.formulas import group_advantages, has_signal, rollout_age
from prl.scheduler.priority import RETEST_CAP, RETEST_SHARE, STATES, UNSEEN_SHARE, PrioritySampler

HELDOUT_SHOWN = 12  # a held-out problem's answers shown: the newest evaluations'


def command(args, cfg) -> int:
    print(explain(cfg, args.problem_id))
    return 0


def close_ids(problem_id: str, ids: list[str]) -> str:
    """What the person may have meant: the ids closest to the one given, or an example id."""
    import difflib

    close = difflib.get_close_matches(problem_id, ids, n=3, cutoff=0.8)
    return f"did you mean {' or '.join(map(repr, close))}?" if close else f"e.g. {ids[0]!r}"


def explain(cfg, problem_id: str) -> str:
    from prl.scheduler.samplers import make_sampler
    from prl.scheduler.snapshot import read_snapshot
    from prl.tasks import group_indices, heldout_problems, train_problems

    problems = train_problems(cfg.task)
    names, labels = group_indices(problems)
    sampler = make_sampler(cfg, labels)
    snap = read_snapshot(cfg.run.run_dir, lambda state: sampler.check_state(state["sampler"]))
    if snap is None:  # a wrong --run-dir first: it is the likelier mistake
        raise UsageError(f"no scheduler snapshot under {cfg.run.run_dir}/scheduler yet: is --run-dir the run's directory, "
                         "and has its scheduler sent a batch (it writes one before each)?")
    index = {p.id: i for i, p in enumerate(problems)}
    if problem_id in {p.id for p in heldout_problems(cfg.task)}:
        return "\n".join(heldout_history(cfg.run.run_dir, problem_id, cfg.task.success_threshold))
    if problem_id not in index:
        raise UsageError(f"{problem_id!r} is not a training problem of this run's task ({close_ids(problem_id, list(index))})")
    state, fresh, replay, _ = snap
    sampler.load_state_dict(state["sampler"])
    i = index[problem_id]
    label = f" (group {names[labels[i]]!r})" if cfg.task.group_field else ""
    lines = [f"{problem_id}{label} at learner version {state['learner_version']}:"]
    lines += why(sampler, i, cfg) if isinstance(sampler, PrioritySampler) else why_uniform(sampler, i, cfg.scheduler.strategy)
    lines += history(cfg, problem_id, state["learner_version"], replay)
    return "\n".join(lines)


def heldout_history(run_dir: str, problem_id: str, threshold: float, shown: int = HELDOUT_SHOWN) -> list[str]:
    """A held-out problem: never trained; its greedy answer at each evaluated version, newest
    last (the last ``shown`` of them), from <run_dir>/evaluations/; solved: a reward of at
    least ``threshold`` (task.success_threshold)."""
    import json

    import fsspec

    from prl.scheduler.evaluation import answers_dir

    fs, root = fsspec.core.url_to_fs(answers_dir(run_dir))
    answers = []
    for path in sorted(fs.glob(f"{root}/step-*.jsonl")):
        with fs.open(path, "r") as f:
            row = next((r for r in map(json.loads, f) if r["problem_id"] == problem_id), None)
        if row is not None:
            answers.append((int(path.rsplit("-", 1)[1].split(".")[0]), row))
    head = f"{problem_id} is a held-out problem: evaluated greedily by the fleet, never trained"
    if not answers:
        return [head, "  no evaluation written yet (<run_dir>/evaluations/)"]
    solved = sum(row["reward"] >= threshold for _, row in answers)
    answer = answers[0][1]["answer"]
    answer = answer if len(answer) <= 80 else answer[:77] + "..."  # a reasoning-gym answer is its whole entry, as JSON
    lines = [head, f"  answer {answer!r}; solved at {solved} of {len(answers)} evaluated versions"
             + (f"; the last {shown}:" if len(answers) > shown else ":")]
    return lines + [f"    v{v}: reward {row['reward']:g}: " + " ".join(row["text"].split())[:160] for v, row in answers[-shown:]]


def why_uniform(s, i: int, strategy: str) -> list[str]:
    """A sampler other than the priority's: how often problem i was tried."""
    tried = int(s.attempts[i]) if hasattr(s, "attempts") else "?"
    return [f"  chosen by strategy {strategy}, not by priority; tried {tried} rollouts"]


def why(s, i: int, cfg) -> list[str]:
    """The priority sampler's view of problem i: its state, estimate, priority and what follows."""
    st, prio = int(s.state[i]), s.priority(i)
    a, b = (float(np.asarray(v).reshape(-1)[0]) for v in s.prior(np.asarray([i])))
    g = int(s.group[i])
    whose = "its group" if cfg.task.group_field else "the pool"
    out = [f"  state: {STATES[st]}" + (" (never tried)" if s.last_tested[i] < 0 and st == 0 else ""),
           f"  outcomes: {s.successes[i]:.1f} solved of {s.attempts[i]:.1f} rollouts{f' (halved every {s.half_life:g} versions)' if s.half_life else ''}, "
           f"last tested at version {s.last_tested[i]}; "
           f"prior Beta({a:.2f}, {b:.2f}) from {whose} ({whose}'s rate {float(s.group_rate(g)):.3f} over first tries)",
           f"  priority p(1-p) = {prio:.4f}"]
    if st == 0 and s.last_tested[i] >= 0:
        w = s.priorities(np.flatnonzero(s._state_np == 0))
        out.append(f"  a pick is this problem with probability {prio / w.sum():.4f} ({prio / w.mean():.2f}x the average "
                   f"of {len(w)} choosable problems)")
    elif st == 0:
        out.append(f"  never tried: drawn with {whose}'s never-tried problems (priority {s.unseen_priority(g):.4f} each), "
                   f"and {UNSEEN_SHARE:.0%} of dispatches go to never-tried problems"
                   + (" round-robin over groups" if s.num_groups > 1 else ", in a fixed random order"))
    elif st in (2, 3):
        out.append(f"  its last {abs(int(s.streak[i]))} completions were all {'solved' if st == 2 else 'failed'}: out of the draw; "
                   f"every {cfg.scheduler.priority.retest_interval} versions {RETEST_SHARE:.0%} of the pool is queued for "
                   f"retest, longest-untested first (retests take at most {RETEST_CAP:.0%} of dispatches)")
    elif st == 5:
        out.append("  retired: a producer could not serve it (see the archive's error column below)")
    return out


def history(cfg, problem_id: str, learner_version: int, replay: list) -> list[str]:
    """Every archived group of the problem and what became of its rollouts."""
    groups, trained = archived(cfg, problem_id), trained_ids(cfg)
    if not groups:
        return ["  no archived group (not answered yet)"]
    in_buffer = {r.rollout_id: r for r in replay if r.problem_id == problem_id}
    out = [f"  {len(groups)} archived group(s):"]
    for g, accepted_at_version in groups:
        if g.error:
            out.append(f"    v{g.policy_version}: not served: {g.error}")
            continue
        adv = group_advantages(g.rewards)
        ids = [f"{g.dispatch_id}/{k}" for k in range(len(g.rollouts))]
        out.append(f"    v{g.policy_version} (accepted at learner v{accepted_at_version}): rewards "
                   f"{''.join('1' if r > 0 else '0' for r in g.rewards)}, |A| {np.mean(np.abs(adv)):.2f}: "
                   + fates(ids, g.rewards, trained, in_buffer, learner_version, cfg.scheduler.tau_max))
        out += episode_lines(g)
    return out


def episode_lines(g) -> list[str]:
    """For a group of episodes: each one's turns, how it ended, its reward, and its transcript
    (the model's and the environment's turns as the tokenizer decodes them), shortened."""
    from prl.episodes import model_turns

    if not any(len(r.model_mask) for r in g.rollouts):
        return []
    return [f"      episode {k}: {model_turns(r.model_mask)} model turn(s), {r.finish_reason}, reward {r.reward:g}: "
            + " ".join(r.text.split())[:160] for k, r in enumerate(g.rollouts)]


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
    """The problem's archived groups with the learner's version when each was accepted."""
    from prl.scheduler.archive import groups_from_table, read_archive
    from prl.scheduler.archive import root as archive_root

    try:
        table = read_archive(archive_root(cfg.run.run_dir), problem_id=problem_id)
    except FileNotFoundError:
        return []
    return list(zip(groups_from_table(table), table["learner_version"].to_pylist()))


def trained_ids(cfg) -> set[str]:
    """Fresh rollouts the learner's last checkpoint remembers training."""
    from prl.learner.checkpoint import read_state
    from prl.learner.checkpoint import latest_uri

    uri = latest_uri(cfg.run.run_dir)
    return set(read_state(uri).get("trained_rollouts", [])) if uri else set()
