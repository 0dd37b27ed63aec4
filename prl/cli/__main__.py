"""``python -m prl.cli ...`` (torchrun and subprocesses start the services this way)."""

from prl.cli import main

raise SystemExit(main())
