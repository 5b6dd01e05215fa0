"""Create a chapter notebook with the standard first cells: ``new_chapter.py notebooks/12_name.ipynb "Title"``.

Add the file to _toc.yml afterwards (see README.md, "Adding a chapter").
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from book_files import setup_cell_source  # noqa: E402


def new_chapter(path: Path, title: str) -> None:
    if path.exists():
        raise SystemExit(f"{path} exists already")
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat this chapter shows, in two sentences."),
        nbformat.v4.new_code_cell(setup_cell_source()),
        nbformat.v4.new_code_cell("import torch\nimport posenc\n\n_ = torch.manual_seed(0)"),
    ]
    nbformat.write(nb, path)


if __name__ == "__main__":
    new_chapter(Path(sys.argv[1]), sys.argv[2])
