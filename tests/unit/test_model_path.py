"""model.path: a directory that is not a model is one clear line, and a remote model is copied
to the cache whole or not at all."""

import fsspec
import pytest

from prl import models
from prl.cli import main
from prl.models import ModelNotFound, resolve_model_dir
from prl.storage import StorageError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path / "cache")
    return tmp_path / "cache"


def test_a_missing_directory_or_one_without_config_json_is_named(tmp_path):
    with pytest.raises(ModelNotFound, match="no such directory"):
        resolve_model_dir(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFound, match="no config.json in it"):
        resolve_model_dir(str(tmp_path))


def test_a_relative_model_path_that_names_nothing_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """The examples name models relative to the repository: run from elsewhere, the one line said
    "no such directory" without where."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFound, match=f"'runs/models/m': no such directory under {tmp_path};"):
        resolve_model_dir("runs/models/m")


def test_a_remote_model_is_copied_to_the_cache_once(cache):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/m1/config.json": b"{}", "/m1/model.safetensors": b"weights"})
    local = resolve_model_dir("memory://m1")
    assert (local / "model.safetensors").read_bytes() == b"weights"
    fs.rm("/m1", recursive=True)  # gone remotely: the cached copy serves
    assert resolve_model_dir("memory://m1") == local
    assert not [p for p in local.parent.iterdir() if ".partial-" in p.name]


def test_a_remote_path_without_a_model_is_named(cache):
    with pytest.raises(ModelNotFound, match="memory://m2.*no config.json there"):
        resolve_model_dir("memory://m2")


def test_an_unreadable_remote_model_is_a_storage_error(cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Access Denied")

    fsspec.filesystem("memory").pipe({"/m3/config.json": b"{}"})
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "get", refuse)
    with pytest.raises(StorageError, match="cannot read model.path memory://m3: Access Denied"):
        resolve_model_dir("memory://m3")


def test_prl_run_with_a_wrong_model_path_is_one_line(tmp_path, capsys):
    assert main(["run", "--run-dir", str(tmp_path / "run"), "--no-progress", "--set", f"model.path='{tmp_path}/nope'"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"prl run: model.path '{tmp_path}/nope': no such directory"), err


def test_a_models_context_counts_its_rope_scaling_as_vllm_does():
    """The learner refuses a rollout past the context, so a YaRN-scaled model's is the scaled one."""
    from types import SimpleNamespace as Config

    from prl.models import context_length

    assert context_length(Config(max_position_embeddings=2048, rope_scaling=None)) == 2048
    assert context_length(Config(max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 4.0})) == 131072
    assert context_length(Config(max_position_embeddings=8192, rope_parameters={"rope_type": "default"})) == 8192
    assert context_length(Config()) == 1 << 30


def test_a_models_context_is_read_from_its_config_alone_or_is_unknown(tmp_path, monkeypatch):
    """What the scheduler checks groups against: the builtin's 64 positions; None where there is
    no config.json, no filesystem for the scheme, or no JSON; an unreachable store raises (its
    step is tried again) rather than leave groups unchecked for the whole run."""
    from prl.models import model_context

    assert model_context("builtin:tiny-adder") == 64
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    assert [model_context(p) for p in (str(tmp_path / "none"), "nosuchscheme://m", str(tmp_path / "bad"))] == [None] * 3

    def refused(*args, **kwargs):
        raise ConnectionRefusedError("connection refused")

    monkeypatch.setattr(models.fsspec, "open", refused)
    with pytest.raises(ConnectionRefusedError):
        model_context("s3://bucket/model")
