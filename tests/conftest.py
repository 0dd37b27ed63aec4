import os
import uuid

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: torch's default of a thread per core in each worker (and in the
    # services it starts) made the real-model tests 3-4 times slower than alone.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.support.servers import KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One tansu broker for the whole session; tests use random topic and group names."""
    broker = KafkaBroker(log_path=tmp_path_factory.mktemp("tansu") / "broker.log")
    yield broker
    broker.stop()


@pytest.fixture
def run_name():
    return f"t{uuid.uuid4().hex[:10]}"


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu are collected everywhere and skipped, with the reason, where torch sees
    no CUDA GPU."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = pytest.mark.skip(reason=f"needs a CUDA GPU: torch {torch.__version__} sees none (tools/gpu_check.sh runs these)")
    for item in gpu_tests:
        item.add_marker(reason)


@pytest.fixture(autouse=True)
def named_producers(monkeypatch):
    """A producer a test builds without a name is "test-producer", not host-pid: its sampling
    seed (run.seed and the name) and so every sampled rollout are the same on every run."""
    monkeypatch.setattr("prl.producers.service.default_producer_id", lambda: "test-producer")
