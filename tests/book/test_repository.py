"""The repository is one setting (_config.yml's repository.url): the setup cells, the README and pyproject.toml
follow it, a mismatch is caught, and a published page's Colab copy installs posenc at the page's commit."""

from __future__ import annotations

import json
import shutil

import nbformat
import pytest
import yaml

from book.tools import repository
from book.tools.book_files import ROOT, repository_slug, setup_cell_source, toc_notebooks

WRONG_URL = "https://github.com/someone-else/a-fork"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_everything_follows_the_configured_repository():
    assert repository.mismatches() == []


@pytest.fixture
def copy(tmp_path):
    """The files that name the repository, copied."""
    for name in ("_config.yml", "_toc.yml", "README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "book").mkdir()
    shutil.copy(ROOT / "book" / "intro.md", tmp_path / "book" / "intro.md")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns("*checkpoint*"))
    return tmp_path


def set_url(root, url):
    config = yaml.safe_load((root / "_config.yml").read_text())
    config["repository"]["url"] = url
    (root / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_a_changed_url_is_caught_everywhere_then_synced(copy):
    set_url(copy, WRONG_URL)
    found = repository.mismatches(copy)
    notebooks = toc_notebooks(copy)
    assert notebooks
    for path in notebooks:
        assert any(line.startswith(f"{path.relative_to(copy)}: the setup cell") for line in found), found
    assert any(line.startswith("README.md: no install line") for line in found), found
    assert "README.md: names github.com/posenc-book/posenc" in found
    assert any(line.startswith("pyproject.toml: [project.urls]") for line in found), found

    changed = repository.sync(copy)
    assert {"README.md", "pyproject.toml"} <= set(changed)
    assert repository.mismatches(copy) == []
    assert 'pip install "posenc @ git+https://github.com/someone-else/a-fork"' in (copy / "README.md").read_text()
    assert "someone-else/a-fork@main" in "".join(
        repository.first_code_cell(json.loads(notebooks[0].read_text()))["source"]
    )
    assert repository.project_urls(copy)["Homepage"] == "https://someone-else.github.io/a-fork/"
    # sync changed nothing else in a notebook
    for path in notebooks:
        before = json.loads((ROOT / path.relative_to(copy)).read_text())
        after = json.loads(path.read_text())
        first = before["cells"].index(repository.first_code_cell(before))
        before["cells"][first]["source"] = after["cells"][first]["source"]
        assert after == before, path.name


def test_a_wrong_readme_link_alone_is_caught(copy):
    readme = copy / "README.md"
    readme.write_text(readme.read_text() + "\nSee https://github.com/posenc-book/other for more.\n")
    assert repository.mismatches(copy) == ["README.md: names github.com/posenc-book/other"]


# --- the pinned copies a published page opens in Colab ------------------------------------------------------------
def test_pinned_copy_installs_the_pages_commit(tmp_path, monkeypatch):
    """The pinned copies: the committed notebook with only the setup cell changed, to install at the commit."""
    monkeypatch.setattr(repository, "pinned_dir", lambda ref, root=ROOT: tmp_path / ref)
    written = repository.write_pinned_notebooks(COMMIT)
    assert [p.name for p in written] == [p.name for p in toc_notebooks()]
    for source, copy_path in zip(toc_notebooks(), written):
        assert copy_path == tmp_path / COMMIT / source.relative_to(ROOT)
        original, pinned = nbformat.read(source, as_version=4), nbformat.read(copy_path, as_version=4)
        index = next(i for i, c in enumerate(original.cells) if c.cell_type == "code")
        assert pinned.cells[index].source == setup_cell_source(ref=COMMIT)
        assert f"git+https://github.com/{repository_slug()}@{COMMIT}" in pinned.cells[index].source
        pinned.cells[index].source = original.cells[index].source
        assert pinned == original


def test_colab_links_of_a_published_build():
    settings = repository.colab_link_settings(COMMIT)
    assert settings == {"branch": "colab", "path_to_book": COMMIT}
    assert repository.colab_url("notebooks/06_rope", COMMIT) == (
        f"https://colab.research.google.com/github/{repository_slug()}/blob/colab/{COMMIT}/notebooks/06_rope.ipynb"
    )
    assert repository.colab_url("notebooks/06_rope") == (
        f"https://colab.research.google.com/github/{repository_slug()}/blob/main/notebooks/06_rope.ipynb"
    )


@pytest.mark.parametrize("ref", ["main", "v1.0", "abc", "0123456789ABCDEF", "1" * 41, "$(rm -rf /)"])
def test_publish_ref_must_be_a_commit(monkeypatch, ref):
    monkeypatch.setenv(repository.PUBLISH_REF_ENV, ref)
    with pytest.raises(ValueError, match=repository.PUBLISH_REF_ENV):
        repository.publish_ref()


def test_local_builds_are_not_pinned(monkeypatch):
    monkeypatch.delenv(repository.PUBLISH_REF_ENV, raising=False)
    assert repository.publish_ref() is None
    monkeypatch.setenv(repository.PUBLISH_REF_ENV, COMMIT)
    assert repository.publish_ref() == COMMIT
