"""The book's structure: the table of contents, committed notebooks, the bibliography."""
import json
import re

from book.tools.book_files import ROOT, toc_entries


def test_every_toc_entry_exists():
    missing = [e for e in toc_entries() if not any((ROOT / f"{e}{s}").exists() for s in (".ipynb", ".md"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc():
    listed = set(toc_entries())
    stray = [p.name for p in (ROOT / "notebooks").glob("*.ipynb") if f"notebooks/{p.stem}" not in listed]
    assert not stray, f"notebooks missing from _toc.yml: {stray}"


def test_notebooks_are_committed_without_outputs():
    dirty = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
                dirty.append(f"{path.name} cell {index}")
    assert not dirty, f"strip outputs and execution counts from: {dirty}"


def test_every_citation_is_in_the_bibliography():
    keys = set(re.findall(r"@\w+\{([^,]+),", (ROOT / "book" / "references.bib").read_text()))
    sources = list((ROOT / "notebooks").glob("*.ipynb")) + list((ROOT / "book").glob("*.md"))
    cited = set()
    for path in sources:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", path.read_text()):
            cited.update(key.strip() for key in group.split(","))
    assert cited and not cited - keys, f"cited but not in references.bib: {sorted(cited - keys)}"
