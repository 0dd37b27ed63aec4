import subprocess
import sys

import pytest

from prl.schemas.config import Config, ConfigError, load_config


def test_defaults_validate():
    cfg = load_config()
    assert isinstance(cfg, Config) and cfg.transport.type == "memory"


def test_dotted_overrides_are_typed():
    cfg = load_config(overrides=["learner.lr=3e-5", "run.name=exp1", "task.train_per_digit=[10, 20]"])
    assert cfg.learner.lr == 3e-5 and cfg.run.name == "exp1" and cfg.task.train_per_digit == [10, 20]


def test_bf16_autocast_takes_true_false_or_auto():
    assert [load_config(overrides=[f"learner.bf16_autocast={v}"]).learner.bf16_autocast for v in ("true", "false", "auto")] \
        == [True, False, "auto"]


@pytest.mark.parametrize(
    "override, field",
    [
        ("learner.bf16_autocast='sometimes'", "learner.bf16_autocast"),
        ("learner.lr=-1", "learner.lr"),
        ("sampling.group_size=1", "sampling.group_size"),
        ("transport.type='carrier-pigeon'", "transport.type"),
        ("learner.lrr=1e-5", "learner.lrr"),
        ("scheduler.max_in_flight=2", "scheduler.max_in_flight"),
    ],
)
def test_bad_field_is_named(override, field):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=[override])
    assert field in str(exc.value)


def test_rewards_only_groups_need_the_zero_variance_filter():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["scheduler.strategy='uniform'", "producer.drop_zero_signal_completions=true"])
    assert "producer.drop_zero_signal_completions" in str(exc.value)
    assert load_config(overrides=["producer.drop_zero_signal_completions=true"]).producer.drop_zero_signal_completions


def test_periodic_clocks_refuse_decay_which_would_reset_them_every_version():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["scheduler.priority.mode='periodic'", "scheduler.priority.half_life_versions=20"])
    assert "scheduler.priority: mode = 'periodic' cannot take half_life_versions > 0" in str(exc.value)
    assert load_config(overrides=["scheduler.priority.mode='periodic'"]).scheduler.priority.mode == "periodic"


def test_solvable_groups_without_the_solvable_weight_is_refused_not_ignored():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["scheduler.priority.solvable_groups=5"])
    assert "solvable_groups = 5 acts only with weight = 'solvable'" in str(exc.value)
    cfg = load_config(overrides=["scheduler.priority.weight='solvable'", "scheduler.priority.solvable_groups=5"])
    assert cfg.scheduler.priority.solvable_groups == 5


def test_an_annealed_rate_s_end_without_its_decay_is_refused_not_ignored():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["learner.lr_final_ratio=0.1"])
    assert "learner: lr_final_ratio = 0.1 acts only with lr_decay_steps > 0" in str(exc.value)
    cfg = load_config(overrides=["learner.lr_final_ratio=0.1", "learner.lr_decay_steps=100"])
    assert (cfg.learner.lr_decay_steps, cfg.learner.lr_final_ratio) == (100, 0.1)


def test_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[learner]\nlr = 2e-5\n[transport]\ntype = "kafka"\n[transport.kafka]\nbootstrap_servers = "k:9092"\n')
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


def test_readme_config_reference_is_current():
    """README's configuration table is generated from the model (python -m prl.cli.docs)."""
    from pathlib import Path

    from prl.cli.docs import reference

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert reference() in readme, "README config reference is stale: run python -m prl.cli.docs"
