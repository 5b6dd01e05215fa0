"""The import rule of the book's notebooks (posenc/__init__.py's docstring), checked on every code cell.

``import posenc`` and the names of ``posenc.__all__`` written ``posenc.<name>``; a later chapter's modules imported
as ``from posenc import <module>`` or ``from posenc.lab import <module>`` and used as ``<module>.<name>``; the
book-wide aliases and nothing else; the figure helpers the one ``from posenc.lab.interactive import ...``.
"""

from __future__ import annotations

import ast
import json
import pkgutil

import pytest

import posenc
import posenc.lab
from book.tools.book_files import toc_notebooks

ALIASES = {
    "generators": "gens",
    "tables": "fmt",
    "tasks": "order_tasks",
    "experiments": "ex",
    "context_extension": "ext",
    "language_model": "lm_tools",
}
FIGURE_HELPERS = {"interactive_figure", "show_figure", "use_book_style"}
LIBRARY_MODULES = {m.name for m in pkgutil.iter_modules(posenc.__path__) if not m.name.startswith("_")} - {"lab"}
LAB_MODULES = {m.name for m in pkgutil.iter_modules(posenc.lab.__path__) if not m.name.startswith("_")}


def cell_trees(path):
    """``(index, ast)`` of every code cell, IPython's magics and shell lines left out."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            lines = [
                line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
                for line in source.split("\n")
            ]
            yield index, ast.parse("\n".join(lines))


def violations(tree) -> list[str]:
    """What a cell does against the rule, one line each (empty when it keeps it)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("posenc") and (alias.name != "posenc" or alias.asname):
                    found.append(f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("posenc"):
            modules = {"posenc": LIBRARY_MODULES, "posenc.lab": LAB_MODULES}.get(node.module)
            for alias in node.names:
                if node.module == "posenc.lab.interactive" and alias.name in FIGURE_HELPERS and not alias.asname:
                    continue
                if modules is None or alias.name not in modules:
                    found.append(f"from {node.module} import {alias.name}: not a module of {node.module}")
                elif alias.asname not in (None, ALIASES.get(alias.name)):
                    found.append(
                        f"from {node.module} import {alias.name} as {alias.asname}: the alias is "
                        f"{ALIASES.get(alias.name, alias.name)!r} book-wide"
                    )
                elif alias.name in ALIASES and alias.asname is None:
                    found.append(f"from {node.module} import {alias.name}: imported as {ALIASES[alias.name]}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "posenc"
            and node.attr not in posenc.__all__
            and node.attr not in LIBRARY_MODULES | {"lab", "__version__"}
        ):
            found.append(f"posenc.{node.attr}: not in posenc.__all__")
    return found


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: p.stem)
def test_notebook_keeps_the_import_rule(path):
    broken = [f"cell {index}: {line}" for index, tree in cell_trees(path) for line in violations(tree)]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import posenc\nposenc.rotate", []),
        ("from posenc import rotate", ["from posenc import rotate: not a module of posenc"]),
        ("from posenc.rope import rotate", ["from posenc.rope import rotate: not a module of posenc.rope"]),
        ("from posenc import generators", ["from posenc import generators: imported as gens"]),
        (
            "from posenc.lab import experiments as exp",
            ["from posenc.lab import experiments as exp: the alias is 'ex' book-wide"],
        ),
        ("import posenc.rope", ["import posenc.rope"]),
        ("import posenc\nposenc.RotationEngine", ["posenc.RotationEngine: not in posenc.__all__"]),
        ("from posenc.lab.interactive import interactive_figure, show_figure", []),
    ],
)
def test_the_rule_catches_what_it_should(source, expected):
    assert violations(ast.parse(source)) == expected
