"""The committed results of the book's make targets: where they live, how they are read, and the machine they record.

Heavy results (chapter 12's long-context perplexities, chapter 13's and 14's trained comparisons) are made by a
``make`` target and committed as JSON under ``posenc/lab/data/`` (:data:`DATA_DIR`), which ships with the package, so a
pip install (as in Colab) has them. :func:`read_json` reads one; each chapter's module checks its fields.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"


def read_json(name: str, path, what: str, remake: str) -> tuple[Path, dict]:
    """``(path, record)`` of the committed file ``name`` in :data:`DATA_DIR`, or of ``path`` when it is not None.

    ``what`` names the result and ``remake`` how to make it again, for the FileNotFoundError a missing file raises;
    a ``path`` that is neither None nor a str or Path raises TypeError.
    """
    if path is not None and not isinstance(path, (str, Path)):
        raise TypeError(f"path must be None or a path, got {type(path).__name__}")
    path = Path(DATA_DIR / name if path is None else path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}: it ships with posenc as posenc/lab/data/{name}; {remake}")
    return path, json.loads(path.read_text())


def cpu_name() -> str:
    """This machine's CPU model (``/proc/cpuinfo``'s "model name"), else ``platform.processor()``, else "unknown"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() or platform.processor() or "unknown"
    except OSError:
        pass
    return platform.processor() or "unknown"


#: Environment variables that move torch's CPU arithmetic off its default path (``make unit-portable`` sets them):
#: a results file made on the default path is then not reproduced bit for bit, even on the same CPU.
ARITHMETIC_OVERRIDES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def default_arithmetic() -> bool:
    """Whether torch's CPU kernels run on their default path here (none of :data:`ARITHMETIC_OVERRIDES` is set)."""
    return not any(os.environ.get(name) for name in ARITHMETIC_OVERRIDES)


def same_platform(record: dict, threads: int = 1) -> bool:
    """Whether a seeded retraining here with ``threads`` threads reproduces the results file ``record`` bit for bit:
    the CPU model and thread count of its ``machine``, the torch of its ``versions`` (what :func:`provenance`
    records) are this machine's, on torch's default CPU arithmetic (:func:`default_arithmetic`). Training on one CPU
    is deterministic; another CPU, torch or arithmetic path may round differently, and training carries that on."""
    if not isinstance(record, dict):
        raise TypeError(f"record must be a results file's dict, got {type(record).__name__}")
    import torch

    machine, versions = record.get("machine") or {}, record.get("versions") or {}
    here = (cpu_name(), threads, torch.__version__)
    return default_arithmetic() and (machine.get("cpu"), machine.get("threads"), versions.get("torch")) == here


def git_commit() -> str:
    """The commit of the checkout posenc runs from (``git rev-parse HEAD``), or "unknown" outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(threads: int, module: str) -> dict:
    """What every results file records about how it was made: ``machine`` (platform, CPU, cores, threads),
    ``versions`` (python, torch, transformers where installed, posenc, git commit), ``date`` (UTC, ISO 8601) and
    ``command`` (``python -m <module>`` with this process's arguments)."""
    import torch

    import posenc

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:
        pass
    versions.update(posenc=posenc.__version__, git_commit=git_commit())
    return {
        "machine": {"platform": platform.platform(), "cpu": cpu_name(), "cores": os.cpu_count(), "threads": threads},
        "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", module, *sys.argv[1:]]),
    }


__all__ = [
    "DATA_DIR",
    "read_json",
    "cpu_name",
    "ARITHMETIC_OVERRIDES",
    "default_arithmetic",
    "same_platform",
    "git_commit",
    "provenance",
]
