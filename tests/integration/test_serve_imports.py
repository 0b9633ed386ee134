"""What the serve path imports at run time is what a plain `pip install .` brings.

tests/unit/test_dependencies.py reads tgictl's own import statements; libraries import more at run time
(transformers' GGUF loader needs accelerate only inside from_pretrained, and accelerate once came only
with the test extra, so a new user's first `tgictl launch` died converting the default model). Here the
processes of the serve path record every module they imported (tests/import_recorder): the default
model's conversion (the smollm2_dir fixture runs it) and a launch that answers both APIs. Each module
must belong to a distribution in the closure of tgictl's runtime requirements, extras excluded.
"""

from __future__ import annotations

import importlib.metadata
import re
import signal
import sys
from pathlib import Path

import httpx
import tomllib
from packaging.requirements import Requirement

from tests.import_recorder import REPO_ROOT, recorded_imports_env
from tests.integration.launch_procs import start_launch

# Imported only when installed, and fine without (checked in each library's source): the test extra
# brings them here, a plain install does not.
OPTIONAL_WHEN_INSTALLED = {
    "grpc_tools": "grpc/__init__.py imports its optional extension packages when present",
    "grpc_health": "grpc/__init__.py, as grpc_tools (smg in the test extra brings grpcio-health-checking)",
    "grpc_reflection": "grpc/__init__.py, as grpc_tools",
    "sniffio": "anyio and httpcore: try: import sniffio / except ImportError",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> set[str]:
    """Normalised names of every distribution `pip install .` installs: pyproject's dependencies
    (no extras), then each one's own requirements whose markers hold without an extra, recursively."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(spec) for spec in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normalise(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here, so nothing here imported it either
        extras = requirement.extras
        for spec in requires:
            child = Requirement(spec)
            marker = child.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras) or marker.evaluate({"extra": ""}):
                todo.append(Requirement(child.name))
    return seen


def recorded_modules(record_dir: Path) -> set[str]:
    modules: set[str] = set()
    for path in record_dir.glob("*.txt"):
        modules |= set(path.read_text().split())
    return modules


def undeclared(modules: set[str]) -> dict[str, list[str]]:
    """Imported third-party modules whose distributions a plain install would not bring."""
    closure = runtime_closure()
    owners = importlib.metadata.packages_distributions()
    missing: dict[str, list[str]] = {}
    for module in sorted(modules):
        if module in sys.stdlib_module_names or module in ("tgictl", "sitecustomize", "__main__"):
            continue
        if module in OPTIONAL_WHEN_INSTALLED:
            continue
        distributions = sorted({_normalise(d) for d in owners.get(module, [])})
        if distributions and not set(distributions) & closure:
            missing[module] = distributions
    return missing


def test_the_closure_excludes_the_test_extra() -> None:
    """The check can fail: pytest and openai are installed here, only through the test extra."""
    closure = runtime_closure()
    assert {"torch", "transformers", "fastapi", "accelerate", "numpy"} <= closure
    assert "pytest" not in closure and "openai" not in closure
    assert undeclared({"pytest", "openai", "torch"}) == {"pytest": ["pytest"], "openai": ["openai"]}


def test_the_serve_path_imports_only_runtime_dependencies(
    smollm2_dir: Path, serve_path_imports: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # smollm2_dir converted the packaged GGUF in a recorded process; now serve as the quickstart does.
    launch = start_launch(tiny_model_dir, tmp_path, extra_env=recorded_imports_env(serve_path_imports, {}))
    try:
        with httpx.Client(timeout=60) as client:
            launch.wait_healthy(client)
            generate = client.post(f"{launch.url}/generate", json={"inputs": "hello", "parameters": {"max_new_tokens": 4}})
            assert generate.status_code == 200, generate.text
            chat = client.post(
                f"{launch.url}/v1/chat/completions",
                json={"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
            )
            assert chat.status_code == 200, chat.text
        launch.proc.send_signal(signal.SIGTERM)
        assert launch.wait_exit(60) == 0, launch.log()
    finally:
        launch.stop()
    records = list(serve_path_imports.glob("*.txt"))
    assert len(records) >= 4, f"expected conversion, launcher, shard and router records, got {records}"
    modules = recorded_modules(serve_path_imports)
    assert {"accelerate", "uvicorn", "grpc", "torch"} <= modules  # the record is real
    assert undeclared(modules) == {}
