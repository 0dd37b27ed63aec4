"""The wire and storage contract: record schemas, topic names and the config model.

Importable with pyarrow and pydantic alone (no torch, no vLLM).
"""

from prl.schemas.records import (
    LOGPROB_MIN,
    SCHEMA_VERSION,
    DeadLetter,
    DecodeError,
    Dispatch,
    EvalProblem,
    EvalRequest,
    EvalResult,
    PolicyVersion,
    Rollout,
    RolloutGroup,
    RolloutRef,
    Sampling,
    TrainBatch,
    TrainBatchRefs,
    TrainRollout,
    decode,
    encode,
    headers,
)
from prl.schemas.topics import TOPICS, topic_name

__all__ = [
    "LOGPROB_MIN",
    "SCHEMA_VERSION",
    "TOPICS",
    "DeadLetter",
    "DecodeError",
    "Dispatch",
    "EvalProblem",
    "EvalRequest",
    "EvalResult",
    "PolicyVersion",
    "Rollout",
    "RolloutGroup",
    "RolloutRef",
    "Sampling",
    "TrainBatch",
    "TrainBatchRefs",
    "TrainRollout",
    "decode",
    "encode",
    "headers",
    "topic_name",
]
