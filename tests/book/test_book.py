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


def public_modules() -> list[str]:
    """The library's modules as posenc's docstring lists them (``posenc.lab``, the book's plumbing, left out)."""
    import posenc

    return list(dict.fromkeys(m for m in re.findall(r":mod:`posenc\.(\w+)`", posenc.__doc__) if m != "lab"))


def test_every_public_module_has_an_api_page_in_the_toc():
    import posenc

    listed = set(toc_entries())
    assert len(public_modules()) >= 17
    for module in public_modules():
        assert hasattr(posenc, module), f"posenc's docstring lists posenc.{module}, which `import posenc` lacks"
        page = ROOT / "book" / "api" / f"{module}.md"
        assert page.exists() and f".. automodule:: posenc.{module}\n" in page.read_text(), (
            f"{page.relative_to(ROOT)} must document posenc.{module} with automodule"
        )
        assert f"book/api/{module}" in listed, f"book/api/{module} is not in _toc.yml"
    assert "book/api/index" in listed


def test_the_api_index_lists_every_public_name_at_its_home():
    import posenc

    index = (ROOT / "book" / "api" / "index.md").read_text()
    listed = {name: module for module, name in re.findall(r"^   ~posenc\.(\w+)\.(\w+)$", index, flags=re.M)}
    assert set(listed) == set(posenc.__all__), (
        f"missing {set(posenc.__all__) - set(listed)}, not public {set(listed) - set(posenc.__all__)}"
    )
    for name, module in listed.items():
        assert getattr(getattr(posenc, module), name) is getattr(posenc, name), (
            f"posenc.{name} is not posenc.{module}.{name}"
        )
    modules = re.findall(r"^   posenc\.(\w+)$", index, flags=re.M)
    assert modules == public_modules()
