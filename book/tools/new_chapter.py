"""Create a chapter notebook with the standard first cells.

Usage, from the repository root: ``python -m book.tools.new_chapter notebooks/13_name.ipynb "Title"``.
Add the file to _toc.yml afterwards (see README.md, "Adding a chapter").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat

from book.tools.book_files import setup_cell_source


def new_chapter(path: Path, title: str) -> None:
    if path.exists():
        raise SystemExit(f"{path} exists already")
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(
        {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        }
    )
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}\n\nWhat this chapter shows, in two sentences."),
        nbformat.v4.new_code_cell(setup_cell_source()),
        nbformat.v4.new_code_cell("import torch\nimport posenc\n\n_ = torch.manual_seed(0)"),
    ]
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m book.tools.new_chapter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, help="the new notebook, e.g. notebooks/13_my_topic.ipynb")
    parser.add_argument("title", help="the chapter's title (its first heading)")
    args = parser.parse_args(argv)
    new_chapter(args.path, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
