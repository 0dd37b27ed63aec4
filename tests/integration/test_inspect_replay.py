"""`prl inspect` against a real broker, and the rollout archive with `prl replay` on a real S3
server."""

import io
import json
import threading

import fsspec
import pytest

from prl.learner.service import Learner
from prl.cli import inspect, replay
from prl.errors import UsageError
from prl.transport.kafka import KafkaTransport
from prl.scheduler.archive import ArchivedGroups, RolloutArchive, read_archive
from prl.schemas import encode
from prl.schemas.config import BUILTIN_STRATEGIES, load_config
from prl.schemas.topics import ROLLOUTS, topic_name
from tests.support.servers import S3Server, wait_until
from tests.support.groups import make_groups

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def kafka_config(broker, run_name, **extra):
    overrides = [f'run.name="{run_name}"', f'transport.kafka.bootstrap_servers="{broker.bootstrap}"',
                 "transport.kafka.session_timeout_ms=3000", *[f"{k}={v}" for k, v in extra.items()]]
    return load_config(overrides=overrides)


def publish(transport, topic, values, keys=None):
    pub = transport.publisher()
    for i, v in enumerate(values):  # no flush per message: the producer packs several records per batch
        pub.publish(topic, v, key=(keys[i] if keys else f"k{i}").encode())
    pub.flush()
    pub.close()


def test_inspect_topics_counts_and_lag_with_multi_record_batches(kafka_broker, run_name):
    cfg = kafka_config(kafka_broker, run_name)
    transport = KafkaTransport(cfg.transport.kafka)
    transport.ensure_topics(run_name)
    groups = make_groups(300)
    publish(transport, topic_name(run_name, ROLLOUTS), [encode(g) for g in groups])
    sub = transport.subscriber([topic_name(run_name, ROLLOUTS)], group=f"{run_name}.scheduler")
    consumed = []
    wait_until(lambda: consumed.extend(sub.poll(0.5, max_records=40)) or len(consumed) >= 100, 60, "100 messages")
    sub.commit()
    sub.close()

    rows = {r.topic: r for r in inspect.topic_report(cfg)}
    rollouts = rows[topic_name(run_name, ROLLOUTS)]
    assert rollouts.messages == 300 and sum(rollouts.end_offsets) == 300
    assert rollouts.groups == {f"{run_name}.scheduler": 300 - len(consumed)}
    assert rows[topic_name(run_name, "batches")].messages == 0
    text = inspect.format_topics(list(rows.values()))
    assert inspect.HIGHWATER in text and f"{run_name}.scheduler ({300 - len(consumed)})" in text
    with pytest.raises(UsageError, match=f"no topic of run 'nosuchrun' on .* \\(runs there: .*{run_name}"):
        inspect.topic_report(kafka_config(kafka_broker, "nosuchrun"))  # a mistyped run.name: an empty table before


def test_inspect_tail_filters_and_survives_garbage(kafka_broker, run_name):
    cfg = kafka_config(kafka_broker, run_name)
    transport = KafkaTransport(cfg.transport.kafka)
    transport.ensure_topics(run_name)
    groups = make_groups(60)
    values = [encode(g) for g in groups] + [b"not arrow at all", encode(groups[0])[:50]]
    publish(transport, topic_name(run_name, ROLLOUTS), values, keys=["same"] * len(values))

    def tail(**flt):
        out = io.StringIO()
        inspect.tail(cfg, "rollouts", flt=inspect.TailFilter(**flt), from_beginning=True, follow=False, as_json=True,
                     summary=False, limit=None, out=out)
        return [json.loads(line) for line in out.getvalue().splitlines()]

    everything = tail()
    assert len(everything) == 62
    assert [r["undecodable"].split(":")[0] for r in everything if "undecodable" in r] == ["not_arrow", "not_arrow"]
    want = {g.dispatch_id for g in groups if g.problem_id == "add2:1+1"}
    assert {r["dispatch_id"] for r in tail(problem="add2:1+1") if "undecodable" not in r} == want
    got = [r for r in tail(min_version=2, max_version=3, producer="producer-1") if "undecodable" not in r]
    assert {r["dispatch_id"] for r in got} == {g.dispatch_id for g in groups if 2 <= g.policy_version <= 3 and g.producer_id == "producer-1"}
    high = [r for r in tail(min_reward=0.75) if "undecodable" not in r]
    assert high and all(r["mean_reward"] >= 0.75 for r in high)
    assert len(high) == sum(sum(g.rewards) / 4 >= 0.75 for g in groups)

    out = io.StringIO()
    inspect.tail(cfg, "rollouts", flt=inspect.TailFilter(), from_beginning=True, follow=False, as_json=False,
                 summary=True, limit=None, out=out)
    assert "producer-0" in out.getvalue() and "undecodable: 2" in out.getvalue()


@pytest.fixture
def s3_env(monkeypatch, tmp_path):
    server = S3Server(log_path=tmp_path / "s3.log")
    server.create_bucket("prl-archive")
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": server.endpoint}.items():
        monkeypatch.setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()
    yield server
    server.stop()


def test_archive_on_s3_report_whatif_publish(s3_env, kafka_broker, run_name, tmp_path):
    groups = make_groups(96)
    uri = f"s3://prl-archive/{run_name}/archive"
    archive = RolloutArchive(uri, max_rows=7)
    for g in groups:
        archive.add(g, learner_version=g.policy_version + 1)
    archive.close()
    assert_readable_with_pyarrow_alone(s3_env, f"prl-archive/{run_name}/archive", groups, max_rows=7)
    assert read_archive(uri).num_rows == 96
    assert_report_and_whatif(uri, run_name)
    assert_published_archive_trains_a_learner(uri, groups, kafka_broker, run_name, tmp_path)


def assert_readable_with_pyarrow_alone(s3_env, path: str, groups, max_rows: int) -> None:
    """pyarrow's own S3 client and Hive partitions read the archive: no project code."""
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    s3 = pafs.S3FileSystem(endpoint_override=s3_env.endpoint, scheme="http", access_key="test", secret_key="test",
                           region="us-east-1")
    dataset = ds.dataset(path, filesystem=s3, format="parquet", partitioning="hive")
    table = dataset.to_table()
    assert table.num_rows == len(groups) and sorted(table["dispatch_id"].to_pylist()) == [g.dispatch_id for g in groups]
    assert {"problem_id", "producer_id", "rollouts", "accepted_at", "learner_version", "policy_version"} <= set(table.schema.names)
    assert all(f.count_rows() <= max_rows for f in dataset.get_fragments())


def assert_report_and_whatif(uri: str, run_name: str) -> None:
    out = f"s3://prl-archive/{run_name}/replay"
    rep = replay.report(uri, out)
    assert sum(r["groups"] for r in rep["versions"]) == 96 and rep["age_mean"] == 1.0
    assert "mean reward" in replay.format_report(rep)
    res = replay.whatif(load_config(), uri, out, progress=False)
    assert set(res["strategies"]) == set(BUILTIN_STRATEGIES)
    assert all(r["rollouts_generated"] == res["rounds"] * res["per_round"] * 4 for r in res["strategies"].values())
    assert "priority" in replay.format_whatif(res)
    fs = fsspec.filesystem("s3")
    for png in ("reward_by_version", "success_trajectories", "age_histogram", "priority_histogram", "whatif"):
        with fs.open(f"prl-archive/{run_name}/replay/{png}.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def assert_published_archive_trains_a_learner(uri: str, groups, kafka_broker, run_name, tmp_path) -> None:
    """publish, then a learner consumes exactly the archived rollouts."""
    cfg = kafka_config(kafka_broker, run_name, **{"run.run_dir": json.dumps(str(tmp_path / "run")), "learner.eval_every": 0,
                                                  "scheduler.groups_per_batch": 8, "run.threads": 1})
    transport = KafkaTransport(cfg.transport.kafka)
    n_batches = replay.publish(cfg, transport, ArchivedGroups(uri), rate=0, progress=False)
    assert n_batches == 12
    cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"max_steps": n_batches})})
    learner = Learner(cfg, transport)
    stop = threading.Event()
    thread = threading.Thread(target=learner.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: not thread.is_alive(), 180, "the learner to train every published batch", 0.2)
    finally:
        stop.set()
        thread.join(30)
    assert learner.version == 12
    assert set(learner.trained) == {f"{g.dispatch_id}/{i}" for g in groups for i in range(4)}
    assert learner.counters.get("stale_dropped", 0) == 0 and learner.counters.get("repeat_dropped", 0) == 0


def test_prl_run_on_s3_draws_its_curve_from_every_part_and_continues(s3_env, tmp_path, capsys):
    """`prl run --run-dir s3://...`: an object store cannot append, so each process writes its
    own metrics part; the run's learning curve and `prl inspect report` read every part (the
    run crashed drawing its curve: it opened the part's path without s3://)."""
    from prl.cli import main
    from prl.metrics import read_run_metrics

    run = f"s3://prl-archive/{tmp_path.name}/run"
    for steps in (2, 4):  # the second command continues the first run
        assert main(["run", "--run-dir", run, "--max-steps", str(steps), "--no-progress",
                     "--set", "learner.eval_every=1"]) == 0
    assert "learning_curve.png" in capsys.readouterr().err
    fs = fsspec.filesystem("s3")
    assert len(fs.glob(f"prl-archive/{tmp_path.name}/run/metrics.*.jsonl")) == 2
    assert fs.exists(f"prl-archive/{tmp_path.name}/run/learning_curve.png")
    steps = [r["step"] for r in read_run_metrics(run) if "eval/accuracy" in r]
    assert steps == [0, 1, 2, 3, 4]
    assert json.loads(fs.cat_file(f"prl-archive/{tmp_path.name}/run/summary.json"))["steps"] == 4
