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
