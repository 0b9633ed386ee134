"""Fixtures of the reliability suite: one real server (shard + router processes) per module, on the
tiny random llama, configured by the module through `stack_args`; loopback only.

Modules that need the whole process tree (kill a shard, SIGTERM the launcher) use
tests/integration/launch_procs.start_launch instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.http_stack import Stack, http_stack


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    """(router args, shard args) for this module's server; modules override it."""
    return [], []


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    """Extra environment for this module's server processes; modules override it."""
    return {}


@pytest.fixture(scope="module")
def stack(
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    stack_args: tuple[list[str], list[str]],
    stack_env: dict[str, str],
) -> Iterator[Stack]:
    router_args, shard_args = stack_args
    work = tmp_path_factory.mktemp("reliability")
    # Children copy os.environ when they start: set the variables for the start only.
    patch = pytest.MonkeyPatch()
    patch.setenv("OMP_NUM_THREADS", "1")  # shard and router share two cores in CI
    for name, value in stack_env.items():
        patch.setenv(name, value)
    try:
        with http_stack(tiny_model_dir, work, router_args=router_args, shard_args=shard_args) as running:
            patch.undo()
            yield running
    finally:
        patch.undo()
