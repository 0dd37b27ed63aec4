import uuid

import pytest

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
