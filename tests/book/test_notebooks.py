"""The executed-notebook harness: every chapter in _toc.yml runs top to bottom on a fresh kernel, offline.

The selected chapters are executed once per session (two at a time, as `make book` does) by book.tools.run_notebooks;
each test then reports one notebook, naming the failing cell. The executed copies are what the HTML build uses.
"""
from pathlib import Path

import pytest

from book.tools import run_notebooks
from book.tools.book_files import ROOT, toc_notebooks

# execution-time budget per chapter on a 2-core machine, in seconds (from the issues)
BUDGETS = {"08_group_theory": 90, "09_geometry": 90, "10_context_extension": 90, "11_experiments": 240,
           "12_rope_in_a_real_model": 120}
DEFAULT_BUDGET = 60

NOTEBOOKS = [str(p.relative_to(ROOT)) for p in toc_notebooks()]


@pytest.fixture(scope="session")
def executed(request):
    """Executes the notebooks whose tests are selected (all of them, or e.g. one with ``-k 01_why``), at once."""
    selected = [item.callspec.params["notebook"] for item in request.session.items
                if item.originalname == "test_notebook_runs_top_to_bottom"]
    return {record["notebook"]: record for record in run_notebooks.run([Path(n).name for n in selected])}


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(executed, notebook):
    record = executed[notebook]
    assert record["ok"], (f"{notebook}: cell {record['cell']} raised\n--- cell source ---\n{record['source']}\n"
                          f"--- error ---\n{record['error']}")
    budget = BUDGETS.get(notebook.split("/")[-1].removesuffix(".ipynb"), DEFAULT_BUDGET)
    assert record["seconds"] < budget, f"{notebook} took {record['seconds']} s, over its budget of {budget} s"
