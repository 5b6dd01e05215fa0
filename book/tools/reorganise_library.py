"""Separate the library a PyTorch user installs from the book's plumbing, in one mechanical, idempotent pass.

What it does, on a git checkout (run from the repository root, on a clean work tree):

1. ``git mv`` the book's plumbing into the sub-package ``posenc.lab`` (:data:`LAB`: figures, experiments, tasks,
   tables, pretrained embeddings, the language-model harness, the geometry of positional distributions), with the
   files they read (``book.mplstyle``, ``data/``), and writes ``posenc/lab/__init__.py``.
2. Renames the two modules whose names a public function shadows (:data:`RENAMES`): ``posenc.attention`` (the
   module) becomes ``posenc.multihead``, ``posenc.rope_frequencies`` (the module) becomes ``posenc.rope_types``;
   the functions ``posenc.attention`` and ``posenc.rope_frequencies`` keep their names.
3. Rewrites every reference: imports (absolute and relative, at module level and inside functions), dotted names
   (``posenc.interactive.x`` -> ``posenc.lab.interactive.x``), Sphinx roles, file paths (``posenc/data/...``), in
   ``posenc/``, ``tests/``, ``benchmarks/``, ``book/tools/``, the notebooks (every cell's source, json-aware:
   outputs and metadata untouched, the file written as Jupyter writes it), README.md, the Makefile and
   pyproject.toml's package data.
4. Rewrites ``posenc/__init__.py``: the lab modules leave ``import posenc`` (``posenc.lab`` is loaded on first
   access), ``load_embeddings`` leaves the top-level names (the chapters call ``posenc.lab.embeddings.load_embeddings``),
   and the docstring lists the library, then the lab, and states the new import rule.

Run twice, the second run changes nothing. Usage::

    .venv/bin/python -m book.tools.reorganise_library            # do it
    .venv/bin/python -m book.tools.reorganise_library --dry-run  # list the files it would change
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "posenc"
LAB = ("interactive", "experiments", "tasks", "tables", "embeddings", "language_model", "geometry")
LAB_FILES = ("book.mplstyle", "data")  # read by lab modules, moved with them
RENAMES = {"attention": "multihead", "rope_frequencies": "rope_types"}
# top-level names of posenc that come from a lab module: name -> module
LAB_TOP_LEVEL = {"load_embeddings": "embeddings"}
SELF = Path(__file__).resolve()

LAB_INIT = '''"""The book's lab: what the chapters use around the library, not what a model needs.

* :mod:`posenc.lab.interactive`: live and static sliders from one drawing function;
* :mod:`posenc.lab.tasks` and :mod:`posenc.lab.experiments`: synthetic order tasks and small transformers to train;
  :mod:`posenc.lab.tables` formats their results;
* :mod:`posenc.lab.embeddings`: real pretrained token and position embeddings (MiniLM offline);
* :mod:`posenc.lab.language_model`: a real Llama-architecture model (SmolLM2-135M) loaded offline and run with
  posenc's RoPE;
* :mod:`posenc.lab.geometry`: positional distributions, Hellinger distances, classical MDS, stress.

``import posenc`` does not import it; ``posenc.lab`` (or ``from posenc.lab import <module>``) does.
"""
from . import embeddings, experiments, geometry, interactive, language_model, tables, tasks  # noqa: F401
'''

LAZY_LAB = '''

def __getattr__(name):
    # the book's lab is loaded on first use: `import posenc` and help(posenc) show the library
    if name == "lab":
        import importlib

        return importlib.import_module(".lab", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
'''


# ----------------------------------------------------------------------------------------------- text rules
def _split_names(block: str) -> list[str]:
    inner = block.strip()
    if inner.startswith("("):
        inner = inner[1:inner.rindex(")")]
    return [n.strip() for n in inner.replace("\n", " ").split(",") if n.strip()]


def _module_of(name: str) -> str:
    return name.split(" as ")[0].strip()


def _emit(indent: str, source: str, names: list[str], width: int = 120) -> str:
    """One import statement, wrapped inside parentheses at ``width`` columns as the repository writes them."""
    head = f"{indent}from {source} import "
    if len(head) + len(", ".join(names)) <= width:
        return head + ", ".join(names)
    lines, line = [], head + "("
    for i, name in enumerate(names):
        piece = name + ("," if i < len(names) - 1 else ")")
        if len(line) + len(piece) + 1 > width and line.strip() not in ("", head.strip() + " ("):
            lines.append(line.rstrip())
            line = " " * len(head + "(")
        line += piece + " "
    return "\n".join(lines + [line.rstrip()])


_FROM_POSENC = re.compile(r"^([ \t]*)from posenc import (\([^)]*\)|[^\n#]*[^\n#\s])", re.M)


def _split_from_posenc(text: str) -> str:
    """``from posenc import a, interactive as i`` -> ``from posenc import a`` + ``from posenc.lab import ...``."""
    def replace(match):
        indent, names = match.group(1), _split_names(match.group(2))
        lab = [n for n in names if _module_of(n) in LAB]
        if not lab:
            return match.group(0)
        rest = [n for n in names if _module_of(n) not in LAB]
        lines = ([_emit(indent, "posenc", rest)] if rest else []) + [_emit(indent, "posenc.lab", lab)]
        return "\n".join(lines)
    return _FROM_POSENC.sub(replace, text)


def absolute_rules(text: str) -> str:
    """References from outside the package (tests, tools, notebooks, docs) and dotted names anywhere."""
    text = _split_from_posenc(text)
    for name, module in LAB_TOP_LEVEL.items():
        text = re.sub(rf"\bposenc\.{name}\b", f"posenc.lab.{module}.{name}", text)
    lab = "|".join(LAB)
    text = re.sub(rf"\bposenc\.({lab})\b", r"posenc.lab.\1", text)
    text = re.sub(rf"\bposenc/({lab})\.py\b", r"posenc/lab/\1.py", text)
    for name in LAB_FILES:
        text = re.sub(rf"\bposenc/{re.escape(name)}\b", f"posenc/lab/{name}", text)
    for old, new in RENAMES.items():
        text = re.sub(rf"\bposenc\.{old}\.", f"posenc.{new}.", text)  # posenc.attention.x: the module's x
        text = re.sub(rf"\b(from|import) posenc\.{old}\b", rf"\1 posenc.{new}", text)
        text = re.sub(rf":mod:`~?posenc\.{old}`", f":mod:`posenc.{new}`", text)
        text = re.sub(rf"\bposenc/{old}\.py\b", f"posenc/{new}.py", text)
    return text


def _relative_rules(text: str, in_lab: bool) -> str:
    """Relative imports inside the package: from a library module (``posenc/x.py``) or a lab module."""
    lab = "|".join(LAB)
    for old, new in RENAMES.items():
        text = re.sub(rf"(\bfrom \.(?:\.)?){old}\b", rf"\g<1>{new}", text)

    def split_dot(match):  # from . import a, b
        indent, names = match.group(1), _split_names(match.group(2))
        renamed = [RENAMES.get(_module_of(n), _module_of(n)) + n[len(_module_of(n)):] for n in names]
        if in_lab:
            groups = {".": [n for n in renamed if _module_of(n) in LAB],
                      "..": [n for n in renamed if _module_of(n) not in LAB]}
        else:
            groups = {".": [n for n in renamed if _module_of(n) not in LAB],
                      ".lab": [n for n in renamed if _module_of(n) in LAB]}
        return "\n".join(_emit(indent, source, group) for source, group in groups.items() if group)
    text = re.sub(r"^([ \t]*)from \. import (\([^)]*\)|[^\n#]*[^\n#\s])", split_dot, text, flags=re.M)
    if in_lab:  # from .rope import x -> from ..rope import x (library), from .tasks stays (lab)
        text = re.sub(rf"\bfrom \.(?!\.)(?!(?:{lab})\b)(\w+)", r"from ..\1", text)
    else:
        text = re.sub(rf"\bfrom \.({lab})\b", r"from .lab.\1", text)
    return text


def rewrite_python(path: Path, text: str) -> str:
    if path.is_relative_to(PACKAGE):
        in_lab = path.parent.name == "lab" and path.parent.parent == PACKAGE
        if path.name != "__init__.py" or not in_lab:
            text = _relative_rules(text, in_lab)
    return absolute_rules(text)


def rewrite_notebook(text: str) -> str:
    notebook = json.loads(text)
    for cell in notebook["cells"]:
        source = cell["source"]
        joined = "".join(source) if isinstance(source, list) else source
        new = absolute_rules(joined)
        if new != joined:
            cell["source"] = new.splitlines(keepends=True) if isinstance(source, list) else new
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------------------- __init__.py
def rewrite_init(text: str) -> str:
    """The package's own imports, its top-level names and its docstring."""
    for name, module in LAB_TOP_LEVEL.items():
        text = re.sub(rf"^from \.{module} import {name}\n", "", text, flags=re.M)
        text = re.sub(rf'\s*"{name}",', "", text)
    lines = text.split("\n")
    lab_bullets = [i for i, line in enumerate(lines)
                   if re.match(rf"\* :mod:`posenc\.({'|'.join(LAB)})`", line)]
    if lab_bullets:  # drop each lab bullet with its continuation lines, then add the lab's own bullet
        drop = set()
        for i in lab_bullets:
            drop.add(i)
            j = i + 1
            while j < len(lines) and lines[j].startswith("  ") and not lines[j].lstrip().startswith("*"):
                drop.add(j)
                j += 1
        last = max(drop)
        kept = [line for i, line in enumerate(lines[:last + 1]) if i not in drop]
        kept.append("* :mod:`posenc.lab`: the book's plumbing (figures, experiments and their tasks and tables, "
                    "pretrained embeddings,\n  the language-model harness, the geometry of positional "
                    "distributions); not imported by ``import posenc``.")
        lines = kept + lines[last + 1:]
        text = "\n".join(lines)
    text = text.replace("Every module is imported with the package, so ``posenc.<module>`` works too.",
                        "Every library module is imported with the\npackage, so ``posenc.<module>`` works too; no "
                        "public function shadows a module.")
    if "``from posenc.lab import <module>``" not in text:
        text = re.sub(r"own modules imported as\s+``from posenc import <module>``",
                      "own modules imported as ``from posenc import <module>``\n(the library) or "
                      "``from posenc.lab import <module>`` (the lab),", text)
    def without_lab(match):  # the package imports its library modules only
        names = [RENAMES.get(_module_of(n), _module_of(n)) + n[len(_module_of(n)):]
                 for n in _split_names(match.group(1)) if _module_of(n) not in LAB]
        return _emit("", ".", sorted(names))
    text = re.sub(r"^from \. import (\([^)]*\)|[^\n#]*[^\n#\s])", without_lab, text, flags=re.M)
    text = rewrite_python(PACKAGE / "__init__.py", text)
    if "def __getattr__(name)" not in text:
        text = text.rstrip("\n") + "\n" + LAZY_LAB
    return text


# ----------------------------------------------------------------------------------------------- driver
def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def deepen_root_paths(text: str) -> str:
    """A module moved one folder down: paths it builds from ``__file__`` to the repository root climb one level
    more (paths to files beside it, which moved with it, stay). Applied once, when the file moves."""
    text = text.replace("os.path.dirname(os.path.dirname(os.path.abspath(__file__)))",
                        "os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))")
    return re.sub(r"Path\(__file__\)\.resolve\(\)\.parents\[([1-9])\]",
                  lambda m: f"Path(__file__).resolve().parents[{int(m.group(1)) + 1}]", text)


def move_files(dry_run: bool) -> list[str]:
    moves = [(PACKAGE / f"{name}.py", PACKAGE / "lab" / f"{name}.py") for name in LAB]
    moves += [(PACKAGE / name, PACKAGE / "lab" / name) for name in LAB_FILES]
    moves += [(PACKAGE / f"{old}.py", PACKAGE / f"{new}.py") for old, new in RENAMES.items()]
    done = []
    for source, target in moves:
        if source.exists() and not target.exists():
            done.append(f"{source.relative_to(ROOT)} -> {target.relative_to(ROOT)}")
            if not dry_run:
                target.parent.mkdir(exist_ok=True)
                git("mv", str(source.relative_to(ROOT)), str(target.relative_to(ROOT)))
                if target.suffix == ".py" and target.parent.name == "lab":
                    target.write_text(deepen_root_paths(target.read_text()))
    lab_init = PACKAGE / "lab" / "__init__.py"
    if not lab_init.exists():
        done.append("posenc/lab/__init__.py (new)")
        if not dry_run:
            lab_init.write_text(LAB_INIT)
            git("add", str(lab_init.relative_to(ROOT)))
    return done


# The README's paragraph of module names (bare names in backticks): the renamed modules and the lab's.
README_NAMES = [("`attention` (one attention", "`multihead` (one attention"),
                ("`rope_frequencies` (one function", "`rope_types` (one function"),
                ("`embeddings` (real MiniLM", "`lab.embeddings` (real MiniLM"),
                ("`interactive` (live and static", "`lab.interactive` (live and static"),
                ("`geometry` (Hellinger", "`lab.geometry` (Hellinger"),
                ("`tasks` and `experiments` (small", "`lab.tasks` and `lab.experiments` (small"),
                ("`tables` (their results", "`lab.tables` (their results"),
                ("`language_model` (SmolLM2", "`lab.language_model` (SmolLM2")]


def rewrite_readme(text: str) -> str:
    for old, new in README_NAMES:
        text = text.replace(old, new)
    return absolute_rules(text)


def rewrite_pyproject(text: str) -> str:
    text = text.replace('posenc = ["py.typed", "*.mplstyle", "data/*.json"]',
                        'posenc = ["py.typed"]\n"posenc.lab" = ["*.mplstyle", "data/*.json"]')
    return absolute_rules(text)


def targets():
    for folder in ("posenc", "tests", "benchmarks", "book/tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() != SELF and "__pycache__" not in path.parts:
                yield path, (rewrite_init if path == PACKAGE / "__init__.py" else
                             (lambda text, path=path: rewrite_python(path, text)))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        yield path, rewrite_notebook
    yield ROOT / "README.md", rewrite_readme
    yield ROOT / "Makefile", absolute_rules
    for path in sorted((ROOT / "book").rglob("*.css")):
        yield path, absolute_rules
    yield ROOT / "pyproject.toml", rewrite_pyproject


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="list what would change, change nothing")
    args = parser.parse_args(argv)
    changed = move_files(args.dry_run)
    for path, rule in targets():
        if args.dry_run and not path.exists():
            continue
        text = path.read_text()
        new = rule(text)
        if new != text:
            changed.append(str(path.relative_to(ROOT)))
            if not args.dry_run:
                path.write_text(new)
    print("\n".join(changed) if changed else "nothing to do: already reorganised")
    return 0


if __name__ == "__main__":
    sys.exit(main())
