"""Kubernetes manifests, built and validated offline: every overlay builds with
`kubectl kustomize`, every built-in resource passes kubernetes-validate --strict, and the
manifests agree with the code (topics, config keys, probe ports, images)."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from prl.trust import KEY_ENV_PREFIX
from prl.schemas.config import load_config
from prl.schemas.topics import PROBLEMS, TOPICS, topic_name

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def build(overlay: str, tmp_path: Path) -> tuple[Path, list[dict]]:
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(out.stdout)
    return path, [d for d in yaml.safe_load_all(out.stdout) if d]


def config_of(docs) -> str:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("prl-config")]
    return cm["data"]["config.toml"]


def workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def test_overlays_exist():
    assert {"dev", "gpu"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_resources_pass_strict_validation(overlay, tmp_path):
    path, docs = build(overlay, tmp_path)
    exe = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run([str(exe), "--strict", "--quiet", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ERROR" not in out.stdout and "failed" not in out.stdout.lower(), out.stdout
    builtin = [d for d in docs if "." not in d["apiVersion"].split("/")[0] or d["apiVersion"].startswith(("apps/", "policy/"))]
    assert len(builtin) >= 7


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_keys_exist_in_the_model(overlay, tmp_path):
    """The generated config.toml and every --set in a container's args validate, and the
    args parse as the command's own (a producer's --id)."""
    _, docs = build(overlay, tmp_path)
    config_file = tmp_path / "config.toml"
    config_file.write_text(config_of(docs))
    for w in workloads(docs):
        args = w["spec"]["template"]["spec"]["containers"][0]["args"]
        sets = [a.replace("$(POD_NAME)", "pod-0") for prev, a in zip(args, args[1:]) if prev == "--set"]
        load_config(config_file, sets)  # raises ConfigError naming any unknown or bad key
        assert args[0] in ("scheduler", "producer", "learner") and "/etc/prl/config.toml" in args
        from prl.cli.parser import build_parser

        build_parser().parse_args([a.replace("$(POD_NAME)", "pod-0") for a in args])  # exits on an unknown flag


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_topic_has_a_matching_kafka_topic(overlay, tmp_path):
    _, docs = build(overlay, tmp_path)
    cfg = tomllib.loads(config_of(docs))
    model = load_config(overrides=[])
    run = cfg["run"]["name"]
    max_bytes = cfg["transport"]["kafka"].get("max_message_bytes", model.transport.kafka.max_message_bytes)
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    if not topics:  # an existing Kafka: the services create the missing topics themselves
        return
    assert set(topics) == {topic_name(run, kind) for kind in TOPICS}
    for kind, spec in TOPICS.items():
        t = topics[topic_name(run, kind)]
        if kind == PROBLEMS:  # more partitions only let more producers share the dispatches
            assert t["partitions"] >= spec.partitions
        else:
            assert t["partitions"] == spec.partitions, kind
        assert int(t["config"]["retention.ms"]) == spec.retention_ms, kind
        assert t["config"]["cleanup.policy"] == ("compact" if spec.compacted else "delete"), kind
        assert int(t["config"]["max.message.bytes"]) == max_bytes, kind
    kafka = [d for d in docs if d["kind"] == "Kafka"][0]
    assert int(kafka["spec"]["kafka"]["config"]["message.max.bytes"]) >= max_bytes


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_the_port_services_listen_on(overlay, tmp_path):
    _, docs = build(overlay, tmp_path)
    for w in workloads(docs):
        c = w["spec"]["template"]["spec"]["containers"][0]
        http = c["args"][c["args"].index("--http") + 1]  # /health and /metrics on the pod's address
        assert http.startswith("0.0.0.0:")
        port = int(http.rpartition(":")[2])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c[probe]["httpGet"]
            assert get["path"] == "/health"
            assert ports.get(get["port"], get["port"]) == port, (w["metadata"]["name"], probe)
        startup = c["startupProbe"]  # liveness waits for it: the service is built before /health listens
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300 and "initialDelaySeconds" not in c["livenessProbe"]
        assert w["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_producers_answer_before_their_dispatches_time_out(overlay, tmp_path):
    """A vLLM producer's engine call takes minutes (64 dispatches x 8 x up to 4,096 tokens), and
    a stopped one finishes it within its grace period: at least that long before the scheduler
    dispatches the problems again, or most are generated twice."""
    _, docs = build(overlay, tmp_path)
    config_file = tmp_path / "config.toml"
    config_file.write_text(config_of(docs))
    cfg = load_config(config_file)
    if cfg.producer.backend != "vllm":
        pytest.skip(f"{overlay}: producers not on vLLM")
    producer = next(w for w in workloads(docs) if w["metadata"]["name"] == "prl-producer")
    assert cfg.scheduler.dispatch_timeout_s >= producer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_wait_when_their_run_is_finished(overlay, tmp_path):
    """Deployments and StatefulSets restart a container that exits, even with 0: in back-off,
    each restart loading its model again, the finished run shown as CrashLoopBackOff."""
    _, docs = build(overlay, tmp_path)
    for w in workloads(docs):
        args = w["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--when-finished") + 1] == "wait", w["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workloads_are_locked_down_and_sized(overlay, tmp_path):
    _, docs = build(overlay, tmp_path)
    kinds = {w["metadata"]["name"]: w for w in workloads(docs)}
    assert kinds["prl-scheduler"]["spec"]["strategy"]["type"] == "Recreate"
    assert kinds["prl-scheduler"]["spec"]["replicas"] == 1
    assert kinds["prl-learner"]["kind"] == "StatefulSet"
    for name in ("prl-learner", "prl-producer"):  # to checkpoint, to finish an engine call (not 30 s)
        assert kinds[name]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 300
    assert any(d["kind"] == "PodDisruptionBudget" for d in docs)
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for w in kinds.values():
        pod = w["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["resources"]["requests"] and c["resources"]["limits"]
        image, tag = c["image"].rsplit(":", 1)
        assert re.search(rf"--target \w+\s+-t {re.escape(image)}:{re.escape(tag)}", dockerfile), c["image"]
        env = {e["name"] for e in c["env"]}
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env
        assert all("valueFrom" in e for e in c["env"] if "SECRET" in e["name"] or "PASSWORD" in e["name"])


def test_gpu_overlay_requests_gpus_on_gpu_nodes(tmp_path):
    _, docs = build("gpu", tmp_path)
    kinds = {w["metadata"]["name"]: w for w in workloads(docs)}
    assert kinds["prl-producer"]["spec"]["replicas"] >= 2
    for name in ("prl-producer", "prl-learner"):
        pod = kinds[name]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] and pod["tolerations"]
    assert "nvidia.com/gpu" not in str(kinds["prl-scheduler"])


def test_dev_overlay_is_cpu_with_one_producer(tmp_path):
    _, docs = build("dev", tmp_path)
    kinds = {w["metadata"]["name"]: w for w in workloads(docs)}
    assert kinds["prl-producer"]["spec"]["replicas"] == 1
    assert "nvidia.com/gpu" not in str(docs)
    assert any(d["kind"] == "Kafka" for d in docs)


def service_kinds() -> dict[str, set[str]]:
    """Topic kinds each service reads or writes, from the services themselves."""
    from prl.learner.service import Learner
    from prl.producers.service import Producer
    from prl.scheduler.service import Scheduler

    return {c.name: set(c.reads) | set(c.writes) for c in (Scheduler, Producer, Learner)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_topics_are_signed_and_each_service_gets_only_its_keys(overlay, tmp_path):
    """Policy and batch messages are signed; a service gets the key of a kind only if it
    reads or writes it (the producers cannot sign batches); metrics bind the pod address."""
    _, docs = build(overlay, tmp_path)
    cfg = load_config(overrides=[]).model_validate(tomllib.loads(config_of(docs)))
    assert {"policy", "batches"} <= set(cfg.transport.signed_kinds)
    kinds = service_kinds()
    for w in workloads(docs):
        c = w["spec"]["template"]["spec"]["containers"][0]
        keys = {e["name"] for e in c["env"] if e["name"].startswith(KEY_ENV_PREFIX)}
        assert keys == {f"{KEY_ENV_PREFIX}{k.upper()}" for k in kinds[c["args"][0]] & set(cfg.transport.signed_kinds)}
        assert all(e["valueFrom"]["secretKeyRef"]["name"] == "prl-signing-keys" for e in c["env"] if e["name"] in keys)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_a_network_policy_admitting_only_metrics(overlay, tmp_path):
    _, docs = build(overlay, tmp_path)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for w in workloads(docs):
        labels = w["spec"]["template"]["metadata"]["labels"]
        (np_,) = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert set(np_["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        assert [p["port"] for rule in np_["spec"]["ingress"] for p in rule["ports"]] == [8080]


def test_secure_overlay_kafka_is_tls_scram_with_acls_per_service(tmp_path):
    """No plaintext listener; each service logs in as its own KafkaUser whose ACLs name exactly
    the topics it reads or writes (and the dead-letter topic) and its consumer group."""
    _, docs = build("secure", tmp_path)
    kafka = next(d for d in docs if d["kind"] == "Kafka")["spec"]["kafka"]
    assert all(lst["tls"] and lst["authentication"]["type"] == "scram-sha-512" for lst in kafka["listeners"])
    assert kafka["authorization"]["type"] == "simple"
    cfg = tomllib.loads(config_of(docs))["transport"]["kafka"]
    assert cfg["security_protocol"] == "SASL_SSL" and cfg["ssl_cafile"].startswith("/etc/kafka-ca/")
    users = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "KafkaUser"}
    groups = {"scheduler": "prl.scheduler", "producer": "prl.producers", "learner": "prl.learner"}
    for name, kinds in service_kinds().items():
        acls = users[f"prl-{name}"]["authorization"]["acls"]
        topics = {a["resource"]["name"] for a in acls if a["resource"]["type"] == "topic"}
        assert topics == {topic_name("prl", k) for k in kinds | {"deadletter"}}, name
        assert {a["resource"]["name"] for a in acls if a["resource"]["type"] == "group"} == {groups[name]}
    for w in workloads(docs):
        c = w["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert env["PRL_KAFKA_USERNAME"]["value"] == w["metadata"]["name"]
        assert env["PRL_KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == w["metadata"]["name"]


def test_autoscale_overlay_scales_producers_on_the_problems_lag(tmp_path):
    """KEDA ScaledObject (fields as its CRD requires: scaleTargetRef.name, triggers with string
    metadata) targets the producer Deployment, watches the producers' consumer group on the
    problems topic of this run, and never asks for more producers than partitions."""
    _, docs = build("autoscale", tmp_path)
    (so,) = [d for d in docs if d["kind"] == "ScaledObject"]
    cfg = tomllib.loads(config_of(docs))
    deployment = next(w for w in workloads(docs) if w["metadata"]["name"] == so["spec"]["scaleTargetRef"]["name"])
    assert deployment["kind"] == "Deployment" and deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "producer"
    (trigger,) = so["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka" and all(isinstance(v, str) for v in meta.values())
    assert meta["consumerGroup"] == f"{cfg['run']['name']}.producers" and meta["topic"] == topic_name(cfg["run"]["name"], PROBLEMS)
    assert meta["bootstrapServers"] == cfg["transport"]["kafka"]["bootstrap_servers"]
    partitions = next(d["spec"]["partitions"] for d in docs if d["kind"] == "KafkaTopic" and d["spec"]["topicName"] == meta["topic"])
    assert so["spec"]["minReplicaCount"] >= 1 and so["spec"]["maxReplicaCount"] <= partitions
    assert cfg["scheduler"]["max_in_flight"] >= so["spec"]["maxReplicaCount"] * int(meta["lagThreshold"])
