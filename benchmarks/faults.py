"""`prl bench faults`: the pipeline through network faults, services never killed.

Each run starts a broker (tansu), an S3 server, and the four services as `prl` processes
(tests/support/cluster.py), one of the servers reached only through a TCP proxy. Once the
learner has stepped twice, for ``--fault-seconds``: with ``--cut broker`` (the default) the
proxy resets every connection every 2-7 s and refuses new ones for 1-3 s after each reset; with
``--cut store`` it resets every connection to the object store and refuses new ones throughout.
Then the network heals and the run must finish by itself. Per run:
the seconds from the heal to the learner's next step (a run with no step within 120 s is a
stall), and whether any dispatch was lost, batch trained twice or skipped, or fresh rollout
trained twice (tests/support/cluster.py check_invariants).

Needs the repository's checkout (the test helpers start the servers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import count, natural, output_file, write_json

BEFORE = {"broker": "edf0c08 (publishes not kept, 30 s reconnect backoff): 1 stall in 4 runs of 90 s, recovery 9-21 s otherwise",
          "store": "f13ff53 (a step's storage error stopped its service): 1 stall in 1 run of 30 s (the run never finished)"}
CUTS = {"broker": "s of connection resets (every 2-7 s) and refusals (1-3 s) between the services and the broker",
        "store": "s with every connection to the object store reset and new ones refused"}


def one_run(tmp: Path, index: int, args) -> dict:
    import fsspec

    from tests.support.cluster import CREDENTIALS, network_fault_run, storage_fault_run
    from tests.support.servers import S3Server

    server = S3Server(log_path=tmp / "s3.log")
    server.create_bucket("prl-runs")
    os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": server.endpoint})
    fsspec.filesystem("s3").clear_instance_cache()
    name, max_steps = f"faults-{index}-{int(time.time())}", 2 + args.steps_per_fault_second * args.fault_seconds
    try:
        if args.cut == "store":
            run = storage_fault_run(tmp, int(server.endpoint.rsplit(":", 1)[1]), name, args.fault_seconds, max_steps)
        else:
            run = network_fault_run(tmp, name, args.fault_seconds, max_steps, seed=args.seed + index)
        return {**run, "broken": None}
    except AssertionError as exc:  # an invariant broken: something lost, trained twice or skipped
        return {"recovery_s": None, "measured": True, "broken": str(exc)[:300]}
    finally:
        server.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench faults", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=count, default=20)
    ap.add_argument("--fault-seconds", type=count, default=90)
    ap.add_argument("--steps-per-fault-second", type=count, default=4,
                    help="learner.max_steps = 2 + this x fault seconds: the run must outlast the faults")
    ap.add_argument("--cut", choices=sorted(CUTS), default="broker", help="what the faults cut the services from")
    ap.add_argument("--seed", type=natural, default=0)
    ap.add_argument("--keep", metavar="DIR", help="keep each run's logs under DIR")
    ap.add_argument("--json", metavar="PATH", type=output_file, help="write the figures as JSON")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's test helpers
    runs = []
    print(f"{args.cut} faults: {args.runs} runs, {args.fault_seconds} {CUTS[args.cut]}")
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(args.keep) / f"run-{i}" if args.keep else Path(tmp)
            where.mkdir(parents=True, exist_ok=True)
            run = one_run(where, i, args)
        runs.append(run)
        state = "broken: " + run["broken"] if run["broken"] else \
            "not measured: the run finished before the heal" if not run["measured"] else \
            "stalled" if run["recovery_s"] is None else f"training again {run['recovery_s']} s after the heal"
        print(f"  run {i + 1:>2}: {state} (step {run.get('step_at_heal', '?')} at the heal"
              + (f", {run.get('resets', '?')} resets)" if args.cut == "broker" else ")"), flush=True)
    recovered = [r["recovery_s"] for r in runs if r["recovery_s"] is not None]
    stalls = sum(r["recovery_s"] is None and r["measured"] and not r["broken"] for r in runs)
    broken = sum(bool(r["broken"]) for r in runs)
    summary = {"runs": len(runs), "measured": sum(r["measured"] for r in runs), "stalls": stalls, "broken": broken,
               "recovery_median_s": round(statistics.median(recovered), 1) if recovered else None,
               "recovery_max_s": max(recovered) if recovered else None}
    print(f"prl:    {stalls} stalls, {broken} runs with a lost, repeated or skipped batch or rollout; recovery median "
          f"{summary['recovery_median_s']} s, max {summary['recovery_max_s']} s (goal: 0, 0, max <= 30 s)")
    print(f"before: {BEFORE[args.cut]}")
    write_json(args, runs=runs, summary=summary, before=BEFORE[args.cut])
    return 0 if not stalls and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
