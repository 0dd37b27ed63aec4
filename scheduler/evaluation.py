"""Evaluation by the generation fleet: held-out problems are problems nobody trains on.

When a policy version is due (version 0, every ``learner.eval_every`` versions, the last and any
the run asks for), the evaluator sends the held-out set to the producers as EvalRequests of
``CHUNK`` problems on the problems topic, each naming the version that must answer. A producer
answers greedily with that version's weights and no other (or says it cannot); the answers come
back as EvalResults on the rollouts topic. When every problem of a version is answered, one
metrics line (``eval/accuracy``, ``eval/accuracy_d<N>``, at ``step`` = the version, with the
rollouts generated when the version was announced) and one log line go out, and its answers
are written to ``<run_dir>/evaluations/step-<version>.jsonl``, one line per held-out problem
(id, difficulty, answer, reward, the greedy completion), to read what the model gets wrong. A
request that times out or cannot be answered is sent again; after ``MAX_ATTEMPTS`` the version
is reported incomplete, never as an accuracy over part of the set.

Results never reach training: they are another record kind, read by this class alone, and a
held-out problem id is not a training problem (the scheduler refuses both to overlap).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import fsspec

from prl.errors import one_line
from prl.evaluation import accuracy
from prl.storage import replace_file
from prl.schemas import EvalProblem, EvalRequest, EvalResult

CHUNK = 64  # held-out problems per EvalRequest: one generation call of a producer
MAX_ATTEMPTS = 3  # sends of one request before its version is reported incomplete


def answers_dir(run_dir: str) -> str:
    """Where every evaluation's answers are written, a file per version."""
    return f"{run_dir.rstrip('/')}/evaluations"


def answers_uri(run_dir: str, version: int) -> str:
    """Where the answers of ``version``'s evaluation are written."""
    return f"{answers_dir(run_dir)}/step-{version:08d}.jsonl"


@dataclass
class Pending:
    version: int
    indices: list[int]  # into the held-out set
    issued_at: float
    attempt: int = 0


@dataclass
class Evaluation:
    """One version's evaluation: its rewards as they come back."""

    version: int
    rollouts_generated: int
    started_at: float
    rewards: dict[int, float] = field(default_factory=dict)  # held-out index -> reward
    outcome: str = "running"  # "running", "done" or "incomplete"
    figures: dict = field(default_factory=dict)  # accuracy overall and per difficulty, once done
    texts: dict[int, str] = field(default_factory=dict)  # held-out index -> greedy completion (not snapshotted)


class Evaluator:
    def __init__(self, problems, cfg, send, emit, log):
        """``problems``: the held-out set; ``send(request)`` dispatches, ``emit(values, **context)``
        writes a metrics line, ``log`` is the scheduler's logger."""
        self.problems, self.cfg, self.send, self.emit, self.log = problems, cfg, send, emit, log
        self.pending: dict[str, Pending] = {}
        self.evaluations: dict[int, Evaluation] = {}

    def due(self, version: int) -> bool:
        every = self.cfg.learner.eval_every
        return bool(every and self.problems) and (version % every == 0 or version >= self.cfg.learner.max_steps)

    def start(self, version: int, rollouts_generated: int) -> None:
        """Send the held-out set for ``version`` (once per version)."""
        if version in self.evaluations:
            return
        self.evaluations[version] = Evaluation(version, rollouts_generated, time.time())
        for lo in range(0, len(self.problems), CHUNK):
            self.request(version, list(range(lo, min(lo + CHUNK, len(self.problems)))), attempt=0)

    def request(self, version: int, indices: list[int], attempt: int) -> None:
        problems = [EvalProblem(p.id, p.prompt, p.answer, p.difficulty, p.chat, p.env_args) for p in (self.problems[i] for i in indices)]
        req = EvalRequest(uuid.uuid4().hex, version, problems, self.cfg.sampling.max_tokens, attempt, time.time())
        self.pending[req.request_id] = Pending(version, indices, req.issued_at, attempt)
        self.send(req)

    def problem(self, result: EvalResult) -> tuple[str, str] | None:
        """(reason, detail) why ``result`` answers no request of ours as asked, else None."""
        pending = self.pending.get(result.request_id)
        if pending is None:
            return None  # unknown or already answered: counted, not dead-lettered (at-least-once delivery)
        if result.version != pending.version:
            return "wrong_version", f"version {result.version} answered a request for version {pending.version}"
        if not result.error and result.problem_ids != [self.problems[i].id for i in pending.indices]:
            return "wrong_problems", "the answers are not for the problems asked, in their order"
        return None

    def accept(self, result: EvalResult) -> bool:
        """Record a checked result; False for one no request is waiting for (a duplicate)."""
        pending = self.pending.pop(result.request_id, None)
        if pending is None:
            return False
        if result.error:
            self.log.info("evaluation_refused", version=pending.version, producer_id=result.producer_id, error=result.error)
            self.again(pending)
            return True
        evaluation = self.evaluations[pending.version]
        evaluation.rewards.update(zip(pending.indices, map(float, result.rewards)))
        evaluation.texts.update(zip(pending.indices, result.texts))
        if len(evaluation.rewards) == len(self.problems):
            self.finish(evaluation)
        return True

    def again(self, pending: Pending) -> None:
        """Send a request again, or give its version up as incomplete."""
        evaluation = self.evaluations[pending.version]
        if evaluation.outcome != "running":
            return
        if pending.attempt + 1 < MAX_ATTEMPTS:
            self.request(pending.version, pending.indices, pending.attempt + 1)
            return
        evaluation.outcome = "incomplete"
        self.pending = {rid: p for rid, p in self.pending.items() if p.version != pending.version}
        self.emit({"incomplete": 1, "answered": len(evaluation.rewards), "of": len(self.problems)}, step=pending.version,
                  rollouts_generated=evaluation.rollouts_generated)
        self.log.warning("evaluation_incomplete", version=pending.version, answered=len(evaluation.rewards),
                         of=len(self.problems), attempts=MAX_ATTEMPTS)

    def send_again(self) -> None:
        """Send every request still waiting again, at the same attempt (the earlier sends were lost
        with the broker that held them)."""
        waiting, self.pending = list(self.pending.values()), {}
        for pending in waiting:
            self.request(pending.version, pending.indices, pending.attempt)

    def redispatch_timed_out(self, timeout_s: float) -> None:
        now = time.time()
        for rid, pending in list(self.pending.items()):
            if now - pending.issued_at > timeout_s and self.pending.pop(rid, None) is not None:
                self.again(pending)

    def finish(self, evaluation: Evaluation) -> None:
        indices = sorted(evaluation.rewards)
        figures = accuracy([self.problems[i].difficulty for i in indices], [evaluation.rewards[i] for i in indices])
        figures["eval_seconds"] = time.time() - evaluation.started_at
        evaluation.outcome, evaluation.figures = "done", figures
        self.emit(figures, step=evaluation.version, rollouts_generated=evaluation.rollouts_generated)
        self.log.info("heldout", step=evaluation.version, **{k: round(v, 3) for k, v in figures.items()})
        self.write_answers(evaluation)
        evaluation.texts = {}

    def write_answers(self, evaluation: Evaluation) -> None:
        """The evaluation's answers as JSON lines, in held-out order. A text answered before a
        scheduler restart is not kept (snapshots hold rewards only): its line has ``text`` null.
        A failed write is logged and the run goes on (the figures are out already)."""
        uri = answers_uri(self.cfg.run.run_dir, evaluation.version)
        lines = [json.dumps({"problem_id": p.id, "difficulty": p.difficulty, "answer": p.answer,
                             "reward": evaluation.rewards[i], "text": evaluation.texts.get(i)})
                 for i, p in enumerate(self.problems)]
        try:
            fs, path = fsspec.core.url_to_fs(uri)
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            replace_file(fs, path, "".join(f"{line}\n" for line in lines).encode())
        except Exception as exc:  # a full disk or an unreachable store: the answers are a record, not state
            self.log.warning("evaluation_answers_not_written", uri=uri, error=one_line(exc))

    def settled(self, version: int, started: bool = False) -> bool:
        """Whether ``version``'s evaluation is done or given up (or, unless ``started``, was never asked)."""
        e = self.evaluations.get(version)
        return not started if e is None else e.outcome != "running"

    def running(self) -> list[int]:
        """The versions whose evaluation is still waiting for answers (safe from another thread)."""
        return sorted(e.version for e in list(self.evaluations.values()) if e.outcome == "running")

    def done(self) -> list[Evaluation]:
        """The finished evaluations, by version (safe to call from another thread)."""
        return sorted((e for e in list(self.evaluations.values()) if e.outcome == "done"), key=lambda e: e.version)

    def state_dict(self) -> dict:
        return {"pending": {rid: [p.version, p.indices, p.issued_at, p.attempt] for rid, p in self.pending.items()},
                "evaluations": {str(v): [e.rollouts_generated, e.started_at, {str(i): r for i, r in e.rewards.items()},
                                         e.outcome, e.figures] for v, e in self.evaluations.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.pending = {rid: Pending(*v) for rid, v in state["pending"].items()}
        self.evaluations = {int(v): Evaluation(int(v), e[0], e[1], {int(i): r for i, r in e[2].items()}, e[3], e[4])
                            for v, e in state["evaluations"].items()}
