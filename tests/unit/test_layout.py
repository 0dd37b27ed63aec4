"""The house rules, checked: floors (who may import whom), no import cycles, short
functions, and docs that name only paths and modules that exist.

Floors, bottom up: prl.schemas (the contract) <- prl (the shared floor) <- prl.scheduler,
prl.producers, prl.learner (the services) <- prl.cli and benchmarks/ (the commands)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> the module it installs as: every component is a subpackage of prl (pyproject.toml)
FOLDERS = {"schemas": "prl.schemas", "prl": "prl", "scheduler": "prl.scheduler", "producers": "prl.producers",
           "learner": "prl.learner", "benchmarks": "benchmarks"}
SERVICES = ("scheduler", "producers", "learner")
MAX_FUNCTION_LINES = 40


def floor(module: str) -> str:
    """schemas | floor | <service name> | commands."""
    parts = module.split(".")
    if parts[0] == "benchmarks" or parts[:2] == ["prl", "cli"]:
        return "commands"
    if parts[0] == "prl" and len(parts) > 1 and parts[1] in ("schemas", *SERVICES):
        return parts[1]
    return "floor"


def allowed(src: str, dst: str) -> bool:
    a, b = floor(src), floor(dst)
    if a == "schemas":
        return b == "schemas"
    if a == "floor":
        return b in ("schemas", "floor")
    if a in SERVICES:
        return b in ("schemas", "floor", a)
    return True  # commands wire everything together


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package, *parts))] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every module of ours that ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                node_module = ".".join(base + ([node.module] if node.module else []))
            else:
                node_module = node.module or ""
            found.add(node_module)
            found |= {f"{node_module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("prl", "benchmarks")}


def test_components_are_imported_under_prl_only():
    """The folders install as prl.schemas, prl.scheduler, ...: an import by the folder's bare
    name would load a second copy of the module from the source tree."""
    bare = re.compile(r"^\s*(?:from|import) (?:schemas|scheduler|producers|learner)\b", re.M)
    wrong = [str(p.relative_to(ROOT)) for folder in (*FOLDERS, "tests", "tools") for p in (ROOT / folder).rglob("*.py")
             if bare.search(p.read_text())]
    assert not wrong, wrong


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: {m for m in imports(path, name) if m in mods and m != name} for name, path in mods.items()}


def test_every_import_points_down_or_within_a_floor():
    wrong = [f"{src} -> {dst} ({floor(src)} may not import {floor(dst)})"
             for src, dsts in graph().items() for dst in sorted(dsts) if not allowed(src, dst)]
    assert not wrong, "\n".join(wrong)


def test_no_service_imports_another():
    for src, dsts in graph().items():
        if floor(src) in SERVICES:
            assert not {floor(d) for d in dsts} & (set(SERVICES) - {floor(src)}), src


def test_no_import_cycles():
    g = graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    # a package's __init__ re-exporting its own submodules is not a cycle between modules
    cycles = [c for c in cycles if not all(m.startswith(min(c, key=len) + ".") or m == min(c, key=len) for m in c)]
    assert not cycles, cycles


def test_no_function_is_longer_than_forty_lines():
    long = []
    for path in [*(ROOT / p for p in FOLDERS if p != "benchmarks"), ROOT / "tests"]:
        for file in path.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long.append(f"{file.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "\n".join(long)


DOCS = ["README.md", "deploy/k8s/README.md", "benchmarks/RESULTS.md"]
# a file of the repo (with its extension; a test may follow as ::name), and a function spec module:function
PATH = re.compile(r"(?<![\w./-])((?:schemas|prl|scheduler|producers|learner|benchmarks|tests|tools|deploy|docs|examples)"
                  r"/[\w./-]*\.(?:py|md|toml|png|yaml|json|arrow))(?:::(\w+))?")
SPEC = re.compile(r"\b((?:prl|benchmarks)(?:\.\w+)+):(\w+)|python -m ((?:prl|benchmarks|tools)[\w.]*)")


@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_only_paths_and_modules_that_exist(doc):
    text = (ROOT / doc).read_text()
    missing = []
    for m in PATH.finditer(text):
        path, test = m.group(1), m.group(2)
        if "<" in path or "*" in path:
            continue
        if not (ROOT / path).exists():
            missing.append(path)
        elif test and f"def {test}(" not in (ROOT / path).read_text():
            missing.append(f"{path}::{test}")
    for m in SPEC.finditer(text):
        module, attr = m.group(1) or m.group(3), m.group(2)
        if _module_file(module) is None:
            missing.append(module)
        elif attr and not re.search(rf"\b{attr}\b", _module_file(module).read_text()):
            missing.append(f"{module}:{attr}")
    assert not missing, f"{doc} names what does not exist: {sorted(set(missing))}"


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[:2] != ["prl", "cli"] and len(parts) > 1 and parts[0] == "prl" and parts[1] in FOLDERS:
        parts = parts[1:]  # prl.scheduler.x lives in scheduler/x.py
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None
