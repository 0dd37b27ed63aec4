"""What a service checks before it acts on a control message: where a checkpoint may be,
and who signed the message.

Topics are input from outside: anyone who can write to one can send anything. Two walls:

- **Version location.** A PolicyVersion is followed only if its ``uri`` is the run's own
  policy version of that number: the same scheme (from an allow-list) and bucket as the run's
  policy root, a path inside it without ``..``, and the directory name ``v-<version:08d>``.
  Loading then verifies the manifest's checksums, and the rebuilt weights' checksum against
  the one the announcement carries, before a weight is served (prl/policy.py).
- **Signatures (HMAC-SHA256).** With ``transport.signed_kinds`` set, a message of a signed
  kind carries a ``signature`` header: HMAC over the topic name and the encoded record, with a
  key per kind from the environment (``PRL_KEY_POLICY``, ``PRL_KEY_BATCHES``, ...; on
  Kubernetes the Secret prl-signing-keys). Unsigned or badly signed messages are dead-lettered,
  so someone who can only write to a topic cannot announce a policy or send a batch. HMAC is
  symmetric: whoever verifies a kind could also sign it, so each service gets only the keys of
  the kinds it reads or writes (the producers have no batch key).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import posixpath
from urllib.parse import urlsplit

SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "memory")
SIGNATURE_HEADER = "signature"
KEY_ENV_PREFIX = "PRL_KEY_"  # the key of kind K is in the environment variable PRL_KEY_<K>


class KeyMissing(ValueError):
    """A signed kind is configured but its key is not in the environment."""


def checkpoint_name(version: int) -> str:
    return f"step-{version:08d}"


def checkpoint_root(run_dir: str) -> str:
    return run_dir.rstrip("/") + "/checkpoints"


def version_name(version: int) -> str:
    return f"v-{version:08d}"


def policy_root(run_dir: str) -> str:
    """Where the learner writes policy versions (prl/policy.py)."""
    return run_dir.rstrip("/") + "/policy"


def _split(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket or host, normalized absolute path) of a URI or local path."""
    parts = urlsplit(uri)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive letter)
        return "file", "", posixpath.normpath(os.path.abspath(uri))
    return parts.scheme, parts.netloc, parts.path


def version_problem(uri: str, run_dir: str, version: int) -> str | None:
    """Why ``uri`` is not this run's policy version ``version`` (None when it is)."""
    if not uri:
        return "no uri"
    if ".." in uri.replace("\\", "/").split("/"):
        return f"{uri!r} contains '..'"
    scheme, host, path = _split(uri)
    root = policy_root(run_dir)
    root_scheme, root_host, root_path = _split(root)
    if scheme not in SCHEMES:
        return f"scheme {scheme!r} is not one of {', '.join(SCHEMES)}"
    if (scheme, host) != (root_scheme, root_host):
        return f"{uri!r} is not on the run's storage ({root})"
    if posixpath.normpath(path).rstrip("/") != posixpath.join(root_path.rstrip("/"), version_name(version)):
        return f"{uri!r} is not {root}/{version_name(version)}"
    return None


class Signer:
    """HMAC-SHA256 signatures for the record kinds configured (``transport.signed_kinds``)."""

    def __init__(self, kinds: list[str], key_env_prefix: str = KEY_ENV_PREFIX, env=os.environ):
        self.keys: dict[str, bytes] = {}
        for kind in kinds:
            name = f"{key_env_prefix}{kind.upper()}"
            value = env.get(name)
            if value is not None:
                self.keys[kind] = value.encode()
        self.kinds = set(kinds)
        self.key_env_prefix = key_env_prefix

    def require(self, kind: str) -> bytes:
        if kind not in self.keys:
            raise KeyMissing(f"messages of kind {kind!r} are signed (transport.signed_kinds) but "
                             f"{self.key_env_prefix}{kind.upper()} is not set")
        return self.keys[kind]

    def signature(self, kind: str, topic: str, value: bytes) -> bytes:
        return hmac.new(self.require(kind), topic.encode() + b"\0" + value, hashlib.sha256).hexdigest().encode()

    def headers(self, kind: str, topic: str, value: bytes) -> list[tuple[str, bytes]]:
        """The signature header for a message of ``kind`` (none for kinds not signed)."""
        return [(SIGNATURE_HEADER, self.signature(kind, topic, value))] if kind in self.kinds else []

    def problem(self, kind: str, topic: str, value: bytes, signature: bytes | None) -> str | None:
        """Why a message of ``kind`` is not trusted: unsigned, or a signature that does not match."""
        if kind not in self.kinds:
            return None
        if signature is None:
            return "unsigned"
        if not hmac.compare_digest(signature, self.signature(kind, topic, value)):
            return "bad_signature"
        return None
