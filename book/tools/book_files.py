"""What the book consists of: the notebooks and pages listed in _toc.yml, and the execution settings."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def toc_entries(root: Path = ROOT) -> list[str]:
    """Every ``file:`` of _toc.yml (without suffix), in reading order, the root page first."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                entries.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({key: value for key, value in toc.items() if key != "root"})
    return entries


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks of _toc.yml, as paths under ``root``."""
    return [root / f"{entry}.ipynb" for entry in toc_entries(root) if (root / f"{entry}.ipynb").exists()]


def execution_settings(root: Path = ROOT) -> dict:
    config = yaml.safe_load((root / "_config.yml").read_text())
    return config.get("execute", {})


def executed_dir(root: Path = ROOT) -> Path:
    return root / "_build" / "executed"


def repository_slug(root: Path = ROOT) -> str:
    """``owner/name`` of the repository in _config.yml."""
    url = yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    return url.split("github.com/")[-1].removesuffix(".git")


def setup_cell_source(root: Path = ROOT) -> str:
    """The first code cell of every notebook: installs posenc in Colab only, from the book's repository.

    It never touches torch, numpy or matplotlib (Colab's own are kept, so no restart is needed).
    """
    slug = repository_slug(root)
    return (
        "# Setup: in Colab, install posenc from the book's repository; elsewhere this cell does nothing.\n"
        "import sys\n"
        "if \"google.colab\" in sys.modules:\n"
        f"    %pip install --quiet \"posenc[minilm] @ git+https://github.com/{slug}@main\""
    )
