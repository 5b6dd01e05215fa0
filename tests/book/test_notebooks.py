"""The executed-notebook harness: every chapter in _toc.yml runs top to bottom on a fresh kernel, offline.

The selected chapters are executed once per session (two at a time, as `make book` does) by book.tools.run_notebooks,
which prints one line per chapter as it finishes; each test then reports one notebook, naming the failing cell and
the log with the full error. Time is not a test: each chapter's time against its target is printed as a table at
the end of the session (tests/book/conftest.py), and a chapter fails on time only past its hang guard, ten times its
target (a stuck kernel). The executed copies are what the HTML build uses.
"""

from pathlib import Path

import pytest

from book.tools import run_notebooks
from book.tools.book_files import ROOT, toc_notebooks

NOTEBOOKS = [str(p.relative_to(ROOT)) for p in toc_notebooks()]


@pytest.fixture(scope="session")
def executed(request, chapter_records):
    """Executes the notebooks whose tests are selected (all of them, or e.g. one with ``-k 01_why``), at once,
    printing each chapter's line as it finishes (pytest's capture is suspended meanwhile)."""
    selected = [
        item.callspec.params["notebook"]
        for item in request.session.items
        if item.originalname == "test_notebook_runs_top_to_bottom"
    ]
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print()
        records = run_notebooks.run([Path(n).name for n in selected])
    chapter_records.extend(records)
    return {record["notebook"]: record for record in records}


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(executed, notebook):
    record = executed[notebook]
    assert record["ok"], run_notebooks.failure_summary(record)
