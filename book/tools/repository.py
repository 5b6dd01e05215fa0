"""The book's repository is one setting, _config.yml's ``repository.url``; this checks and rewrites what follows it.

What follows it: the Colab setup cell of every notebook (book_files.setup_cell_source), the README's install lines
and links, and pyproject.toml's ``[project.urls]``. tests/book/test_repository.py fails when one of them names
another repository. After changing the URL (e.g. in a fork), rewrite them all with
``python -m book.tools.repository sync``; ``python -m book.tools.repository check`` lists what disagrees.

Published pages pin the library: a page built with ``POSENC_PUBLISH_REF=<commit>`` (the Pages workflow sets it)
opens in Colab a copy of its notebook whose setup cell installs posenc at that commit, not at ``main``.
:func:`write_pinned_notebooks` writes those copies to ``_build/colab/<commit>/notebooks/``; the workflow commits them
to the repository's ``colab`` branch, and the page's Colab link opens
``github/<owner>/<name>/blob/colab/<commit>/notebooks/<chapter>.ipynb``. Older pages keep their own folder there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from book.tools.book_files import ROOT, repository_slug, repository_url, setup_cell_source, toc_notebooks

PIN_BRANCH = "colab"  # the branch that holds each published commit's pinned notebooks, one folder per commit
PUBLISH_REF_ENV = "POSENC_PUBLISH_REF"
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
GITHUB_REPO = re.compile(r"github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?=\.git\b|[/@\"'`)\s#]|$)")
PAGES_REPO = re.compile(r"https://([A-Za-z0-9-]+)\.github\.io/([A-Za-z0-9_.-]+)")


def pages_url(root: Path = ROOT) -> str:
    """Where GitHub Pages serves the book of the configured repository."""
    owner, name = repository_slug(root).split("/")
    return f"https://{owner.lower()}.github.io/{name}/"


def project_urls(root: Path = ROOT) -> dict:
    url = repository_url(root)
    return {"Homepage": pages_url(root), "Repository": url, "Issues": f"{url}/issues"}


def first_code_cell(notebook: dict) -> dict | None:
    return next((cell for cell in notebook["cells"] if cell["cell_type"] == "code"), None)


def mismatches(root: Path = ROOT) -> list[str]:
    """Everything that names another repository than _config.yml's ``repository.url``."""
    slug, found = repository_slug(root), []
    for path in toc_notebooks(root):
        cell = first_code_cell(json.loads(path.read_text(encoding="utf-8")))
        if cell is None or "".join(cell["source"]) != setup_cell_source(root):
            found.append(f"{path.relative_to(root)}: the setup cell is not book_files.setup_cell_source()")
    readme = (root / "README.md").read_text(encoding="utf-8")
    if not re.search(rf'pip install "posenc(\[[\w,]+\])? @ git\+https://github\.com/{re.escape(slug)}[@"]', readme):
        found.append(f'README.md: no install line `pip install "posenc @ git+https://github.com/{slug}"`')
    found += [f"README.md: names github.com/{other}" for other in sorted(set(GITHUB_REPO.findall(readme)) - {slug})]
    found += [
        f"README.md: names {m.group(0)}" for m in PAGES_REPO.finditer(readme) if m.group(0) + "/" != pages_url(root)
    ]
    urls = _pyproject_urls(root)
    if urls != project_urls(root):
        found.append(f"pyproject.toml: [project.urls] is {urls}, expected {project_urls(root)}")
    return found


def _pyproject_urls(root: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"].get("urls", {})


def sync(root: Path = ROOT) -> list[str]:
    """Rewrite the setup cells, the README's repository names and ``[project.urls]`` from _config.yml; return
    the files changed."""
    import nbformat

    slug, changed = repository_slug(root), []
    for path in toc_notebooks(root):
        nb = nbformat.read(path, as_version=4)
        cell = next((c for c in nb.cells if c.cell_type == "code"), None)
        if cell is not None and cell.source != setup_cell_source(root):
            cell.source = setup_cell_source(root)
            nbformat.write(nb, path)
            changed.append(str(path.relative_to(root)))
    readme_path = root / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    owner, name = slug.split("/")
    new = GITHUB_REPO.sub(f"github.com/{slug}", readme)
    new = PAGES_REPO.sub(f"https://{owner.lower()}.github.io/{name}", new)
    if new != readme:
        readme_path.write_text(new, encoding="utf-8")
        changed.append("README.md")
    pyproject_path = root / "pyproject.toml"
    pyproject = pyproject_path.read_text(encoding="utf-8")
    table = "[project.urls]\n" + "".join(f'{key} = "{value}"\n' for key, value in project_urls(root).items())
    if re.search(r"^\[project\.urls\]\n(?:[^\[\n].*\n)*", pyproject, re.MULTILINE):
        new = re.sub(r"^\[project\.urls\]\n(?:[^\[\n].*\n)*", table, pyproject, count=1, flags=re.MULTILINE)
    else:
        new = pyproject.replace("\n[project.optional-dependencies]", f"\n{table}\n[project.optional-dependencies]", 1)
    if new != pyproject:
        pyproject_path.write_text(new, encoding="utf-8")
        changed.append("pyproject.toml")
    return changed


# ------------------------------------------------------------------------------------------ pinned Colab copies
def publish_ref() -> str | None:
    """The commit a published build pins (``POSENC_PUBLISH_REF``), or None for a local build (links to ``main``)."""
    import os

    ref = os.environ.get(PUBLISH_REF_ENV, "").strip()
    if ref and not COMMIT.match(ref):
        raise ValueError(f"{PUBLISH_REF_ENV} must be a commit hash (7-40 lowercase hex digits), got {ref!r}")
    return ref or None


def pin_notebook(nb, ref: str, root: Path = ROOT):
    """``nb`` (an nbformat notebook, changed in place) with its setup cell installing posenc at ``ref``."""
    cell = next((c for c in nb.cells if c.cell_type == "code"), None)
    if cell is None or cell.source != setup_cell_source(root):
        raise ValueError("the notebook's first code cell is not the standard setup cell (book_files.setup_cell_source)")
    cell.source = setup_cell_source(root, ref=ref)
    return nb


def pinned_dir(ref: str, root: Path = ROOT) -> Path:
    """Where the pinned copies of commit ``ref`` are written; the workflow commits ``_build/colab/*`` to PIN_BRANCH."""
    return root / "_build" / PIN_BRANCH / ref


def write_pinned_notebooks(ref: str, root: Path = ROOT) -> list[Path]:
    """The committed (stripped) notebooks, each with its setup cell pinned to ``ref``, under pinned_dir(ref)."""
    import nbformat

    written = []
    for path in toc_notebooks(root):
        target = pinned_dir(ref, root) / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(pin_notebook(nbformat.read(path, as_version=4), ref, root), target)
        written.append(target)
    return written


def colab_link_settings(ref: str) -> dict:
    """The staged _config.yml's repository settings that make every page's Colab link open the pinned copy:
    the theme links to ``blob/<branch>/<path_to_book>/<page>.ipynb``."""
    return {"branch": PIN_BRANCH, "path_to_book": ref}


def colab_url(entry: str, ref: str | None = None, root: Path = ROOT) -> str:
    """The Colab link of page ``entry`` (e.g. ``notebooks/06_rope``): the pinned copy, or ``main``'s notebook."""
    where = f"{PIN_BRANCH}/{ref}" if ref else "main"
    return f"https://colab.research.google.com/github/{repository_slug(root)}/blob/{where}/{entry}.ipynb"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m book.tools.repository",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=("check", "sync"))
    args = parser.parse_args(argv)
    if args.command == "sync":
        changed = sync()
        print("rewrote " + ", ".join(changed) if changed else f"everything already follows {repository_url()}")
    found = mismatches()
    for line in found:
        print(line, file=sys.stderr)
    if not found:
        print(f"everything follows _config.yml's repository.url: {repository_url()}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
