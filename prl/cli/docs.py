"""The configuration reference (Markdown) from the config model's field docs:
``python -m prl.cli.docs`` rewrites the table in README.md in place."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from prl.schemas.config import Config


def rows(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from rows(ann, f"{prefix}{name}.")
        else:
            default = field.default
            yield f"| `{prefix}{name}` | `{default!r}` | {field.description or ''} |"


def reference() -> str:
    return "\n".join(["| key | default | meaning |", "|---|---|---|", *rows(Config)])


def update_readme(path: Path = Path(__file__).resolve().parents[2] / "README.md") -> None:
    lines = path.read_text().splitlines()
    start = lines.index("| key | default | meaning |")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    path.write_text("\n".join(lines[:start] + reference().splitlines() + lines[end:]) + "\n")


if __name__ == "__main__":
    update_readme()
