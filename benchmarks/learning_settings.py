"""What `prl bench learning` runs: each strategy's config items, the learning rates and optimizer
steps per batch tuned for it, the reported rows' picks and the tuning rule's margin, the modes and
the real task's sizes; and how --lr and --set items become a run's settings and its record (which
items a strategy takes, which acted, the strategy a run with them ran as)."""

from __future__ import annotations

import math

from prl.schemas.config import parse_override

NO_REPLAY = "scheduler.replay.enabled=false"
SCREEN = "scheduler.screen_size=2"
STRATEGIES = {
    "uniform": ["scheduler.strategy='uniform'", NO_REPLAY],
    "dapo_filter": ["scheduler.strategy='dapo_filter'", NO_REPLAY],
    "priority_flat": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'", NO_REPLAY],
    "priority_pooled": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='pooled'", NO_REPLAY],
    "priority_group": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'", NO_REPLAY],
    "priority_shuffled": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'",
                          "scheduler.priority.shuffle_groups=true", NO_REPLAY],
    "replay_alone": ["scheduler.strategy='uniform'", "scheduler.replay.enabled=true"],
    "naive_replay": ["scheduler.strategy='uniform'", "scheduler.replay.enabled=true", "scheduler.replay.alpha=0.0",
                     "scheduler.tau_max=1000000"],
    "full": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'", "scheduler.replay.enabled=true"],
    "full_pooled": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='pooled'", "scheduler.replay.enabled=true"],
    "priority_likelihood": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'", NO_REPLAY],
    "full_likelihood": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='group'", "scheduler.replay.enabled=true"],
    "priority_flat_screen": ["scheduler.strategy='success_variance'", "scheduler.priority.prior='flat'", NO_REPLAY, SCREEN],
    "dapo_screen": ["scheduler.strategy='dapo_filter'", NO_REPLAY, SCREEN],
    "uniform_drop": ["scheduler.strategy='uniform'", "scheduler.uniform_passes=true", "scheduler.uniform_drop_unsolved=true",
                     NO_REPLAY],
}
# The baselines draw the pool as a data loader does, in shuffled passes: the stronger of the two ways
# measured (benchmarks/RESULTS.md, "Baselines that draw the pool in passes"). Given as --set items,
# so each run records them and runs made before, with independent draws, do not pool with these.
BASELINE_SETS = ["uniform:scheduler.uniform_passes=true", "dapo_filter:scheduler.uniform_passes=true"]
LIKELIHOOD = {"priority_likelihood", "full_likelihood"}  # groups from the starting policy's answer likelihoods
LIKELIHOOD_BINS = 8
# What the default mode runs (the strategies and controls; 16-22 min on 2 cores, two
# runs at once): the pooled-prior ones only when named, with --strategies.
DEFAULT_STRATEGIES = ["uniform", "dapo_filter", "priority_flat", "priority_group", "priority_shuffled", "replay_alone",
                      "naive_replay", "full"]
# The same for every strategy: 8 groups x 8 completions per step, few checkpoints kept, no
# archive or snapshots.
SETTINGS = [
    "scheduler.groups_per_batch=8", "scheduler.max_in_flight=16", "learner.max_steps=100000",
    "scheduler.archive=false", "scheduler.snapshot_every=0", "learner.keep_checkpoints=1", "learner.eval_every=0",
]
# AdamW learning rate per strategy (built-in task): the rate with the highest area under the
# curve on seed 0 in a sweep of 2.5e-5, 5e-5, 1e-4 and 2e-4 (the last three for every strategy,
# 2.5e-5 for four; benchmarks/RESULTS.md); the pooled-prior strategies, added later, the better
# of 2.5e-5 and 5e-5 by median area over seeds 100-104 (not seeds any reported run uses), the
# likelihood-group ones the same way over seeds 100-109 (again once their bins started at their
# expected success); a strategy that takes more than one step per batch, its rate chosen with its
# steps (UPDATES).
# Strategies that drop zero-variance groups average the loss over fewer, all-informative
# tokens, so one rate is a larger step for them than for uniform GRPO: a shared rate would
# favour whichever strategy it happens to suit.
LR = {"uniform": 2.5e-5, "dapo_filter": 5e-5, "priority_flat": 2.5e-5, "priority_pooled": 2.5e-5, "priority_group": 1.25e-5,
      "priority_shuffled": 1.25e-5, "replay_alone": 5e-5, "naive_replay": 5e-5, "full": 2.5e-5, "full_pooled": 5e-5,
      "priority_likelihood": 5e-5, "full_likelihood": 5e-5, "priority_flat_screen": 2.5e-5, "dapo_screen": 2.5e-5,
      "uniform_drop": 2.5e-5}
# Optimizer steps per batch (GRPO's mu, learner.updates_per_batch) where it is not 1: per strategy,
# with its rate, the pair of the highest median area under the curve of those tried on tuning seeds
# (100-119 on the small pool for uniform, 100-109 for the others, 100-107 on the large;
# benchmarks/RESULTS.md). Tried at mu = 1 and 2 on the small pool: every strategy (the baselines
# also at 3 and 4; at 2, the baselines at half and twice their rates, the flat, group and
# likelihood priorities at a quarter and half of theirs, full at half and twice, the shuffled
# labels at the group prior's pair; the two screened strategies at 2.5e-5 and 5e-5 with mu = 1
# and 2, and at 1.25e-5 with mu = 2, screens of 2; screens of 4 at mu = 1 at the two rates); on
# the large pool: uniform, DAPO, full and full_likelihood. Drawing the pool in passes
# (BASELINE_SETS), the baselines again on seeds 100-109, at half and twice their rates and at
# mu = 3 (uniform also at a quarter, and at mu = 1): DAPO's pair stayed the best; uniform's half
# rate was 0.001 higher by area there and lower on the thirty reported seeds (0.358 against 0.363),
# so its pair stays too, the stronger baseline. uniform_drop: tried as uniform with --set
# scheduler.uniform_drop_unsolved=true (the same configuration) at uniform's pair and half its rate
# on seeds 100-109; uniform's pair scored higher.
UPDATES = {"uniform": 2, "dapo_filter": 2, "priority_group": 2, "priority_shuffled": 2, "priority_flat_screen": 2,
           "dapo_screen": 2, "uniform_drop": 2}
# The reported rows (README, "Where it stands"): each strategy at its tuning pick (``--tuning``; the
# shuffled control at the group prior's, uniform at the stronger of its two best rates on the
# reported seeds, which ADOPT_MARGIN keeps too), as the --lr and --set items their runs record, so
# ``--picks`` runs pool with the stored thirty seeds. The baselines' pick is drawing in passes
# (BASELINE_SETS).
LABEL_PICK = ["scheduler.priority.weight=solvable", "scheduler.priority.pseudo_count=1000", "scheduler.priority.retest=false",
              "scheduler.priority.unseen_share=0", "scheduler.priority.mode=periodic", "scheduler.filter_zero_variance=false"]
GROUP_PICK = [*LABEL_PICK, "scheduler.priority.group_start_weight=0.2"]
LIKELIHOOD_PICK = [*LABEL_PICK, "scheduler.priority.solvable_groups=5"]
FIRST_PASS = "scheduler.priority.unseen_clock=periodic"  # the first look at the pool as a pass
PICKS = {
    "uniform": [], "dapo_filter": [],
    "priority_flat": ["scheduler.priority.weight=signal", "scheduler.priority.retest=false", "scheduler.priority.alpha=0.1",
                      "scheduler.priority.beta=0.1", "scheduler.priority.mode=periodic", FIRST_PASS],
    "priority_group": GROUP_PICK, "priority_shuffled": GROUP_PICK, "full": [*GROUP_PICK, "scheduler.replay.ratio=2.0"],
    "priority_likelihood": [*LIKELIHOOD_PICK, FIRST_PASS],
    "full_likelihood": [*LIKELIHOOD_PICK, FIRST_PASS, "scheduler.replay.ratio=2.0"],
}
PICK_LR = {name: 2.5e-5 for name in PICKS if name not in ("uniform", "dapo_filter")}  # the baselines: LR's
PICK_UPDATES = 2  # every pick takes two optimizer steps per batch
# The tuning rule's margin: a setting tried on the tuning seeds replaces a row's reported setting
# (its pick) only when its median area under the curve there is more than this above the pick's:
# the most two draws of one competitive setting on seeds 100-109 have moved apart (0.0049; the full
# method's pick drawn twice, 0.0044; the pairs in benchmarks/RESULTS.md, "A margin for the tuning
# rule"), rounded up. Set on 2026-11-29 as the tuning runs it decides began (RESULTS.md gives the
# order); the picks adopted before it by less (ratio 2.0 of both full methods, the likelihood rows'
# first look as a pass) stay: undoing them now would choose on the reported seeds, which read them
# lower.
ADOPT_MARGIN = 0.005
MODE_UPDATES = {"large-pool": {"dapo_filter": 2}}  # replaces UPDATES in that mode: a strategy not named takes one step
MU = "learner.updates_per_batch"
BUILTIN_POOL = "[20, 100, 100, 100]"  # training problems per difficulty of the built-in task: revisited ~5 times
TASK_POOL = "[80, 600, 600, 600]"  # the built-in task's own default pool (what `prl run` trains on): visited about once
MODES = {  # name: (seeds, rollout budget, training pool of the built-in task, strategies run when none are named)
    "default": (5, 12_000, BUILTIN_POOL, DEFAULT_STRATEGIES),
    "long": (8, 24_000, BUILTIN_POOL, DEFAULT_STRATEGIES),
    # The final-accuracy comparison where the pool does not cap it: on the small pool every strategy
    # learns its 100 two-digit problems well past what it does on held-out ones (pool_accuracy,
    # benchmarks/RESULTS.md), so the end point says more about the pool than about the choice.
    "large-pool": (5, 12_000, TASK_POOL, ["uniform", "dapo_filter", "full", "full_likelihood"]),
}
# Rates re-tuned for a mode's pool, over LR: on the large pool the better by median area under the
# curve of 2.5e-5, 5e-5 and 1e-4 over seeds 100-107 (not seeds any reported run uses), every
# strategy the mode runs alike (benchmarks/RESULTS.md).
MODE_LR = {"large-pool": {"uniform": 2.5e-5, "dapo_filter": 5e-5, "full": 5e-5, "full_likelihood": 5e-5}}
REAL = {  # --task: the real model on a reasoning-gym task (CPU-sized: 8-12 min per run on 2 cores with AMX); the
    # training pool is `pool` problems drawn at random from the dataset's training split (POOL_SEED,
    # the same for every run), so each is visited about budget / (8 x pool) = 4 times and the
    # priority has results to act on (the test set is the same whatever the pool)
    "strategies": ["uniform", "dapo_filter", "priority_flat", "full"], "seeds": 3, "budget": 1_500, "eval_every": 500, "pool": 48,
}
POOL_SEED = 0  # the real task's pool draw: one pool for every strategy and seed


def strategy_settings(name: str, base: list[str], extra: list[str], run: list[str] = ()) -> list[str]:
    """The overrides a run of strategy ``name`` loads, in one order wherever they are composed (the
    check before any run and each run): the mode's ``base``, the strategy's own items, the run's
    own (directory, seed, evaluation), then ``extra``, its rate, steps per batch and --set items."""
    return [*base, *STRATEGIES[name], *run, *extra]


def override_scope(item: str) -> tuple[str | None, str]:
    """A --set item as (the strategy it is scoped to, None for every one; KEY=VALUE): the scope
    is what precedes a ':' in the key (config keys hold none; values may)."""
    key, eq, value = item.partition("=")
    scope, colon, key = key.rpartition(":")
    return (scope if colon else None), key + eq + value


def strategy_overrides(items: list[str], name: str) -> list[str]:
    """The --set items that apply to strategy ``name``: KEY=VALUE ones apply to every strategy,
    STRATEGY:KEY=VALUE ones to that strategy alone (given as KEY=VALUE)."""
    return [item for scope, item in map(override_scope, items) if scope in (None, name)]


def recorded_overrides(items: list[str], name: str) -> list[str]:
    """What a run of ``name`` records as its --set: its items without the steps per batch, which
    it records (and pooling checks) apart; one item per key, the one that acted."""
    return effective_overrides([item for item in strategy_overrides(items, name) if not sets_mu(item)])


def override_key(item: str) -> str:
    """The KEY of a KEY=VALUE override, as the config reads it (``parse_override``)."""
    return ".".join(parse_override(item)[0])


def effective_overrides(items: list[str]) -> list[str]:
    """KEY=VALUE overrides as they act: per key only the one given last (it overrides the others,
    as --picks' items are overridden by the --set given with it), in the order given."""
    last = {override_key(item): i for i, item in enumerate(items)}
    return [item for i, item in enumerate(items) if last[override_key(item)] == i]


def sets_mu(item: str) -> bool:
    """Whether a KEY=VALUE override sets the optimizer steps per batch."""
    return override_key(item) == MU


def updates_per_batch(overrides: list[str]) -> int:
    """The optimizer steps per batch that ``overrides`` give a run (the last ``MU`` item; 1 without)."""
    items = [parse_override(item)[1] for item in overrides if sets_mu(item)]
    return int(items[-1]) if items else 1


def learning_rates(task: str | None, items: list[str], mode: str = "default") -> dict[str, float]:
    """Each strategy's learning rate: LR's tuned rates on the built-in task, those of the mode's
    pool over them (none with a task: the config's), then ``--lr STRATEGY=LR`` items. Raises
    ValueError naming a wrong item."""
    rates = {} if task else {**LR, **MODE_LR.get(mode, {})}
    for item in items:
        name, _, value = item.partition("=")
        if name not in STRATEGIES:
            raise ValueError(f"--lr {item}: unknown strategy {name!r} (one of {', '.join(STRATEGIES)})")
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not 0 < rate < 1:
            raise ValueError(f"--lr {item}: the rate must be a number between 0 and 1, e.g. {name}=5e-5")
        rates[name] = rate
    return rates


def named_strategy(name: str, items: list[str]) -> tuple[str, list[str]]:
    """The strategy a run of ``name`` with --set ``items`` ran as, and the items left over: the
    most specific strategy whose own items are ``name``'s plus some of ``items`` (uniform with
    scheduler.uniform_passes=true and scheduler.uniform_drop_unsolved=true ran as uniform_drop),
    unless a leftover item sets a key those added ones set; else ``name`` and ``items``."""
    own, best = set(STRATEGIES[name]), None
    for other, theirs in STRATEGIES.items():
        added = set(theirs) - own
        undone = {override_key(item) for item in items if item not in added} & set(map(override_key, added))
        more_specific = best is None or len(theirs) > len(STRATEGIES[best])
        if own < set(theirs) and added <= set(items) and not undone and more_specific:
            best = other
    return (name, items) if best is None else (best, [item for item in items if item not in STRATEGIES[best]])


def pick_args(name: str) -> tuple[list[str], list[str]]:
    """The --lr and --set items ``--picks`` gives a reported row: its rate where it has its own, its
    pick's items and steps per batch, each scoped to it."""
    rate = [f"{name}={PICK_LR[name]}"] if name in PICK_LR else []
    return rate, [f"{name}:{item}" for item in [*PICKS[name], f"{MU}={PICK_UPDATES}"]]
