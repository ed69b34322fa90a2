"""The project's import graph: no circles between its modules, and no arrow back up from `cluster/`
(placement, processes, /dev/shm) into `actors/` (what holds resources). Every import counts, also one inside a
function or under TYPE_CHECKING: a circle there still ties the modules together."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "algorithms", "cluster", "configs", "pipelines", "recipes", "scripts", "serving")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (`from pkg import sub` counts as `pkg.sub` when that is a module)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_parser_reads_the_real_tree():
    """The graph the other tests check is the repository's own (an empty or edge-less graph would pass them):
    every package's modules are nodes, and it holds known edges of each import form."""
    g = graph()
    assert all(any(m == pkg or m.startswith(pkg + ".") for m in g) for pkg in PACKAGES)
    recipes = {f"recipes.{p.stem}" for p in (ROOT / "recipes").glob("*.py") if p.stem != "__init__"}
    assert {"recipes.s3", "recipes.search_r1", "recipes.base"} <= recipes <= set(g)
    assert sum(map(len, g.values())) > len(g)  # most modules import several others
    known = {
        ("pipelines.train", "configs.schema"),  # `from configs.schema import Config`: a name, so the module
        ("pipelines.train", "actors.learner.group"),  # inside a function
        ("pipelines.train_checks", "recipes"),  # `from recipes import RECIPES`: the package
        ("pipelines.warm_start", "pipelines.checkpoints"),
        ("algorithms", "algorithms.config"),  # `from .config import AlgorithmConfig` in a package's __init__
        ("configs", "configs.loader"),
    }
    assert {(m, t) for m, t in known if t in g.get(m, set())} == known
    assert "pipelines.train" not in g["pipelines.train"]


def test_no_import_circles():
    assert circles(graph()) == []


def test_cluster_imports_nothing_from_actors():
    g = graph()
    assert [(m, t) for m in sorted(g) if m.startswith("cluster") for t in sorted(g[m]) if t.startswith("actors")] == []


def test_scripts_top_level_is_the_entry_points_and_the_subpackages():
    """`ls scripts/` shows the product first: every top-level module but the shared `cli` is an
    entry point (it has `main`) named in the README's layout row, and everything else sits in a sub-package."""
    readme_row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `scripts/` |"))
    for path in sorted((ROOT / "scripts").glob("*.py")):
        if path.stem in ("__init__", "cli"):
            continue
        assert "def main(" in path.read_text(), f"scripts/{path.name} is not an entry point; move it to a sub-package"
        assert f"`{path.stem}`" in readme_row, f"scripts/{path.name} is missing from the README's scripts/ row"
    subpackages = {p.name for p in (ROOT / "scripts").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert subpackages == {"bench", "peer", "probes", "ops"}
