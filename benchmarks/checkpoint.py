"""`prl bench checkpoint`: what a checkpoint costs the learner when its files are written on a
background thread (the state copied to host memory in the step: what a GPU learner does)
against written in the step from the state itself (what a CPU learner does, and every learner
did before), side by side from one run, on local disk and on an S3 server.

Each way runs the real learner in a fresh process on the same file of synthetic batches,
checkpointing every ``--checkpoint-every`` steps, and reports the seconds a checkpoint step
spent on its checkpoint (``learner/checkpoint_seconds``), how long the background writes took
(``learner/checkpoint_write_seconds``) and the wall time of all the steps. Here the learner
trains on the CPU, so the background write competes with training for the same cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time

from benchmarks.common import count, output_file, s3_server, write_json
from benchmarks.memory import in_fresh_process


class Recorded:
    """A metrics sink that keeps the learner's rows."""

    def __init__(self):
        self.rows: list[dict] = []

    def write(self, service: str, values: dict, **context) -> None:
        self.rows.append(values)

    def table(self, *args) -> None:
        pass


def one_way(way: str, run_dir: str, batches: str, model: str, steps: int, every: int) -> dict:
    """The learner over ``batches`` into ``run_dir``, checkpoints in the background or in the step."""
    from prl import logs
    from prl.learner import service
    from prl.learner.service import Learner
    from prl.schemas.config import load_config
    from prl.transport.memory import MemoryTransport

    logs.configure("console", "warning")
    if way == "background":
        service.BACKGROUND_DEVICES = ("cpu", "cuda")  # as on a GPU
    cfg = load_config(overrides=[f"run.run_dir={json.dumps(run_dir)}", f"model.path={json.dumps(model)}", "scheduler.tau_max=1000", "learner.eval_every=0", f"learner.checkpoint_every={every}",
                                 f"learner.max_steps={steps}"])
    metrics = Recorded()
    learner = Learner(cfg, MemoryTransport(), metrics, batches_from=batches)
    t0 = time.perf_counter()
    while not learner.step():
        pass
    learner.close()
    wall = time.perf_counter() - t0
    blocked = [r["checkpoint_seconds"] for r in metrics.rows if "checkpoint_seconds" in r]
    written = [r["checkpoint_write_seconds"] for r in metrics.rows if "checkpoint_write_seconds" in r]
    trained = [r["train_seconds"] for r in metrics.rows if "train_seconds" in r]
    return {"checkpoints": len(blocked), "blocked_s": blocked, "written_s": written, "train_s": sum(trained),
            "wall_s": wall, "background": learner.checkpoints_in_background}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prl bench checkpoint", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-adder", help="a model directory (e.g. an imported SmolLM2)")
    ap.add_argument("--steps", type=count, default=12)
    ap.add_argument("--checkpoint-every", type=count, default=4)
    ap.add_argument("--rollouts", type=count, default=8, help="rollouts per batch (16 + 32 tokens each)")
    ap.add_argument("--json", metavar="PATH", type=output_file)
    args = ap.parse_args(argv)

    from transformers import AutoConfig

    from benchmarks.learner import synthetic_batches
    from prl.learner.sources import write_batches
    from prl.models import base_weight_shapes, resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    params = sum(math.prod(shape) for shape in base_weight_shapes(model_dir).values())
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        batches = f"{tmp}/batches.arrow"
        write_batches(batches, synthetic_batches(args.steps, args.rollouts, 16, 32, vocab))
        with s3_server(tmp, "prl-bench"):  # the fresh processes take its environment with them
            for store, root in (("local", f"{tmp}/runs"), ("s3", "s3://prl-bench/runs")):
                for way in ("background", "in_step"):
                    results[f"{store}/{way}"] = in_fresh_process(one_way, way, f"{root}/{store}-{way}", batches, args.model,
                                                                 args.steps, args.checkpoint_every)
    report(args, params, results)
    write_json(args, parameters=params, **results)
    return 0 if all(r["background"] == way.endswith("background") for way, r in results.items()) else 1


def report(args, params: int, results: dict) -> None:
    print(f"learner checkpoints: {args.model} ({params / 1e6:,.1f}M parameters; float32 weights and AdamW state, "
          f"{12 * params / 1e9:,.2f} GB a checkpoint), {args.steps} steps, a checkpoint every {args.checkpoint_every}")
    print(f"{'store':<7}{'checkpoints':<14}{'s of the step each':>20}{'s written each':>16}{'wall s, all steps':>19}")
    for key, r in results.items():
        store, way = key.split("/")
        written = f"{sum(r['written_s']) / len(r['written_s']):.2f}" if way == "background" else "(in the step)"
        print(f"{store:<7}{way.replace('_', ' the '):<14}{sum(r['blocked_s']) / r['checkpoints']:>20.2f}{written:>16}"
              f"{r['wall_s']:>19.1f}")


if __name__ == "__main__":
    sys.exit(main())
