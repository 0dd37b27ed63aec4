"""Chat prompts: rendered with the model's own chat template in every part of the system.

A small chat model is made in the test (ChatML template, character tokenizer, random
weights): nothing is downloaded. The real SmolLM2-135M-Instruct path is in
tests/integration/test_real_model.py."""

import json

import pytest

from prl.generation import NoChatTemplate, Request, TransformersBackend, encode_prompt
from prl.schemas import Sampling
from tests.support.chat_model import make_chat_model

MESSAGES = [{"role": "system", "content": "Answer with only the final answer."},
            {"role": "user", "content": "What is 12+30?"}]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return make_chat_model(tmp_path_factory.mktemp("chat") / "model")


def test_chat_prompt_is_rendered_by_the_tokenizers_template(chat_dir):
    """The ids are the template's, generation prompt included, with no special token added
    twice; a plain prompt is tokenized as text. (With transformers 5 apply_chat_template
    returns a BatchEncoding: the producer crashed concatenating it to a list.)"""
    backend = TransformersBackend.from_path(str(chat_dir))
    ids = backend.encode(json.dumps(MESSAGES), chat=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    expected = backend.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ids == list(expected)
    text = backend.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3
    assert backend.encode("12+30=") == list(backend.tokenizer("12+30=")["input_ids"])


def test_chat_prompt_without_a_template_is_a_clear_error():
    from prl.models import load_tokenizer

    with pytest.raises(NoChatTemplate, match="no chat template"):
        encode_prompt(load_tokenizer("builtin:tiny-adder"), json.dumps(MESSAGES), chat=True)


def test_producer_serves_chat_dispatches_and_checkpoints_keep_the_template(chat_dir, tmp_path):
    """A producer answers chat dispatches with rollouts whose prompt ids are the template's;
    a learner checkpoint of this model carries the chat template, so the checkpoint alone
    renders the same prompt (what vLLM and transformers load)."""
    from prl.learner.checkpoint import write_checkpoint
    from prl.producers.service import Producer
    from prl.models import export_state, load_model, load_tokenizer
    from prl.transport.memory import MemoryTransport
    from prl.schemas import Dispatch, RolloutGroup, decode, encode, topic_name
    from prl.schemas.config import load_config
    from prl.schemas.topics import PROBLEMS, ROLLOUTS

    cfg = load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}",
                                 f"model.path={json.dumps(str(chat_dir))}"])
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    producer = Producer(cfg, transport)
    transport.publisher().publish(topic_name(cfg.run.name, PROBLEMS), encode(
        Dispatch("d0", "p0", json.dumps(MESSAGES), "42", 4, Sampling(1.0, 1.0, 6, []), 0, chat=True)))
    producer.step()
    [group] = [decode(m.value, RolloutGroup) for m in transport.subscriber([topic_name(cfg.run.name, ROLLOUTS)],
                                                                          group=None).poll(1.0)]
    assert group.error == "" and len(group.rollouts) == 4
    expected = producer.backend.encode(json.dumps(MESSAGES), chat=True)
    assert group.prompt_ids.tolist() == expected
    uri = write_checkpoint(f"file://{tmp_path}/ckpt", 1, export_state(load_model(str(chat_dir))), None, {}, chat_dir, 2)
    from_checkpoint = load_tokenizer(uri.removeprefix("file://"))
    assert encode_prompt(from_checkpoint, json.dumps(MESSAGES), chat=True) == expected


def test_transformers_backend_samples_groups_from_chat_prompts(chat_dir):
    backend = TransformersBackend.from_path(str(chat_dir))
    reqs = [Request(backend.encode(json.dumps(MESSAGES), chat=True), 3, Sampling(1.0, 1.0, 5, []))] * 2
    out = backend.generate(reqs)
    assert [len(g) for g in out] == [3, 3]
    assert all(0 < len(c.token_ids) == len(c.logprobs) <= 5 and max(c.logprobs) <= 0 for g in out for c in g)


def test_an_environment_s_fault_is_warned_of_by_the_producer_with_its_error(chat_dir, tmp_path):
    """Each episode of the group ends on the fault with reward 0; the producer's log says which
    fault and why once, at the first of them (then at the 10th, ...), not only a count."""
    import structlog

    from prl.producers.service import Producer
    from prl.transport.memory import MemoryTransport
    from prl.schemas import Dispatch, encode, topic_name
    from prl.schemas.config import load_config
    from prl.schemas.topics import PROBLEMS

    cfg = load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", f"model.path={json.dumps(str(chat_dir))}",
                                 "task.environment='tests.unit.test_environments:Broken'"])
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    producer = Producer(cfg, transport)
    transport.publisher().publish(topic_name(cfg.run.name, PROBLEMS), encode(
        Dispatch("d0", "p0", json.dumps(MESSAGES), "42", 4, Sampling(1.0, 1.0, 6, []), 0, chat=True)))
    with structlog.testing.capture_logs() as logs:
        producer.step()
    [warning] = [e for e in logs if e["event"] == "episode_failed"]
    assert (warning["kind"], warning["count"]) == ("env_error", 1)
    assert "RuntimeError: the environment broke" in warning["error"] and producer.counters["episode_faults/env_error"] == 4


def test_an_environment_that_fails_every_episode_alike_stops_the_producer(chat_dir, tmp_path, monkeypatch):
    """Every episode ended on the same fault with reward 0, for ever (no signal, no step): once
    BROKEN_AFTER episodes (8 here) failed alike from the first on, the producer stops, saying why."""
    from prl.plugins import PluginError
    from prl.producers.service import Producer
    from prl.transport.memory import MemoryTransport
    from prl.schemas import Dispatch, encode, topic_name
    from prl.schemas.config import load_config
    from prl.schemas.topics import PROBLEMS

    monkeypatch.setattr("prl.plugins.BROKEN_AFTER", 8)
    cfg = load_config(overrides=[f"run.run_dir={json.dumps(str(tmp_path / 'run'))}", f"model.path={json.dumps(str(chat_dir))}",
                                 "task.environment='tests.unit.test_environments:Broken'"])
    transport = MemoryTransport()
    transport.ensure_topics(cfg.run.name)
    producer = Producer(cfg, transport)
    for d in ("d0", "d1"):
        transport.publisher().publish(topic_name(cfg.run.name, PROBLEMS), encode(
            Dispatch(d, "p0", json.dumps(MESSAGES), "42", 4, Sampling(1.0, 1.0, 6, []), 0, chat=True)))
        if d == "d0":
            producer.step()  # 4 episodes failed alike: not yet
    with pytest.raises(PluginError) as err:
        producer.step()
    assert str(err.value).startswith("task.environment tests.unit.test_environments:Broken failed each of its first 8 "
                                     "episodes and never ended one: env_error: RuntimeError: the environment broke (at ")
