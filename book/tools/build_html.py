"""Build the HTML book from the executed notebooks, with ``-n -W --keep-going``.

The notebooks are executed once, by run_notebooks.py (in parallel, failures named by notebook and cell);
this script stages the executed copies beside _config.yml, _toc.yml and book/, turns build-time execution
off in the staged config only, and builds into _build/html (MathJax included, from the PyPI package
sphinx-mathjax-offline). Then make_offline.py checks that the site loads nothing from the network.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from book_files import ROOT, executed_dir, toc_entries  # noqa: E402

STAGE = ROOT / "_build" / "stage"


def present_toc() -> dict:
    """_toc.yml without entries whose file does not exist yet (tests/test_book.py fails on those)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for part in toc.get("parts", []):
        part["chapters"] = [c for c in part["chapters"]
                            if any((ROOT / f"{c['file']}{suffix}").exists() for suffix in (".ipynb", ".md"))]
    toc["parts"] = [part for part in toc.get("parts", []) if part["chapters"]]
    return toc


def stage() -> Path:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    STAGE.mkdir(parents=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config.setdefault("execute", {})["execute_notebooks"] = "off"
    (STAGE / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (STAGE / "_toc.yml").write_text(yaml.safe_dump(present_toc(), sort_keys=False))
    shutil.copytree(ROOT / "book", STAGE / "book", ignore=shutil.ignore_patterns("tools", "__pycache__"))
    missing = []
    for entry in toc_entries():
        source = ROOT / f"{entry}.ipynb"
        if not source.exists():
            continue
        executed = executed_dir() / f"{entry}.ipynb"
        if not executed.exists() or executed.stat().st_mtime < source.stat().st_mtime:
            missing.append(entry)
            continue
        (STAGE / entry).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(executed, STAGE / f"{entry}.ipynb")
    if missing:
        raise SystemExit(
            f"no up-to-date executed copy of {missing}: run book/tools/run_notebooks.py (make book does) first"
        )
    return STAGE


def build() -> int:
    stage()
    command = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(STAGE), "--path-output", str(ROOT),
               "--all", "-n", "-W", "--keep-going"]
    print("+", " ".join(command), flush=True)
    result = subprocess.run(command, cwd=ROOT)
    if result.returncode:
        return result.returncode
    offline = Path(__file__).resolve().parent / "make_offline.py"
    if offline.exists():
        return subprocess.run([sys.executable, str(offline)], cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(build())
