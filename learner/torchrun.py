"""``python -m prl.learner.torchrun ARGS``: torchrun, same arguments, for a learner sharded over
the GPUs of a node (deploy/k8s/README.md), whose SIGTERM or Ctrl-C is a stop and not a failure.
torchrun passes the signal to the ranks, which stop after the same step and checkpoint it
(learner/service.py); then torchrun raises it as an error with a traceback and exits 1. This
says it in one line and exits 128 + the signal's number, as a shell reports a stopped command
(and as ``prl run`` does). A rank that fails still fails it as torchrun does.

Without ``--log-dir`` torchrun keeps its ranks' error files in a ``torchelastic_*`` directory
under the temp dir and leaves it there; this gives it one that goes when torchrun returns."""

from __future__ import annotations

import os
import sys
import tempfile


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    argv = sys.argv[1:] if argv is None else argv
    try:
        if any(a.startswith(("--log-dir", "--log_dir")) for a in argv) or "PET_LOG_DIR" in os.environ:
            torchrun(argv)
        else:
            with tempfile.TemporaryDirectory(prefix="torchelastic_") as log_dir:
                torchrun(["--log-dir", log_dir, *argv])
    except SignalException as exc:
        print(f"prl.learner.torchrun: stopped by {exc.sigval.name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
