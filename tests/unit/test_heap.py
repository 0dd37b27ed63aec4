"""A run of episodes (`prl run`, `prl producer|learner` with task.environment) limits glibc's heap
fragmentation (prl/devices.py), unless the user set MALLOC_ARENA_MAX."""

import os
import platform
import subprocess
import sys

import pytest

CALL = "from prl.devices import limit_heap_fragmentation as f; print(f())"


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_the_heap_limits_apply_unless_the_user_set_them():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    ours = subprocess.run([sys.executable, "-c", CALL], env=env, capture_output=True, text=True, check=True)
    theirs = subprocess.run([sys.executable, "-c", CALL], env={**env, "MALLOC_ARENA_MAX": "4"},
                            capture_output=True, text=True, check=True)
    assert ours.stdout.strip() == "True" and theirs.stdout.strip() == "False"
