"""`prl bench archive`: reading a run's rollout archive for statistics (`prl replay report`,
`whatif`: each group's problem, versions, rewards and turns), for one problem (`prl explain`) and
group by group with the tokens (`prl replay train`, `publish`), against reading it whole as groups
and taking from them (what all three did before).

The archive is synthetic and shaped like a GPU run's: ``--groups`` groups of 8 rollouts of
``--tokens`` completion tokens (ids, log-probs and text), 16 groups a policy version, written as the
scheduler writes them (a file per version at each snapshot). Each read runs in a fresh process:
peak resident memory is a process's high-water mark.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import count, output_file, write_json
from benchmarks.memory import in_fresh_process, peak_mb

GROUPS_PER_VERSION = 16
PROBLEMS = 500
WORDS = np.array("the sum of 12 and 34 is 46 so we add the tens then the ones".split())


def write_archive(uri: str, groups: int, tokens: int, seed: int = 0) -> int:
    """The synthetic archive under ``uri``; the number of files written."""
    from prl.scheduler.archive import RolloutArchive
    from prl.schemas import Rollout, RolloutGroup

    rng = np.random.default_rng(seed)
    archive = RolloutArchive(uri, flush_every_s=float("inf"))
    for i in range(groups):
        version = i // GROUPS_PER_VERSION
        rollouts = [Rollout(rng.integers(0, 150_000, tokens, dtype=np.int32), -rng.exponential(1.0, tokens).astype(np.float32),
                            float(rng.random() < 0.4), "stop", " ".join(rng.choice(WORDS, tokens // 2))) for _ in range(8)]
        archive.add(RolloutGroup(f"d{i}", f"p:{i % PROBLEMS}", version, "producer-0", rng.integers(0, 150_000, 200, dtype=np.int32),
                                 1.0, rollouts, created_at=time.time()), version + 1)
        if i % GROUPS_PER_VERSION == GROUPS_PER_VERSION - 1:
            archive.flush()  # the snapshot before each batch
    archive.close()
    return archive.files_written


def one_read(way: str, uri: str, problem: str) -> dict:
    """One read in this process: its seconds, the process's peak memory, and what it found."""
    from prl.scheduler.archive import ArchivedGroups, groups_from_table, read_archive, read_outcomes

    before, t0 = peak_mb(), time.perf_counter()
    if way == "outcomes":
        found = [(o.problem_id, o.policy_version, o.rewards) for o in read_outcomes(uri)]
    elif way == "outcomes_whole":
        found = [(g.problem_id, g.policy_version, g.rewards) for g in groups_from_table(read_archive(uri)) if g.rollouts]
    elif way == "problem":
        found = [g.dispatch_id for g in groups_from_table(read_archive(uri, problem_id=problem))]
    elif way == "problem_whole":
        found = [g.dispatch_id for g in groups_from_table(read_archive(uri)) if g.problem_id == problem]
    else:  # every group in order, tokens and all, each let go once counted (as batches are made)
        groups = ArchivedGroups(uri) if way == "groups" else groups_from_table(read_archive(uri))
        found = [(g.dispatch_id, sum(len(r.completion_ids) for r in g.rollouts)) for g in groups]
    return {"seconds": time.perf_counter() - t0, "peak_mb": peak_mb(), "imports_mb": before, "found": repr(found)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench archive", description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=count, default=3_000, help="archived groups of 8 rollouts (16 a version)")
    ap.add_argument("--tokens", type=count, default=2_000, help="completion tokens per rollout")
    ap.add_argument("--json", metavar="PATH", type=output_file, help="write the figures as JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"{tmp}/archive"
        files = write_archive(uri, args.groups, args.tokens)
        size = sum(p.stat().st_size for p in Path(uri).rglob("*.parquet"))
        results = {way: in_fresh_process(one_read, way, uri, "p:7")
                   for way in ("outcomes", "outcomes_whole", "problem", "problem_whole", "groups", "groups_whole")}
    same = all(results[w].pop("found") == results[f"{w}_whole"].pop("found") for w in ("outcomes", "problem", "groups"))
    print(f"rollout archive: {args.groups:,} groups x 8 rollouts x {args.tokens:,} tokens, {files} files, "
          f"{size / 1e6:,.0f} MB of Parquet")
    print(f"{'read':<34}{'prl: s, peak MB':>18}{'whole: s, peak MB':>20}")
    for way, label in (("outcomes", "report, whatif (every outcome)"), ("problem", "explain (one problem's groups)"),
                       ("groups", "train, publish (every group)")):
        ours, whole = results[way], results[f"{way}_whole"]
        print(f"{label:<34}{ours['seconds']:>10.2f}{ours['peak_mb']:>8,.0f}{whole['seconds']:>12.2f}{whole['peak_mb']:>8,.0f}")
    print(f"a fresh process's imports: {results['outcomes']['imports_mb']:,.0f} MB; the same results both ways: {same}")
    write_json(args, **results, files=files, parquet_bytes=size, same_results=same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
