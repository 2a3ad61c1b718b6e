"""No import circle in the package: every `import` of a specdepth module, read with `ast`.

Every import statement counts, also those inside functions: a lazy import hides a circle from
Python but not from a reader. Importing `a.b.c` runs `a/__init__` and `a/b/__init__` too, so
those are edges as well. `python tests/test_import_graph.py` prints the graph's summary.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("adaptive", "policies", "workers", "experiments")


def package_modules(repo: Path = REPO) -> dict[str, Path]:
    """Dotted name (`specdepth.adaptive.cost.model`) -> file, for every module of the package."""
    found: dict[str, Path] = {}
    for folder in FOLDERS:
        for path in sorted((repo / folder).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["specdepth", *parts])] = path
    return found


def _with_parents(name: str, modules: dict[str, Path]) -> list[str]:
    """`name` and every package above it that is one of ours (importing it runs their __init__)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in modules]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]  # `from pkg import submodule`
        for t in targets:
            if t.startswith("specdepth.") and t in modules:
                out.update(_with_parents(t, modules))
    out.discard(name)
    return out


def import_graph(repo: Path = REPO) -> dict[str, set[str]]:
    modules = package_modules(repo)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk really read the package
    assert circles(graph) == []


def test_policies_import_nothing_of_the_engine():
    """policies/ is pure numpy: it imports neither the engine's folders nor torch (README)."""
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("specdepth.policies"):
            assert all(d.startswith("specdepth.policies") for d in deps), (name, deps)


if __name__ == "__main__":
    g = import_graph()
    c = circles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} import edges, {len(c)} circle(s)")
    for comp in c:
        print("  circle:", " <-> ".join(comp))
    sys.exit(1 if c else 0)
