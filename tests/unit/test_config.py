import subprocess
import sys

import pytest

from prl.schemas.config import Config, ConfigError, load_config


def test_defaults_validate():
    cfg = load_config()
    assert isinstance(cfg, Config) and cfg.scheduler.strategy == "priority" and cfg.task.group_field is None


def test_dotted_overrides_are_typed():
    cfg = load_config(overrides=["learner.lr=3e-5", "run.name=exp1", "run.trackers=['wandb']"])
    assert cfg.learner.lr == 3e-5 and cfg.run.name == "exp1" and cfg.run.trackers == ["wandb"]


def test_bf16_autocast_takes_true_false_or_auto():
    assert [load_config(overrides=[f"learner.bf16_autocast={v}"]).learner.bf16_autocast for v in ("true", "false", "auto")] \
        == [True, False, "auto"]


@pytest.mark.parametrize(
    "override, field",
    [
        ("learner.bf16_autocast='sometimes'", "learner.bf16_autocast"),
        ("learner.lr=-1", "learner.lr"),
        ("sampling.group_size=1", "sampling.group_size"),
        ("run.log_format='xml'", "run.log_format"),
        ("scheduler.strategy='best'", "scheduler.strategy"),
        ("learner.lrr=1e-5", "learner.lrr"),
        ("scheduler.max_in_flight=2", "scheduler.max_in_flight"),
    ],
)
def test_bad_field_is_named(override, field):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=[override])
    assert field in str(exc.value)


def test_the_product_has_at_most_fifty_eight_settings_each_described_in_one_line():
    """What a user sets, and nothing a study tried: at most 58 settings (five say where a
    process computes and how a vLLM engine uses its GPUs; three what counts as solved, the
    environment a problem is an episode of, and how the learner corrects off-policy
    rollouts), each with a one-line description."""
    from prl.schemas.config import settings

    fields = dict(settings())
    assert len(fields) <= 58, sorted(fields)
    for name, field in fields.items():
        text = field.description or ""
        assert text and "\n" not in text and len(text) <= 130, name


def test_a_setting_that_does_not_exist_says_where_the_settings_are_listed():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["scheduler.priority.weight='signal'"])
    assert "scheduler.priority.weight: not a setting (docs/configuration.md lists them)" in str(exc.value)


@pytest.mark.parametrize("given, meant", [("producer.group_size", "sampling.group_size"),
                                          ("learner.learning_rate", None), ("learner.max_step", "learner.max_steps"),
                                          ("schedular", "scheduler"), ("scheduler.replay.tau_max", "scheduler.tau_max")])
def test_a_setting_in_the_wrong_section_or_misspelt_names_the_one_meant(given, meant):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=[f"{given}.x=1" if "." not in given else f"{given}=1"])
    assert f"{given}: not a setting (" + (f"did you mean {meant}? " if meant else "") + "docs/" in str(exc.value)


def test_the_built_in_task_takes_only_its_own_label():
    assert load_config(overrides=["task.group_field='difficulty'"]).task.group_field == "difficulty"
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["task.group_field='level'"])
    assert "set task.train_path for a dataset" in str(exc.value)


def test_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[learner]\nlr = 2e-5\n[transport.kafka]\nbootstrap_servers = "k:9092"\n')
    cfg = load_config(path)
    assert cfg.learner.lr == 2e-5 and cfg.transport.kafka.bootstrap_servers == "k:9092"


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.learner.lr = 1.0


def test_cli_reports_bad_config_before_importing_torch():
    code = (
        "import sys\n"
        "from prl.cli import main\n"
        "code = main(['run', '--set', 'learner.lr=-1'])\n"
        "print('exit', code, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "exit 2 False" in out.stdout
    assert "learner.lr" in out.stderr


def test_the_configuration_reference_is_current():
    """docs/configuration.md is generated from the model (python -m prl.cli.docs)."""
    from prl.cli.docs import REFERENCE, reference

    assert REFERENCE.read_text() == reference(), "docs/configuration.md is stale: run python -m prl.cli.docs"
