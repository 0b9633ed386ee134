"""Recording what processes import (see sitecustomize.py in this folder)."""

from __future__ import annotations

import os
from pathlib import Path

RECORDER_DIR = Path(__file__).resolve().parent
REPO_ROOT = RECORDER_DIR.parents[1]


def recorded_imports_env(record_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment (a copy of `base`, default os.environ) whose Python processes write the
    modules they imported into `record_dir` at exit."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RECORDER_DIR), str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TGICTL_IMPORT_RECORD_DIR"] = str(record_dir)
    return env
