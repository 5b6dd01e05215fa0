"""Build the HTML book from the executed notebooks, with ``-n -W --keep-going``.

The notebooks are executed once, by run_notebooks.py (in parallel, failures named by notebook and cell);
this script stages the executed copies beside _config.yml, _toc.yml and book/, turns build-time execution
off in the staged config only, and builds into _build/html (MathJax included, from the PyPI package
sphinx-mathjax-offline). Then make_offline.py checks that the site loads nothing from the network.

Static figures of the executed notebooks are PNG files in _build/frames (posenc.lab.interactive writes them there,
content-addressed, and the pages refer to them as ``../_static/frames/<sha1>.png``): the files the staged
pages refer to are copied into the staged book/_static/frames, which Sphinx copies into _build/html/_static.
With ``POSENC_PUBLISH_REF=<commit>`` (the Pages workflow sets it) the pages are a published build: each page's
Colab link opens a copy of its notebook whose setup cell installs posenc at that commit, and its downloadable
notebook carries the same cell (book/tools/repository.py writes the copies to _build/colab/<commit>/). Without it,
the links open ``main``'s notebooks, which install ``main``.

The site root, index.html, is Jupyter Book's redirect page: it gets the book's icon declared (and favicon.svg and
favicon.ico beside it), so a browser opening the bare address asks for no missing /favicon.ico.
Run as a module from the repository root: ``python -m book.tools.build_html``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import yaml

from book.tools.book_files import ROOT, executed_dir, toc_entries
from book.tools.make_offline import main as check_offline
from book.tools.repository import colab_link_settings, pin_notebook, publish_ref, write_pinned_notebooks
from posenc.lab.interactive import FRAMES_DIR_ENV

STAGE = ROOT / "_build" / "stage"
PUBLISHED_REF_FILE = ROOT / "_build" / "html-published-ref.txt"  # the commit the last build pinned ("" if local)
FRAME_URL = re.compile(r"_static/frames/([0-9a-f]{20}\.png)")


def frames_dir() -> Path:
    """Where the notebooks' kernels wrote static figure files (see posenc.lab.interactive.frames_dir)."""
    return Path(os.environ.get(FRAMES_DIR_ENV) or ROOT / "_build" / "frames")


def copy_frames(notebooks: list[Path], target: Path) -> int:
    """Copy every frame file the ``notebooks`` refer to into ``target``; fail naming a missing one."""
    names = set()
    for notebook in notebooks:
        names.update(FRAME_URL.findall(notebook.read_text(encoding="utf-8")))
    source = frames_dir()
    missing = sorted(name for name in names if not (source / name).exists())
    if missing:
        raise SystemExit(
            f"{len(missing)} figure files the executed notebooks refer to are not in {source} "
            f"(e.g. {missing[0]}): run python -m book.tools.run_notebooks again"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(source / name, target / name)
    return len(names)


def present_toc() -> dict:
    """_toc.yml without entries whose file does not exist yet (tests/test_book.py fails on those)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    for part in toc.get("parts", []):
        part["chapters"] = [
            c for c in part["chapters"] if any((ROOT / f"{c['file']}{suffix}").exists() for suffix in (".ipynb", ".md"))
        ]
    toc["parts"] = [part for part in toc.get("parts", []) if part["chapters"]]
    return toc


def stage(ref: str | None = None) -> Path:
    """Stage the book in _build/stage; ``ref``: the commit a published build pins (see the module's docstring)."""
    if STAGE.exists():
        shutil.rmtree(STAGE)
    STAGE.mkdir(parents=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config.setdefault("execute", {})["execute_notebooks"] = "off"
    if ref:
        config["repository"].update(colab_link_settings(ref))
    (STAGE / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (STAGE / "_toc.yml").write_text(yaml.safe_dump(present_toc(), sort_keys=False))
    shutil.copytree(ROOT / "book", STAGE / "book", ignore=shutil.ignore_patterns("tools", "__pycache__"))
    missing, staged = [], []
    for entry in toc_entries():
        source = ROOT / f"{entry}.ipynb"
        if not source.exists():
            continue
        executed = executed_dir() / f"{entry}.ipynb"
        if not executed.exists() or executed.stat().st_mtime < source.stat().st_mtime:
            missing.append(entry)
            continue
        (STAGE / entry).parent.mkdir(parents=True, exist_ok=True)
        if ref:
            import nbformat

            nbformat.write(pin_notebook(nbformat.read(executed, as_version=4), ref), STAGE / f"{entry}.ipynb")
        else:
            shutil.copy(executed, STAGE / f"{entry}.ipynb")
        staged.append(STAGE / f"{entry}.ipynb")
    if missing:
        raise SystemExit(
            f"no up-to-date executed copy of {missing}: run python -m book.tools.run_notebooks (make book does) first"
        )
    count = copy_frames(staged, STAGE / "book" / "_static" / "frames")
    print(f"staged {len(staged)} executed notebooks and {count} figure files", flush=True)
    if ref:
        written = write_pinned_notebooks(ref)
        print(
            f"published build of {ref}: Colab links open the {len(written)} pinned copies in "
            f"{written[0].parent.parent.relative_to(ROOT)}",
            flush=True,
        )
    return STAGE


def icon_at_root(html_dir: Path) -> None:
    """Declare the book's icon in the root redirect page and serve it (and a favicon.ico) beside it.

    The redirect page carries the icon inline (a data: URL): a file it asked for would be cancelled by the
    redirect, which a browser reports as a failed load."""
    source = ROOT / "book" / "_static" / "favicon.svg"
    shutil.copyfile(source, html_dir / "favicon.svg")
    shutil.copyfile(source.with_suffix(".ico"), html_dir / "favicon.ico")
    link = f'<link rel="icon" type="image/svg+xml" href="data:image/svg+xml,{quote(source.read_text().strip())}">'
    index = html_dir / "index.html"
    text = re.sub(r'<link rel="icon"[^>]*>\n?', "", index.read_text(encoding="utf-8"))  # an earlier build's
    head = re.search(r"<head[^>]*>", text)
    # Jupyter Book's redirect page is a bare <meta http-equiv="Refresh">, without <head>: the link goes first
    text = text[: head.end()] + link + text[head.end() :] if head else f"{link}\n{text}"
    index.write_text(text, encoding="utf-8")


def build() -> int:
    ref = publish_ref()
    PUBLISHED_REF_FILE.unlink(missing_ok=True)
    stage(ref)
    command = [
        str(Path(sys.executable).parent / "jupyter-book"),
        "build",
        str(STAGE),
        "--path-output",
        str(ROOT),
        "--all",
        "-n",
        "-W",
        "--keep-going",
    ]
    print("+", " ".join(command), flush=True)
    # the API pages document the posenc of this checkout, whatever the environment's editable install points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, cwd=ROOT, env=env)
    if result.returncode:
        return result.returncode
    icon_at_root(ROOT / "_build" / "html")
    PUBLISHED_REF_FILE.write_text(ref or "")
    return check_offline([])


if __name__ == "__main__":
    raise SystemExit(build())
