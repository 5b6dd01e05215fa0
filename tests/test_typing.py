"""Types a checker can use: ``mypy --strict`` on a user's script and on the README's examples.

The user's script (tests/typing/api_use.py) asserts the result types of the public calls the README makes; the
README's Python blocks are checked as written. Errors inside posenc are not the user's: imports are followed
silently (``--follow-imports=silent``), as for any installed package that ships ``py.typed``. The checkout's posenc
comes first on the path (MYPYPATH), whatever the environment's editable install points at. Not a speed test: the
first run takes a minute or more (torch's stubs); the cache in _build/mypy_cache makes later runs quick.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_SCRIPT = ROOT / "tests" / "typing" / "api_use.py"

pytest.importorskip("mypy", reason="mypy is in requirements.txt; this environment lacks it")


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert readme_blocks()


def test_mypy_strict_accepts_the_readme_examples_and_the_user_script(tmp_path):
    files = [USER_SCRIPT]
    for index, block in enumerate(readme_blocks()):
        files.append(tmp_path / f"readme_example_{index + 1}.py")
        files[-1].write_text(block)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-error-summary",
            "--cache-dir",
            str(ROOT / "_build" / "mypy_cache"),
            *map(str, files),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"mypy --strict:\n{result.stdout}{result.stderr}"
