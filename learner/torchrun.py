"""``python -m prl.learner.torchrun ARGS``: torchrun, same arguments, for a learner sharded over
the GPUs of a node (deploy/k8s/README.md), whose SIGTERM or Ctrl-C is a stop and not a failure.
torchrun passes the signal to the ranks, which stop after the same step and checkpoint it
(learner/service.py); then torchrun raises it as an error with a traceback and exits 1. This
says it in one line and exits 128 + the signal's number, as a shell reports a stopped command
(and as ``prl run`` does). A rank that fails still fails it as torchrun does."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except SignalException as exc:
        print(f"prl.learner.torchrun: stopped by {exc.sigval.name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
