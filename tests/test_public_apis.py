"""The project's code uses Ray only through its public API: no `ray._private` (or any `ray.*._x`) module,
no `_name` imported from a Ray module, no `_attribute` reached through a Ray name. Pure `ast`, no imports
of the scanned code; `tests/` may use private Ray APIs (fault injection, packaging checks)."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("actors", "algorithms", "cluster", "configs", "pipelines", "recipes", "scripts", "serving")


def _private(name: str) -> bool:
    """A private name: a leading underscore, not a dunder (`ray.__version__` is public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_ray(module: str | None) -> bool:
    return module is not None and (module == "ray" or module.startswith("ray."))


def private_ray_uses(source: str, filename: str = "<string>") -> list[str]:
    """`"<line>: <what>"` for each use of a private Ray API in Python `source`.

    Caught: `import ray._private...` / `import ray.serve._private.x` (any module path segment with a
    leading underscore), `from ray.x._y import z`, `from ray.x import _y`, and `_attr` reached through a
    name bound by a Ray import (`ray._private.worker`, `serve._private`, `context._get_global_client`).
    """
    tree = ast.parse(source, filename)
    found, ray_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ray(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    ray_names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_ray(node.module):
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                ray_names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in ray_names:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


@pytest.mark.parametrize(
    "source, bad",
    [
        ("import ray._private.worker", True),
        ("import ray.serve._private.api as api", True),
        ("from ray._private.thirdparty.pathspec import PathSpec", True),
        ("from ray.serve.context import _get_global_client", True),
        ("from ray.serve import _run", True),
        ("import ray\nray._private.worker.global_worker", True),
        ("from ray import serve\nserve.context._get_global_client()", True),
        ("import ray as r\nr.util._x", True),
        ("import ray\nfrom ray import serve\nray.get(serve.status())\nray.__version__", False),
        ("from ray.exceptions import RayActorError\nobj._private", False),
        ("import numpy as np\nnp._core", False),
        ("from .ray import _x", False),
    ],
)
def test_checker_catches_private_ray_uses(source, bad):
    assert bool(private_ray_uses(source)) == bad, private_ray_uses(source)


def test_no_private_ray_api_outside_tests():
    files = sorted(p for d in SCANNED for p in (REPO / d).rglob("*.py"))
    assert len(files) > 50, files  # the scan really covers the packages
    problems = [
        f"{p.relative_to(REPO)}:{use}" for p in files for use in private_ray_uses(p.read_text(encoding="utf-8"), str(p))
    ]
    assert not problems, "private Ray API used (use Ray's public API):\n" + "\n".join(problems)
