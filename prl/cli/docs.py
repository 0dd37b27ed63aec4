"""The configuration reference, generated from the config model's field docs:
``python -m prl.cli.docs`` rewrites docs/configuration.md (a test checks it is current)."""

from __future__ import annotations

from pathlib import Path

from prl.schemas.config import settings

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEAD = """# Configuration reference

One TOML file (`--config FILE`) plus dotted overrides (`--set learner.lr=1e-5`, values read as
TOML); `prl config` prints the validated result. Generated from prl/schemas/config.py by
`python -m prl.cli.docs`.

| key | default | meaning |
|---|---|---|
"""


def reference() -> str:
    rows = [f"| `{name}` | `{field.default!r}` | {field.description} |" for name, field in settings()]
    return HEAD + "\n".join(rows) + "\n"


if __name__ == "__main__":
    REFERENCE.write_text(reference())
