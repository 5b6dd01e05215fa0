"""Colab readiness: each notebook's setup cell installs posenc from the book's repository in Colab only, never
touches the torch, numpy and matplotlib Colab ships (no restart), and the live widgets work with ipywidgets 7.

The tests marked ``colab`` run inside .venv-colab, the package versions Colab ships (``make colab-check`` sets
POSENC_COLAB_CHECK=1; elsewhere they skip). There they fail, not skip, when the environment is wrong.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import types
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from book.tools.book_files import ROOT, repository_slug, setup_cell_source, toc_notebooks

COLAB_KEPT = ("torch", "numpy", "matplotlib")  # Colab's own; replacing them needs a runtime restart
FORBIDDEN_PIP_OPTIONS = {"-U", "--upgrade", "--force-reinstall", "-I", "--ignore-installed", "--upgrade-strategy"}
COLAB_EXECUTED = ROOT / "_build" / "colab-executed"
NOTEBOOKS = toc_notebooks()
IN_COLAB_CHECK = os.environ.get("POSENC_COLAB_CHECK") == "1"
colab = pytest.mark.skipif(not IN_COLAB_CHECK, reason="runs in .venv-colab: make colab-check")


def colab_pins() -> dict[str, str]:
    """name -> version pinned by the Makefile's COLAB_PACKAGES (Colab's versions, and what the notebooks need
    besides): the one place they are set."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = re.search(r"^COLAB_PACKAGES\s*:=(.*)$", makefile, re.MULTILINE)
    assert line, "the Makefile has no COLAB_PACKAGES"
    return dict(item.split("==") for item in line.group(1).split() if "==" in item)


def pip_magics(source: str) -> list[tuple[str, str | None]]:
    """Each ``%pip`` line of a cell as (arguments, the test of the ``if`` around it or None)."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    found = []

    def visit(node, guard):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run_line_magic"
            and ast.literal_eval(node.args[0]) == "pip"
        ):
            found.append((ast.literal_eval(node.args[1]), guard))
        for child in ast.iter_child_nodes(node):
            visit(child, ast.unparse(node.test) if isinstance(node, ast.If) else guard)

    visit(tree, None)
    return found


PINNED = "0123456789abcdef0123456789abcdef01234567"  # a commit, as a published page's Colab copy names it


def setup_requirement(ref: str = "main") -> tuple[Requirement, list[str]]:
    """The one requirement the setup cell installs, and the pip options it passes."""
    ((arguments, _guard),) = pip_magics(setup_cell_source(ref=ref))
    words = shlex.split(arguments)
    assert words[0] == "install", words
    options = [w for w in words[1:] if w.startswith("-")]
    (requirement,) = [w for w in words[1:] if not w.startswith("-")]
    return Requirement(requirement), options


def test_the_book_has_notebooks():
    assert NOTEBOOKS, "no notebook listed in _toc.yml exists"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_is_the_setup_cell(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    first_code = next(("".join(c["source"]) for c in cells if c["cell_type"] == "code"), None)
    assert first_code == setup_cell_source(), (
        f"{notebook.name}: the first code cell must be book_files.setup_cell_source() exactly:\n"
        f"{setup_cell_source()}\n--- found ---\n{first_code}"
    )


def test_setup_cell_installs_posenc_from_the_configured_repository():
    requirement, options = setup_requirement()
    assert requirement.name == "posenc"
    assert requirement.url == f"git+https://github.com/{repository_slug()}@main", requirement.url
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert requirement.extras <= set(extras), f"unknown extras {requirement.extras - set(extras)}"
    assert not FORBIDDEN_PIP_OPTIONS & {o.split("=")[0] for o in options}, f"pip options that reinstall: {options}"


def test_pinned_setup_cell_installs_posenc_at_the_commit():
    """The copy a published page opens in Colab (book/tools/repository.py) installs the page's commit."""
    requirement, options = setup_requirement(PINNED)
    main, main_options = setup_requirement()
    assert requirement.url == f"git+https://github.com/{repository_slug()}@{PINNED}", requirement.url
    assert (requirement.name, requirement.extras, options) == (main.name, main.extras, main_options)
    assert setup_cell_source(ref=PINNED).replace(PINNED, "main") == setup_cell_source()


@pytest.mark.parametrize("ref", ["main", PINNED])
def test_setup_cell_installs_only_inside_the_colab_guard(ref):
    magics = pip_magics(setup_cell_source(ref=ref))
    assert len(magics) == 1, magics
    assert magics[0][1] == "'google.colab' in sys.modules", f"pip runs under {magics[0][1]!r}"


@pytest.mark.parametrize("ref", ["main", PINNED])
@pytest.mark.parametrize("in_colab", [False, True], ids=["elsewhere", "colab"])
def test_setup_cell_runs_pip_only_in_colab(monkeypatch, in_colab, ref):
    from IPython.core.inputtransformer2 import TransformerManager

    calls = []
    shell = types.SimpleNamespace(run_line_magic=lambda name, line: calls.append((name, line)))
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(TransformerManager().transform_cell(setup_cell_source(ref=ref)), {"get_ipython": lambda: shell})
    expected_line = f'install --quiet "posenc[minilm] @ git+https://github.com/{repository_slug()}@{ref}"'
    assert calls == ([("pip", expected_line)] if in_colab else [])


def test_posenc_requirements_accept_the_colab_packages():
    """posenc (with the setup cell's extras) asks nothing of torch/numpy/matplotlib that Colab's do not meet."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirement, _ = setup_requirement()
    wanted = list(project["dependencies"])
    for extra in requirement.extras:
        wanted += project["optional-dependencies"][extra]
    pins = colab_pins()
    for line in wanted:
        dependency = Requirement(line)
        if dependency.name not in COLAB_KEPT:
            continue
        operators = {spec.operator for spec in dependency.specifier}
        assert operators <= {">=", ">", "!="}, f"{line}: only lower bounds, or a newer Colab would be downgraded"
        assert dependency.specifier.contains(pins[dependency.name]), f"{line} rejects Colab's {pins[dependency.name]}"


def test_colab_pins_cover_the_issue():
    pins = colab_pins()
    assert {k: pins.get(k) for k in ("ipywidgets", "matplotlib", "transformers")} == {
        "ipywidgets": "7.7.1",
        "matplotlib": "3.10.0",
        "transformers": "5.15.0",
    }
    assert pins.get("torch") == "2.13.0", "torch must stay pinned to the CPU wheel on disk"


# --- inside .venv-colab (make colab-check) -----------------------------------------------------------------------
@colab
def test_environment_has_the_colab_versions():
    pins = colab_pins()
    installed = {name: metadata.version(name) for name in pins}
    wrong = {
        name: version for name, version in installed.items() if not SpecifierSet(f"=={pins[name]}").contains(version)
    }
    assert not wrong, f"installed {wrong}, make colab-check pins {pins}"
    assert Path(sys.prefix).resolve() == (ROOT / ".venv-colab").resolve(), f"running in {sys.prefix}"
    assert Path(metadata.distribution("posenc").locate_file("")).exists()


@colab
def test_notebook_kernel_is_this_environment():
    from jupyter_client.kernelspec import KernelSpecManager

    argv = KernelSpecManager().get_kernel_spec("python3").argv
    # jupyter_client runs a bare "python"/"python3" as sys.executable
    if argv[0] not in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        assert Path(argv[0]).resolve().is_relative_to(Path(sys.prefix).resolve()), (
            f"the python3 kernel runs {argv[0]}, not this venv's python: notebooks would not see Colab's versions"
        )


@colab
def test_installing_posenc_keeps_colab_packages(tmp_path):
    """pip, asked for posenc with the setup cell's extras over Colab's packages, would change none of them."""
    requirement, options = setup_requirement()
    local = f"posenc[{','.join(sorted(requirement.extras))}] @ {ROOT.as_uri()}"
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", *options, "--report", str(report), local],
        check=True,
        timeout=600,
    )
    installs = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    touched = {name: version for name, version in installs.items() if name in COLAB_KEPT}
    assert not touched, f"installing posenc in Colab would replace {touched}: Colab would need a restart"


@colab
def test_pip_installs_posenc_at_a_commit(tmp_path):
    """What a pinned setup cell asks of pip: posenc from a git repository at one commit (here this repository's
    HEAD, through file://, as Colab fetches the page's commit from GitHub), without touching Colab's packages."""
    requirement, options = setup_requirement(PINNED)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    local = f"posenc[{','.join(sorted(requirement.extras))}] @ git+{ROOT.as_uri()}@{commit}"
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", *options, "--report", str(report), local],
        check=True,
        timeout=600,
    )
    installs = {item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]}
    assert installs["posenc"]["download_info"]["vcs_info"]["commit_id"] == commit
    touched = sorted(name for name in installs if name in COLAB_KEPT)
    assert not touched, f"installing posenc at a commit in Colab would replace {touched}"


def shows_image(output: dict) -> bool:
    """A display output that a browser shows as a picture: a PNG, or HTML with an embedded PNG."""
    data = output.get("data", {})
    return "image/png" in data or "data:image/png;base64," in "".join(data.get("text/html", ""))


def picture(view):
    """The PNG bytes a live view shows now: an ``Image`` child's value, or an ``Output`` child's last PNG."""
    import base64

    for child in view.children:
        if type(child).__name__ == "Image" and child.value:
            return bytes(child.value)
        if type(child).__name__ == "Output":
            pngs = [o["data"]["image/png"] for o in child.outputs if "image/png" in o.get("data", {})]
            if pngs:
                return base64.b64decode(pngs[-1])
    return None


LIVE_WIDGET_CELLS = [
    inspect.getsource(picture),
    """
    import posenc.lab.interactive as interactive
    from IPython.display import display

    assert interactive.figure_mode() == "live"

    def draw(fig, slope):
        axes = fig.subplots()
        axes.plot([0, 1], [0, slope])
        axes.set_title(f"slope {slope}")

    figure = interactive.InteractiveFigure(draw, {"slope": [1, 2, 3]}, "a line")
    view = figure.widget()
    display(view)
    slider = next(child for child in view.children if hasattr(child, "options"))
    """,
    "import time; time.sleep(1.0)",  # an Output widget's outputs come back to the kernel from nbclient
    """
    first = picture(view)
    assert first and first.startswith(b"\\x89PNG"), f"the live view shows no PNG: {view.children}"
    slider.value = slider.options[-1][1]  # as a reader dragging to the last value
    """,
    "time.sleep(1.0)",
    """
    second = picture(view)
    assert second and second.startswith(b"\\x89PNG") and second != first, "moving the slider did not redraw"
    """,
]


@colab
def test_live_widget_redraws_with_ipywidgets_7():
    """In a real kernel: the ipywidgets 7 view shows a PNG and a slider change redraws it."""
    import ipywidgets
    import nbformat
    from nbclient import NotebookClient

    assert ipywidgets.__version__ == colab_pins()["ipywidgets"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(source).strip()) for source in LIVE_WIDGET_CELLS]
    env = {**os.environ, "POSENC_FIGURES": "live"}
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, as in Colab
    from book.tools.run_notebooks import kernel_config

    NotebookClient(nb, timeout=120, kernel_name="python3", config=kernel_config()).execute(env=env)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = {model["model_name"] for model in state.values()}
    assert {"SelectionSliderModel", "VBoxModel"} <= models, models
    assert all(
        model["model_module_version"].startswith("1.")
        for model in state.values()
        if model["model_module"] == "@jupyter-widgets/controls"
    ), "not the ipywidgets 7 protocol"


def views_without_picture(state: dict) -> list[str]:
    """Slider boxes in a saved widget state that show no picture (an Image with data, or an Output with one)."""

    def is_picture(model: dict) -> bool:
        if model["model_name"] == "ImageModel":
            return bool(model.get("buffers") or model["state"].get("value"))
        if model["model_name"] == "OutputModel":
            shown = model["state"].get("outputs", [])
            return bool(shown) and all(shows_image(o) for o in shown)
        return False

    bad = []
    for model_id, model in state.items():
        if model["model_name"] != "VBoxModel":
            continue
        children = [
            state.get(ref.removeprefix("IPY_MODEL_"), {"model_name": "?"}) for ref in model["state"].get("children", [])
        ]
        if any(c["model_name"] == "SelectionSliderModel" for c in children) and not any(map(is_picture, children)):
            bad.append(f"{model_id}: {[c['model_name'] for c in children]}")
    return bad


@colab
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_executed_live_notebook_shows_working_widgets(notebook):
    """The copies run_notebooks.py --figures live wrote (make colab-check runs it first)."""
    executed = COLAB_EXECUTED / notebook.relative_to(ROOT)
    assert executed.exists() and executed.stat().st_mtime >= notebook.stat().st_mtime, (
        f"no fresh live-executed copy of {notebook.name} in {COLAB_EXECUTED}"
    )
    nb = json.loads(executed.read_text())
    errors = [
        o.get("ename")
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, f"{notebook.name} raised {errors} with Colab's versions"
    views = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    uses_sliders = any("interactive_figure(" in "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert views or not uses_sliders, f"{notebook.name} makes interactive figures but shows no widget"
    if not views:
        return
    state = nb["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert not views_without_picture(state), f"live figures that show no picture: {views_without_picture(state)}"
