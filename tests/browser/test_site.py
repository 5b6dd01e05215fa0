"""The site as a whole: the bare address a reader types, and no ipywidgets view anywhere a page comes from."""

from __future__ import annotations

import json

import pytest
from browser_support import HTML_DIR, book_pages

from book.tools.book_files import ROOT, executed_dir

pytestmark = pytest.mark.browser
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_the_bare_address_opens_the_book(open_page, base_url):
    """http://127.0.0.1:PORT/ as typed: the redirect page declares the icon (no request for a missing
    /favicon.ico), leads to the front page, and nothing logs an error or fails on the way."""
    page, traffic = open_page(base_url)
    front = book_pages()[0].html
    page.wait_for_url(f"**/{front}", timeout=30_000)
    page.wait_for_load_state("load")
    page.wait_for_timeout(500)  # a late favicon request would land here
    assert not traffic.problems(), traffic.problems()
    root = (HTML_DIR / "index.html").read_text()
    assert 'rel="icon"' in root, "the root redirect page declares no icon"
    for name in ("favicon.svg", "favicon.ico"):
        response = page.request.get(base_url + name)
        assert response.ok, f"{base_url}{name}: HTTP {response.status}"


def widget_views(notebook) -> list[int]:
    cells = json.loads(notebook.read_text())["cells"]
    return [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        and any(WIDGET_VIEW in output.get("data", {}) for output in cell.get("outputs", []))
    ]


def test_no_widget_view_in_a_built_page_or_its_notebook(site):
    """A widget view (e.g. a progress bar saved by tqdm) is dead on a static page: it needs a kernel."""
    found = [f"{path.relative_to(site)}" for path in site.rglob("*.html") if WIDGET_VIEW in path.read_text()]
    for page in book_pages():
        if not page.is_notebook:
            continue
        for notebook in (executed_dir() / f"{page.entry}.ipynb", site / "_sources" / f"{page.entry}.ipynb"):
            if notebook.exists() and widget_views(notebook):
                found.append(f"{notebook.relative_to(ROOT)} cells {widget_views(notebook)}")
    assert not found, f"ipywidgets views ({WIDGET_VIEW}) in: {found}"


def test_the_api_reference_is_in_the_index_and_the_inventory(site):
    """Every name of posenc.__all__ is a cross-reference target as posenc.<name> (objects.inv, for other projects'
    intersphinx) and in the general index, beside its home module's entry."""
    import posixpath

    from sphinx.util.inventory import InventoryFile

    import posenc

    with open(site / "objects.inv", "rb") as stream:
        inventory = InventoryFile.load(stream, "", posixpath.join)
    targets = {name for entries in inventory.values() for name in entries}
    missing = [name for name in posenc.__all__ if f"posenc.{name}" not in targets]
    assert not missing, f"objects.inv lacks posenc.{missing}"
    assert "posenc.rope.RotaryEmbedding.forward" in targets
    genindex = (site / "genindex.html").read_text()
    for entry in ('book/api/rope.html#posenc.rope.rotate"', "RotaryEmbedding (class in posenc.rope)"):
        assert entry in genindex, f"genindex.html lacks {entry!r}"
