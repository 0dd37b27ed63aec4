"""A `prl` command given an argument it does not know names the command and its help."""

import pytest

from prl.cli import main


@pytest.mark.parametrize("argv, prog", [
    (["run", "--bogus"], "prl run"),
    (["inspect", "tail", "rollouts", "--bogus"], "prl inspect tail"),
    (["replay", "report", "--bogus"], "prl replay report"),
    (["model", "import", "a.gguf", "out", "--bogus"], "prl model import"),
    (["data", "reasoning-gym", "chain_sum", "--train", "8", "--test", "2", "--out", "d", "--bogus", "1"],
     "prl data reasoning-gym"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_an_unknown_argument_names_the_command_it_was_given_to(capsys, argv, prog):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    extra = " ".join(argv[argv.index("--bogus"):])
    assert err == f"{prog}: unrecognized arguments: {extra} (see {prog} --help)\n"


def test_output_piped_to_a_reader_that_left_ends_quietly():
    """`prl ... | head`: when the reader has gone, the command stops without a traceback and
    with the shell's code for it (128 + SIGPIPE), like any Unix tool."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader has left before the command writes
    try:
        done = subprocess.run([sys.executable, "-m", "prl.cli", "config"], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode == 141
