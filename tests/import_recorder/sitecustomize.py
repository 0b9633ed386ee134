"""Loaded at start-up by every Python process that has this folder on PYTHONPATH (the dependency test
puts it there for the processes it starts): at exit, the top-level names of every module the process
imported are written to $TGICTL_IMPORT_RECORD_DIR/<pid>.txt, one per line.

Recording sys.modules at exit, not import attempts, keeps optional imports that failed out of the
record; it catches what libraries import only at run time (transformers' GGUF loader imports
accelerate inside from_pretrained)."""

import atexit
import os
import sys

_RECORD_DIR = os.environ.get("TGICTL_IMPORT_RECORD_DIR")


def _record() -> None:
    names = sorted({name.split(".")[0] for name in list(sys.modules)})
    path = os.path.join(_RECORD_DIR, f"{os.getpid()}.txt")
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(names) + "\n")


if _RECORD_DIR:
    atexit.register(_record)
