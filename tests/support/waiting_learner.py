"""`prl learner --batches-from FILE` that, once through the file, waits for more as on a topic
that has none: it ends by SIGTERM, not by the file's end (tests/integration/test_distributed.py
stops 2 torchrun ranks between checkpoints)."""

import sys
import time

from prl.cli import main
from prl.learner.sources import FileSource


def next_or_wait(source: FileSource, timeout_s: float, read=FileSource.next):
    message, exhausted = read(source, timeout_s)
    if exhausted:
        time.sleep(timeout_s)  # a topic's poll waits this long for a message that does not come
        return None, False
    return message, exhausted


if __name__ == "__main__":
    FileSource.next = next_or_wait
    sys.exit(main(sys.argv[1:]))
