"""What the book consists of: the notebooks and pages listed in _toc.yml, and their time targets."""

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


def executed_dir(root: Path = ROOT) -> Path:
    return root / "_build" / "executed"


def config(root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text())


def repository_url(root: Path = ROOT) -> str:
    """``https://github.com/owner/name``: _config.yml's ``repository.url``, the one place the repository is named
    (book/tools/repository.py checks and rewrites everything that follows it)."""
    return config(root)["repository"]["url"].rstrip("/").removesuffix(".git")


def repository_slug(root: Path = ROOT) -> str:
    """``owner/name`` of the repository in _config.yml."""
    return repository_url(root).split("github.com/")[-1]


# Each chapter's time target on an idle 2-core machine (seconds), by chapter number. Reported by make book,
# make test and make bench; never enforced. A chapter fails only when it exceeds HANG_GUARD_FACTOR times its
# target: that is a hang guard, not a speed check.
TARGETS = {**{n: 60 for n in range(1, 8)}, 8: 90, 9: 90, 10: 90, 11: 240, 12: 120}
LATER_TARGET = 120  # chapters after 12 and any notebook without a chapter number
HANG_GUARD_FACTOR = 10


def target_seconds(notebook: str | Path) -> int:
    """The time target of a chapter notebook (a path or a name such as ``06_rope``)."""
    stem = Path(str(notebook)).name.removesuffix(".ipynb")
    number = stem.split("_", 1)[0]
    return TARGETS.get(int(number), LATER_TARGET) if number.isdigit() else LATER_TARGET


def hang_guard_seconds(notebook: str | Path) -> int:
    return HANG_GUARD_FACTOR * target_seconds(notebook)


SETUP_CELL_REF = "main"  # what the committed notebooks install; the published pages' copies name their commit


def setup_cell_source(root: Path = ROOT, ref: str = SETUP_CELL_REF) -> str:
    """The first code cell of every notebook: installs posenc in Colab only, from the book's repository at ``ref``
    (a branch, tag or commit; the committed notebooks say ``main``, the copies a published page opens in Colab
    name the commit the page was built from: see book/tools/colab_pin.py).

    It never touches torch, numpy or matplotlib (Colab's own are kept, so no restart is needed).
    """
    slug = repository_slug(root)
    return (
        "# Setup: in Colab, install posenc from the book's repository; elsewhere this cell does nothing.\n"
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    %pip install --quiet "posenc[minilm] @ git+https://github.com/{slug}@{ref}"'
    )
