"""`prl bench rewards`: completions scored per second by the producer's reward runner at its
default `producer.reward_workers`, against one call at a time (the runner before it had workers).

Two rewards, on one generation call's worth of completions (``--groups`` x ``--group-size``):

- judge: each call asks a judge over HTTP on this machine (a threaded server that answers after
  ``--latency-ms``, as a judge model's API or a code sandbox would) whether the completion is right;
- exact_match: the built-in task's reward, which waits on nothing (the threads' own cost).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.common import count, output_file, positive, write_json
from prl.rewards import RewardRunner
from prl.schemas.config import ProducerConfig
from prl.tasks.addition import exact_match


@contextmanager
def judge_server(latency_s: float):
    """A local judge: POST {"completion", "answer"} -> {"score"}, after ``latency_s``."""
    class Judge(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)
            out = json.dumps({"score": float(body["completion"] == body["answer"])}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # the default 5 drops connections made at once, which wait 1 s to retry

    server = Server(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def judge_reward(url: str):
    def judge(completion: str, answer: str) -> float:
        request = urllib.request.Request(url, json.dumps({"completion": completion, "answer": answer}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return float(json.loads(response.read())["score"])
    return judge


def completions_per_s(fn, workers: int, n: int, calls: int) -> float:
    """Completions scored per second over ``calls`` calls of ``n``, after one warm-up call."""
    runner = RewardRunner(fn, workers=workers)
    completions, answers = [str(i % 7) for i in range(n)], ["3"] * n
    runner.many(completions, answers)
    t0 = time.perf_counter()
    for _ in range(calls):
        scores = runner.many(completions, answers)
    seconds = time.perf_counter() - t0
    runner.close()
    assert scores == [float(c == "3") for c in completions] and runner.errors == runner.timeouts == 0
    return n * calls / seconds


def main(argv=None) -> int:
    default_workers = ProducerConfig().reward_workers
    ap = argparse.ArgumentParser(prog="prl bench rewards", description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=count, default=16, help="groups in the call (producer.max_dispatches_per_call)")
    ap.add_argument("--group-size", type=count, default=8, help="completions per group (sampling.group_size)")
    ap.add_argument("--latency-ms", type=positive, default=200.0, help="the judge's answer time per call")
    ap.add_argument("--calls", type=count, default=3, help="calls measured per figure, after a warm-up call")
    ap.add_argument("--workers", type=count, default=default_workers, help="producer.reward_workers to measure")
    ap.add_argument("--json", metavar="PATH", type=output_file, help="write the figures as JSON")
    args = ap.parse_args(argv)
    n = args.groups * args.group_size
    with judge_server(args.latency_ms / 1000) as url:
        rewards = {"judge": judge_reward(url), "exact_match": exact_match}
        figures = {name: {str(w): completions_per_s(fn, w, n, args.calls) for w in (args.workers, 1)}
                   for name, fn in rewards.items()}
    print(f"reward scoring: {n} completions a call ({args.groups} groups x {args.group_size}), "
          f"the judge answering in {args.latency_ms:g} ms")
    print(f"{'completions/s':<16}{f'{args.workers} workers':>14}{'1 at a time':>14}{'speed-up':>10}")
    for name, per in figures.items():
        print(f"{name:<16}{per[str(args.workers)]:>14,.1f}{per['1']:>14,.1f}{per[str(args.workers)] / per['1']:>9.2f}x")
    write_json(args, completions_per_s=figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
