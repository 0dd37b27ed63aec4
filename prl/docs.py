"""Print the configuration reference (Markdown) from the config model's field docs:
``python -m prl.docs`` regenerates the table in README.md."""

from __future__ import annotations

from pydantic import BaseModel

from schemas.config import Config


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


if __name__ == "__main__":
    print(reference())
