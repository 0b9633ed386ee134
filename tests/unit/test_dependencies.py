"""Every third-party module the package imports belongs to a runtime dependency pyproject.toml declares:
a fresh `pip install .` must be enough to run every command (httpx once came only through the test
extra and huggingface_hub, and a fresh install could not start)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {"uvloop"}  # imported only when importlib finds it (router/http/serve.py)


def _imported_top_level_modules() -> set[str]:
    modules: set[str] = set()
    for path in (REPO_ROOT / "tgictl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "tgictl"}


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


def test_every_imported_package_is_a_declared_dependency() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    # The extras a feature needs count (the code that imports them says which one to install); `test`'s do not.
    extras = [spec for name, specs in project["optional-dependencies"].items() if name != "test" for spec in specs]
    declared = {_normalise(re.split(r"[<>=!~\[ ;]", spec)[0]) for spec in [*project["dependencies"], *extras]}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module in sorted(_imported_top_level_modules() - OPTIONAL):
        owners = {_normalise(d) for d in distributions.get(module, [])}
        if not owners & declared:
            undeclared[module] = sorted(owners)
    assert undeclared == {}
