"""PNG plots people would rather look at than read."""

from __future__ import annotations

import io

import fsspec


def save_png(fig, out_uri: str, dpi: int) -> None:
    """Write a matplotlib figure as PNG to a path or fsspec URI, and close it."""
    import matplotlib.pyplot as plt

    fig.set_dpi(dpi)  # lay out at the resolution written: text does not scale exactly with it
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    with fsspec.open(out_uri, "wb") as f:
        f.write(buf.getvalue())


def learning_curve(rows: list[dict], out_uri: str, title: str = "held-out accuracy") -> bool:
    """Held-out accuracy (overall and per difficulty) against rollouts generated; False (and
    nothing written) when the rows hold no evaluation."""
    plt = pyplot()
    evals = [r for r in rows if "eval/accuracy" in r]
    if not evals:
        return False
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    x = [r.get("rollouts_generated", 0) for r in evals]
    keys = sorted({k for r in evals for k in r if k.startswith("eval/accuracy_d")})
    keys = keys if len(keys) > 1 else []  # one difficulty (a dataset without levels) is the mean itself
    ax.plot(x, [r["eval/accuracy"] for r in evals], "k-o", lw=2, ms=3, label="mean over difficulties")
    for k in keys:
        ax.plot(x, [r.get(k, float("nan")) for r in evals], "--", lw=1, label=f"difficulty {k.rsplit('_d', 1)[1]}")
    ax.set_xlabel("rollouts generated")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside the axes: no line hidden under it
    save_png(fig, out_uri, dpi=110)
    return True


def priority_histogram(priorities, success_rates, out_uri: str, title: str = "scheduler") -> None:
    """Two panels: the distribution of problem priority p(1-p) (up to 1/4), and of observed
    success rates."""
    plt = pyplot()
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    counts, _, _ = a.hist(priorities, bins=40, range=(0, 0.25), color="tab:blue")
    a.set_xlabel("priority p(1-p)", fontsize=8)
    a.set_ylabel("problems")
    if counts.any():  # a log axis needs a bar to scale
        a.set_yscale("log")
    tested = success_rates[~np.isnan(success_rates)]
    b.hist(tested, bins=20, range=(0, 1), color="tab:green")
    b.set_xlabel(f"observed success rate ({len(tested):,} tested problems)")
    fig.suptitle(title)
    save_png(fig, out_uri, dpi=100)


def pyplot():
    """matplotlib's pyplot on the file-only backend (no display on a server or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def by_version(rows: list[dict], out_uri: str) -> None:
    """Mean reward and share of groups with a signal, per policy version (an archive report)."""
    plt = pyplot()
    versions = [r["policy_version"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(versions, [r["mean_reward"] for r in rows], "k-o", ms=3, label="mean reward")
    ax.plot(versions, [r["signal_share"] for r in rows], "--", label="groups with signal")
    ax.set_xlabel("policy version")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title("reward by policy version")
    save_png(fig, out_uri, 110)


def success_trajectories(series: dict[str, tuple[list, list]], out_uri: str) -> None:
    """Success rate per policy version, one line per difficulty."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, "-o", ms=2, label=name)
    ax.set_xlabel("policy version")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("success-rate trajectories by difficulty")
    save_png(fig, out_uri, 110)


def age_histogram(ages, out_uri: str) -> None:
    """Rollout ages (learner version - policy version) at acceptance."""
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(ages, bins=np.arange(ages.min(), ages.max() + 2) - 0.5 if len(ages) else 1, color="tab:blue")
    ax.set_xlabel("age at acceptance (learner version - policy version)")
    ax.set_ylabel("groups")
    ax.set_title("rollout age")
    save_png(fig, out_uri, 110)


def zero_signal_bars(results: dict, out_uri: str) -> None:
    """Per strategy, the share of generation spent on groups without a signal."""
    plt = pyplot()
    names = list(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [results[n]["zero_signal_share"] for n in names], color="tab:red")
    ax.set_ylabel("generation spent on zero-signal groups")
    ax.set_ylim(0, 1)
    ax.set_title("what-if: strategies on the archived outcomes")
    save_png(fig, out_uri, 110)


def run_report(rows: list[dict], out_uri: str) -> None:
    """One page for a run from every service's metrics: held-out accuracy, reward, loss and the
    policy's entropy on fresh rollouts, the share of groups with a signal and of replayed rollouts, rollout ages, stale drops, and
    how far off-policy the learner trains: the KL to the behaviour policy of age-0 (the engine
    mismatch), stale and replayed rollouts, the age-0 ratio's quantiles, and over the whole run
    the clipped tokens and KL by rollout age."""
    plt = pyplot()
    learner = [r for r in rows if "learner/loss" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    sched = [r for r in rows if r.get("service") == "scheduler" and "scheduler/signal_share" in r]
    fig, axes = plt.subplots(4, 2, figsize=(11, 13))
    panels = [
        (axes[0][0], evals, "rollouts_generated", ["eval/accuracy"], "held-out accuracy"),
        (axes[0][1], learner, "step", ["learner/mean_reward", "learner/loss", "learner/fresh/entropy"],
         "trained reward, loss and the policy's entropy (nats)"),
        (axes[1][0], sched, "seq", ["scheduler/signal_share", "scheduler/retest_share", "scheduler/never_dispatched_share"],
         "scheduler shares"),
        (axes[1][1], learner, "step", ["learner/replay_share", "learner/age_mean", "learner/stale_dropped"], "replay and ages"),
        (axes[2][0], learner, "step", ["learner/mismatch/kl", "learner/stale/approx_kl", "learner/replay/approx_kl"],
         "KL to the behaviour policy (k3)"),
        (axes[2][1], learner, "step", ["learner/mismatch/ratio_q0.01", "learner/mismatch/ratio_q0.5", "learner/mismatch/ratio_q0.99"],
         "engine-trainer ratio at age 0"),
    ]
    for ax, data, x, keys, title in panels:
        for key in keys:
            points = [(r.get(x, 0), r[key]) for r in data if key in r]
            if points:
                ax.plot(*zip(*points), ".-", lw=1.2, ms=3, label=key.split("/", 1)[1])
        ax.set_xlabel(x.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:  # a run too short (or a service not yet started) to have these figures
            no_data(ax)
    age_panels(axes[3], by_age(learner))
    save_png(fig, out_uri, 100)


def age_panels(axes, ages: list[tuple]) -> None:
    """The whole run's trained tokens by rollout age: the share clipped, and their KL."""
    for ax, column, title in ((axes[0], 2, "share of tokens clipped, by rollout age (whole run)"),
                              (axes[1], 3, "KL to the behaviour policy (k3), by rollout age (whole run)")):
        ax.bar(range(len(ages)), [a[column] for a in ages], color="tab:blue")
        ax.set_xticks(range(len(ages)), [a[0] for a in ages])
        ax.set_xlabel("age (learner versions; fresh and replayed rollouts)")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        if not ages:
            no_data(ax)


def no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes, color="grey")


def by_age(learner: list[dict]) -> list[tuple[str, int, float, float]]:
    """(age, tokens, share clipped, k3 KL) over every step of the run (token-weighted), youngest first."""
    totals: dict[str, list[float]] = {}
    for r in learner:
        for key, n in r.items():
            if key.startswith("learner/age/") and key.endswith("/tokens"):
                age = key.split("/")[2]
                t = totals.setdefault(age, [0, 0.0, 0.0])
                t[0] += n
                t[1] += n * r[f"learner/age/{age}/clip_fraction"]
                t[2] += n * r[f"learner/age/{age}/approx_kl"]
    return [(a, int(t[0]), t[1] / t[0], t[2] / t[0]) for a, t in sorted(totals.items(), key=lambda at: int(at[0].rstrip("+")))]
