"""The guard rails of every commit: ruff (lint and format, pyproject.toml's [tool.ruff]) and mypy on the library
(pyproject.toml's [tool.mypy]), run by ``make test``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = ["posenc", "book", "benchmarks", "tests"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "command", [("ruff", "check", *CODE), ("ruff", "format", "--check", *CODE)], ids=["lint", "format"]
)
def test_ruff(command):
    result = run(*command, "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_on_the_library():
    result = run("mypy", "--no-incremental")
    assert result.returncode == 0, result.stdout + result.stderr
