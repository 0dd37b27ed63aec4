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



@pytest.mark.parametrize("how", ["config", "flag"])
def test_with_json_logs_the_line_a_command_stops_on_is_json_too(tmp_path, capsys, how):
    """A pod logging JSON ended, on a mistake, with one plain line its log pipeline could not
    parse; the format comes from the config (a pod's) or from --log-format."""
    import json

    if how == "config":
        argv, where, error = ["inspect", "tail", "nosuch", "--set", 'run.log_format="json"'], "prl inspect tail", "unknown topic kind"
    else:
        argv = ["run", "--log-format", "json", "--run-dir", str(tmp_path), "--set", 'producer.reward="nomodule:score"']
        where, error = "prl run", "cannot import nomodule"
    code = main(argv)
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert code == 2 and line["event"] == "command_failed" and line["level"] == "error"
    assert line["logger"] == where and error in line["error"]


def test_bare_prl_bench_lists_the_benchmarks_with_what_each_measures(capsys):
    """It said "the following arguments are required: name, args" (args are not)."""
    from prl.cli.parser import BENCHMARKS

    assert main(["bench"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == list(BENCHMARKS)
    assert "is the pipeline ever the bottleneck?" in lines[1 + BENCHMARKS.index("system")]
