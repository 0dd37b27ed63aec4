"""`prl learner --batches-from FILE` that, once through the file, waits for more as on a topic
that has none: it ends by SIGTERM, not by the file's end (tests/integration/test_distributed.py
stops 2 torchrun ranks between checkpoints). Its second poll fails as a broker away would:
rank 0's step fails before its broadcast while the other ranks wait in theirs."""

import sys
import time

from prl.cli import main
from prl.learner.sources import FileSource
from prl.transport import TransportError

polls = 0


def next_or_wait(source: FileSource, timeout_s: float, read=FileSource.next):
    global polls
    polls += 1
    if polls == 2:
        raise TransportError("injected: the broker is away for one poll")
    message, exhausted = read(source, timeout_s)
    if not exhausted:
        return message, exhausted
    time.sleep(timeout_s)  # a topic's poll waits this long for a message that does not come
    return None, False


if __name__ == "__main__":
    FileSource.next = next_or_wait
    sys.exit(main(sys.argv[1:]))
