"""Versioned object storage (prl/storage.py) on a local directory and on a real S3 server:
data first, manifest, then `latest`; a half-written version is never loaded; keep the last N;
checksums are checked on every read."""

import json
from types import SimpleNamespace

import fsspec
import pytest
import torch

from prl.learner import checkpoint
from prl.learner.train import make_optimizer
from prl import storage
from prl.models import export_state, load_model, load_state, resolve_model_dir
from tests.support.servers import S3Server


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    server = S3Server(log_path=tmp_path_factory.mktemp("moto") / "s3.log")
    server.create_bucket("prl-storage")
    yield server
    server.stop()


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def root(request, tmp_path, monkeypatch):
    if request.param == "file":
        return f"file://{tmp_path}/versions"
    server = request.getfixturevalue("s3_server")
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()
    return f"s3://prl-storage/{tmp_path.name}/versions"


def test_latest_is_written_last_and_keeps_n(root):
    for i in range(4):
        storage.write_versioned(root, f"v-{i:04d}", {"data.bin": bytes([i]) * 100}, keep=2, meta={"i": i})
    assert storage.list_versions(root, "v-") == ["v-0002", "v-0003"]
    assert storage.read_latest(root) == {"i": 3, "name": "v-0003"}
    assert storage.read_verified(storage.latest_uri(root), "data.bin") == bytes([3]) * 100


def test_background_pruning_keeps_n_and_never_touches_a_newer_version(root):
    storage.write_file(root, "v-0009", "data.bin", b"a newer version still being written")
    for i in range(3):
        storage.write_versioned(root, f"v-{i:04d}", {"data.bin": bytes([i])}, keep=1, prune_in_background=True)
    storage.wait_for_pruning()
    assert storage.list_versions(root, "v-") == ["v-0002", "v-0009"]
    assert storage.read_latest(root)["name"] == "v-0002"


def test_a_crash_mid_write_leaves_the_previous_version_loadable(root):
    storage.write_versioned(root, "v-0001", {"data.bin": b"complete"}, keep=3)
    storage.write_file(root, "v-0002", "data.bin", b"half of a new version, no manifest, no latest")
    assert storage.latest_uri(root).endswith("v-0001")
    assert storage.read_verified(storage.latest_uri(root), "data.bin") == b"complete"


def test_a_corrupted_file_is_refused(root):
    uri = storage.write_versioned(root, "v-0001", {"data.bin": b"original"}, keep=3)
    fs, path = fsspec.core.url_to_fs(uri)
    fs.pipe_file(f"{path}/data.bin", b"tampered")
    with pytest.raises(storage.StorageError, match="checksum"):
        storage.read_verified(uri, "data.bin")
    assert json.loads(fs.cat_file(f"{path}/manifest.json"))["data.bin"]


def test_learner_checkpoint_round_trip(root):
    model = load_model("builtin:tiny-adder")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    run_dir = root.rsplit("/", 1)[0]
    uri = checkpoint.write_checkpoint(run_dir, 1, export_state(model), optimizer, {"last_batch_seq": 7},
                                      resolve_model_dir("builtin:tiny-adder"), 2)
    assert checkpoint.latest_uri(run_dir) == uri and checkpoint.read_state(uri)["last_batch_seq"] == 7
    fresh = load_model("builtin:tiny-adder")
    load_state(fresh, checkpoint.read_checkpoint(uri).weights)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    # The learner's AdamW is fused; a checkpoint of torch's default loop restores into it, and stays fused.
    restored = make_optimizer(fresh, SimpleNamespace(lr=1e-3))
    checkpoint.load_optimizer(checkpoint.read_checkpoint(uri), restored)
    assert restored.param_groups[0]["fused"] and restored.param_groups[0]["lr"] == 1e-3
    saved, got = optimizer.state_dict()["state"], restored.state_dict()["state"]
    assert saved.keys() == got.keys() and all(torch.equal(saved[i][k], got[i][k]) for i in saved for k in saved[i])


@pytest.mark.parametrize("damage", ["torn weights", "garbage latest", "latest outside the root", "no latest"])
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(root, damage, capsys):
    """A torn or tampered newest checkpoint, or a `latest` that is garbage or points out of
    the checkpoint root, costs one log line naming it; the learner resumes from the newest
    checkpoint that verifies."""
    from prl import logs

    logs.configure("console", "info")
    model = load_model("builtin:tiny-adder")
    run_dir = root.rsplit("/", 1)[0]
    base = resolve_model_dir("builtin:tiny-adder")
    for step in (1, 2):
        newest = checkpoint.write_checkpoint(run_dir, step, export_state(model), None, {"last_batch_seq": step}, base, 3)
    fs, path = fsspec.core.url_to_fs(newest)
    latest = path.rsplit("/", 1)[0] + "/latest"
    if damage == "torn weights":
        fs.pipe_file(f"{path}/model.safetensors", fs.cat_file(f"{path}/model.safetensors")[:-10])
    elif damage == "garbage latest":
        fs.pipe_file(latest, b"{not json")
    elif damage == "latest outside the root":
        fs.pipe_file(latest, json.dumps({"name": "../../elsewhere/step-00000009"}).encode())
    else:
        fs.rm(latest)
    ckpt = checkpoint.newest_checkpoint(run_dir)
    expected = 1 if damage == "torn weights" else 2
    assert ckpt.state["step"] == expected and ckpt.uri.endswith(f"step-{expected:08d}")
    if damage != "no latest":
        lines = [ln for ln in capsys.readouterr().err.splitlines() if "unusable" in ln or "unreadable" in ln]
        assert len(lines) == 1 and ("step-00000002" in lines[0] or "latest" in lines[0])


def test_latest_is_replaced_whole_on_a_local_disk(tmp_path):
    """`latest` is written to a temporary file and renamed over the old one."""
    root = str(tmp_path / "versions")
    storage.write_versioned(root, "v-00000001", {"a": b"1"}, keep=3)
    storage.write_versioned(root, "v-00000002", {"a": b"2"}, keep=3)
    assert storage.read_latest(root)["name"] == "v-00000002"
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == ["latest", "v-00000001", "v-00000002"]


def test_a_run_in_object_storage_exports_to_object_storage(root, tmp_path):
    """`prl model export` takes a run directory and writes the model at any fsspec URI: here a
    run whose directory is ``root`` (a path, or a bucket on a real S3 server), into its sibling."""
    from prl.cli import main
    from prl.models import load_model

    run_dir, out = f"{root}/run", f"{root}/exported"
    assert main(["run", "--run-dir", run_dir, "--max-steps", "2", "--no-progress", "--set", "learner.eval_every=0"]) == 0
    assert main(["model", "export", run_dir, out, "--dtype", "float32"]) == 0
    fs, path = fsspec.core.url_to_fs(out)
    fs.get(path + "/", str(tmp_path / "local") + "/", recursive=True)
    ckpt = storage.read_safetensors(f"{run_dir}/checkpoints/step-00000002", "model.safetensors")
    model = load_model(str(tmp_path / "local"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt.items())
