"""server.py's thread placement: the shard's torch work, loading included, runs on the device worker's one
thread, so the process holds a single OpenMP pool (servicer.DeviceWorker says why that matters).

Measured in a fresh Python process (pools are per process and never go away): after `_load` and a forward on
the worker, the main thread has no pool yet, which shows as one more thread appearing the first time the main
thread itself runs a parallel region. Had loading run on the main thread, that pool would already exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json, os, sys
import torch
torch.set_num_threads(2)
from tgictl.config import ShardConfig
from tgictl.runtime.shard.servicer import DeviceWorker
from tgictl.runtime.shard.server import _load

def threads():
    return len(os.listdir("/proc/self/task"))

worker = DeviceWorker()
config = ShardConfig(model_id=sys.argv[1], uds_path=__import__("pathlib").Path(sys.argv[2]), dtype="float32")
runtime, _ = worker.call(_load, config, None)
worker.call(runtime.health)  # a real forward on the device thread
worker.call(lambda: torch.ones(1 << 22).mul(2).sum())  # a parallel region there, surely
after_worker = threads()
torch.ones(1 << 22).mul(2).sum()  # the main thread's first parallel region
after_main = threads()
print(json.dumps({"after_worker": after_worker, "after_main": after_main}))
worker.shutdown()
"""


def test_loading_and_steps_leave_the_main_thread_without_an_openmp_pool(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tiny_model_dir), str(tmp_path / "shard")],
        capture_output=True, text=True, timeout=300, check=True, cwd=Path(__file__).resolve().parents[4],
    )
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    # One new OpenMP worker for the main thread's own team of two: none existed before.
    assert counts["after_main"] == counts["after_worker"] + 1, counts
