"""The import graph of buildtool/ and of the runtime package (kernels/fa_attn/): no module imports,
directly or not, a module that imports it (not even inside a function or under TYPE_CHECKING), and
fa_attn's parts build on each other in one direction: the shared leaves (schema, reasons, versions,
ownfiles, ...) import none of the three subpackages, runtime/ and verify/ import nothing of standin/
(fa_attn in other libraries' places is on top: it calls the runtime, never the other way round).

Read from the source with ast, so an import that only runs on a GPU or in one branch counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"buildtool": REPO, "fa_attn": REPO / "kernels"}


def _modules(top: str) -> dict[str, Path]:
    base = ROOTS[top]
    out = {}
    for path in sorted((base / top).rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `name` imports anywhere in its source. `from P import x` counts
    P.x when that is a module, else P; a package's own __init__ counts only when named outright."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = {f"{source}.{a.name}" for a in node.names} & set(modules)
            found |= subs
            if len(subs) < len(node.names) and source in modules:
                found.add(source)
    return found - {name}


def _graph(top: str) -> dict[str, set[str]]:
    modules = _modules(top)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_sees_the_imports_it_checks() -> None:
    """The walk is not vacuous: it finds relative, nested-package and in-function imports."""
    fa = _graph("fa_attn")
    assert "fa_attn.runtime.decision" in fa["fa_attn.runtime.dispatch"]
    assert "fa_attn.reasons" in fa["fa_attn.runtime.decision"]  # from ..reasons import Reason
    assert "fa_attn.verify.selfcheck" in fa["fa_attn.runtime.interface"]
    assert "fa_attn.runtime.kvcache" in fa["fa_attn.standin.hf"]  # imported inside a function
    tool = _graph("buildtool")
    assert "buildtool.builder.wheel_specs" in tool["buildtool.builder.plan"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("top", sorted(ROOTS))
def test_no_import_cycle(top: str) -> None:
    assert _cycles(_graph(top)) == []


def _part(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 2 and parts[1] in ("runtime", "verify", "standin"):
        return parts[1]
    return "fa_attn" if name == "fa_attn" else "leaf"


# What each part of fa_attn may import (besides itself); the package's __init__ may import all.
ALLOWED = {
    "leaf": {"leaf"},
    "runtime": {"leaf", "verify"},
    "verify": {"leaf", "runtime"},
    "standin": {"leaf", "runtime"},
}


def test_fa_attn_parts_build_on_each_other_in_one_direction() -> None:
    wrong = []
    for name, imported in sorted(_graph("fa_attn").items()):
        part = _part(name)
        if part == "fa_attn" or name == "fa_attn._old_paths":
            continue
        wrong += [f"{name} -> {m}" for m in sorted(imported) if _part(m) not in ALLOWED[part] | {part}]
    assert wrong == []
