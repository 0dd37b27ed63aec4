"""`prl learner` with its checkpoints written in the background on a CPU, as on a GPU: for
torchrun in tests/integration/test_distributed.py (gloo ranks agree on a checkpoint's files)."""

import sys

from prl.cli import main
from prl.learner import service

if __name__ == "__main__":
    service.BACKGROUND_DEVICES = ("cpu", "cuda")
    sys.exit(main(sys.argv[1:]))
