"""book.tools.run_notebooks on small throwaway notebooks: a failure names the cell, the first lines of the error
and the log; a chapter fails on time only past its hang guard; a widget view fails a static run; the time table
reports targets and never fails anything."""

from __future__ import annotations

import os
import shutil
import uuid

import nbformat
import pytest

from book.tools import run_notebooks
from book.tools.book_files import ROOT, hang_guard_seconds, target_seconds


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("01_why_position", 60),
        ("07_nd_rope", 60),
        ("08_group_theory", 90),
        ("10_context_extension", 90),
        ("notebooks/11_experiments.ipynb", 240),
        ("12_rope_in_a_real_model", 120),
        ("13_new", 120),
        ("14_other", 120),
        ("intro", 120),
    ],
)
def test_chapter_targets(name, target):
    assert target_seconds(name) == target
    assert hang_guard_seconds(name) == 10 * target


def test_time_table_reports_over_without_failing():
    records = [
        {"notebook": "notebooks/06_rope.ipynb", "seconds": 63.1, "ok": True},
        {"notebook": "notebooks/11_experiments.ipynb", "seconds": 190.0, "ok": True},
    ]
    lines = run_notebooks.time_table(records).splitlines()
    rope = next(line for line in lines if line.startswith("06_rope"))
    experiments = next(line for line in lines if line.startswith("11_experiments"))
    assert rope.split()[1:] == ["63.1", "60", "over"]
    assert experiments.split()[1:] == ["190.0", "240"]
    assert "1 of 2 over target" in lines[-1] and "never enforced" in lines[-1]


@pytest.fixture
def scratch():
    """A folder under the repository root (run_notebooks names notebooks relative to it), removed afterwards."""
    folder = ROOT / "_build" / "test-run-notebooks" / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def notebook(folder, name: str, *sources: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A test")] + [nbformat.v4.new_code_cell(s) for s in sources]
    path = folder / name
    nbformat.write(nb, path)
    return path


@pytest.mark.notebooks
def test_a_failure_names_the_cell_the_error_and_the_log(scratch):
    path = notebook(scratch, "97_fails.ipynb", "x = 1", "assert x == 2, 'x is not two'", "y = 3")
    record = run_notebooks.execute(str(path), 1, str(scratch / "out"))
    assert not record["ok"] and record["cell"] == 2, record  # cell 0 is the markdown heading
    summary = run_notebooks.failure_summary(record)
    assert summary.startswith("97_fails FAILED in cell 2:")
    assert "AssertionError: x is not two" in summary.splitlines()[1]
    assert "\x1b[" not in summary, "terminal colour codes in the message"
    log = scratch / "out" / "logs" / "97_fails.log"
    assert f"full log: {log.relative_to(ROOT)}" in summary
    text = log.read_text()
    assert "assert x == 2" in text and "AssertionError: x is not two" in text


@pytest.mark.notebooks
def test_only_a_hang_fails_on_time(scratch, monkeypatch):
    monkeypatch.setattr(run_notebooks, "hang_guard_seconds", lambda path: 4)
    path = notebook(scratch, "98_hangs.ipynb", "import time", "time.sleep(1)", "time.sleep(600)")
    record = run_notebooks.execute(str(path), 1, str(scratch / "out"))
    assert not record["ok"] and record["cell"] == 3, record
    assert record["error"].startswith("hang guard:"), record["error"]
    assert record["seconds"] < 60


@pytest.mark.notebooks
def test_progress_bars_stay_off_the_page(scratch):
    """tqdm.auto (what transformers uses to dequantise chapter 12's GGUF file) draws no widget in a book kernel."""
    path = notebook(scratch, "96_progress.ipynb", "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)): pass")
    record = run_notebooks.execute(str(path), 1, str(scratch / "out"))
    assert record["ok"], record.get("error")
    executed = nbformat.read(scratch / "out" / path.relative_to(ROOT), as_version=4)
    assert not run_notebooks.widget_views(executed)
    assert not executed.cells[1].outputs, executed.cells[1].outputs  # no text bar either (TQDM_DISABLE)


@pytest.mark.notebooks
def test_a_widget_view_fails_a_static_run(scratch):
    path = notebook(scratch, "99_widget.ipynb", "import ipywidgets\nipywidgets.IntSlider()")
    record = run_notebooks.execute(str(path), 1, str(scratch / "out"))
    assert not record["ok"] and record["cell"] == 1, record
    assert "ipywidgets view" in record["error"]


def test_kernels_are_quiet_and_local():
    env = run_notebooks.kernel_env("static", 1)
    assert env["TQDM_DISABLE"] == "1" and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(run_notebooks.ROOT)  # this checkout's posenc, not another's
    config = run_notebooks.kernel_config()
    if os.name != "nt":
        assert config.KernelManager.transport == "ipc"
