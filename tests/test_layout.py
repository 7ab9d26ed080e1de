"""The layout of the ``runner`` package, read from its source with ``ast`` (no model, no import).

Three counts, over the *package level*: one node per sub-package (``runner.loop``, ``runner.ml``,
...; everything below ``runner/ml/`` is ``runner.ml``), one per loose module (``runner.api``,
``runner.config``, ...), and ``runner`` for ``runner/__init__.py``, the top:

- **loose modules**: ``.py`` files directly in ``runner/``. Asserted *with* ``__init__.py``
  counted (the stricter count): at most 8.
- **circles**: the strongly connected components of more than one node in the import graph. An
  edge is any ``import`` or ``from ... import`` in any file of a node, at module level or inside a
  function (a lazy import is still a dependency), relative imports resolved. ``from runner import
  X`` is an edge to ``runner.X`` when ``X`` is a submodule, else to the top, as ``import runner``
  is. Asserted: none.
- **floors**: the number of nodes on the longest chain of the graph once each circle is one node
  (a node that imports nothing of runner's is floor 1). Printed, not asserted.

Also asserted: nothing below the top imports the top. ``runner/__init__.py`` is the face the CLI
and the server (``runner.server``, the application the top never imports) load a model through;
a package the top imports, directly or through others, that reaches back up to it runs back up
a layer and makes a circle through every package between them.

``python tests/test_layout.py [REPO]`` prints the counts for the checkout at ``REPO`` (default:
this one), so a note can quote them.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = "runner"
MAX_LOOSE = 8


def _modules(repo: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``runner/``."""
    out = {}
    for path in sorted((repo / TOP).rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _node(module: str) -> str:
    """The package-level node of a dotted name under ``runner``."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module under runner, line) for every import in ``path`` (module ``name``)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in modules else base), node.lineno


def graph(repo: Path) -> tuple[dict[str, set[str]], list[tuple[str, str, str, int]]]:
    """The package-level import graph (node -> nodes it imports) and every cross-node edge as
    (from node, to node, file, line)."""
    modules = _modules(repo)
    edges: dict[str, set[str]] = {_node(m): set() for m in modules}
    where = []
    for name, path in modules.items():
        src = _node(name)
        for target, line in _imports(name, path, modules):
            if target != TOP and not target.startswith(TOP + "."):
                continue
            dst = _node(target)
            if dst != src:
                edges[src].add(dst)
                where.append((src, dst, str(path.relative_to(repo)), line))
    return edges, where


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def floors(edges: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The longest chain (in nodes) of the graph with each circle merged into one node, and one
    such chain from the top down."""
    comp_of = {v: v for v in edges}
    for comp in circles(edges):
        label = "{" + ", ".join(comp) + "}"
        for v in comp:
            comp_of[v] = label
    dag: dict[str, set[str]] = {c: set() for c in comp_of.values()}
    for v, ws in edges.items():
        for w in ws:
            if comp_of[v] != comp_of[w]:
                dag[comp_of[v]].add(comp_of[w])
    memo: dict[str, list[str]] = {}

    def chain(c: str) -> list[str]:
        if c not in memo:
            below = [chain(d) for d in sorted(dag[c])]
            memo[c] = [c] + max(below, key=len, default=[])
        return memo[c]

    best = max((chain(c) for c in sorted(dag)), key=len, default=[])
    return len(best), best


def loose(repo: Path) -> list[str]:
    """The ``.py`` files directly in ``runner/``, ``__init__.py`` included."""
    return sorted(p.name for p in (repo / TOP).glob("*.py"))


# ------------------------------------------------------------------------------------ tests


def test_loose_modules() -> None:
    names = loose(ROOT)
    assert len(names) <= MAX_LOOSE, f"{len(names)} loose modules in runner/ (at most {MAX_LOOSE}): {names}"


def test_no_package_circle() -> None:
    edges, where = graph(ROOT)
    found = circles(edges)
    detail = [f"{src} -> {dst}: {file}:{line}" for src, dst, file, line in where
              if any(src in c and dst in c for c in found)]
    assert not found, f"import circles {found}:\n" + "\n".join(detail)


def below_top(edges: dict[str, set[str]]) -> set[str]:
    """The nodes the top imports, directly or through others."""
    seen: set[str] = set()
    todo = [TOP]
    while todo:
        for dst in edges.get(todo.pop(), ()):
            if dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return seen - {TOP}


def up_imports(edges: dict[str, set[str]], where: list) -> list[str]:
    """Imports of the top from a node below it (``file:line``)."""
    below = below_top(edges)
    return sorted({f"{file}:{line}" for src, dst, file, line in where if dst == TOP and src in below})


def test_nothing_imports_the_top() -> None:
    edges, where = graph(ROOT)
    up = up_imports(edges, where)
    assert not up, "imports of the top `runner` package from below it:\n" + "\n".join(up)


def main(repo: Path) -> None:
    names = loose(repo)
    edges, where = graph(repo)
    found = circles(edges)
    depth, chain = floors(edges)
    up = up_imports(edges, where)
    print(f"repo: {repo}")
    print(f"loose modules: {len(names)} with __init__.py, {len(names) - ('__init__.py' in names)} without "
          f"({', '.join(names)})")
    print(f"package-level nodes: {len(edges)}, edges: {sum(map(len, edges.values()))}")
    print(f"circles: {len(found)}")
    for comp in found:
        print(f"  {len(comp)} nodes: {', '.join(comp)}")
        files: dict[tuple[str, str], dict[str, int]] = {}
        for src, dst, file, line in where:
            if src in comp and dst in comp:
                files.setdefault((src, dst), {}).setdefault(file, line)
        for (src, dst), at in sorted(files.items()):
            print(f"    {src} -> {dst}: {', '.join(f'{f}:{n}' for f, n in sorted(at.items()))}")
    print(f"floors: {depth}  ({' -> '.join(chain)})")
    print(f"imports of the top `runner` from below it: {len(up)}")
    for item in up:
        print(f"  {item}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
