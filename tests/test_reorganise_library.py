"""The scripted library/lab reorganisation (book/tools/reorganise_library.py): its rewriting rules, on samples.

The samples spell the package as {P} so that the script, which also rewrites this file, leaves them alone.
"""
import json

import pytest

from book.tools import reorganise_library as reorg

P = "posenc"


def test_imports_of_lab_modules_move_to_the_lab():
    rewrite = reorg.absolute_rules
    assert rewrite(f"from {P} import interactive") == f"from {P}.lab import interactive"
    assert rewrite(f"    from {P} import generators as gens, tables as fmt, tasks as order_tasks") == (
        f"    from {P} import generators as gens\n    from {P}.lab import tables as fmt, tasks as order_tasks")
    assert rewrite(f"from {P}.interactive import show_figure") == f"from {P}.lab.interactive import show_figure"
    assert rewrite(f"x = {P}.language_model.load()") == f"x = {P}.lab.language_model.load()"
    assert rewrite(f"{P}.load_embeddings('minilm')") == f"{P}.lab.embeddings.load_embeddings('minilm')"
    assert rewrite(f"{P}/data/long_context.json") == f"{P}/lab/data/long_context.json"


def test_shadowed_modules_are_renamed_but_the_functions_are_not():
    rewrite = reorg.absolute_rules
    assert rewrite(f"from {P}.attention import split_heads") == f"from {P}.multihead import split_heads"
    assert rewrite(f"{P}.rope_frequencies.ROPE_TYPES") == f"{P}.rope_types.ROPE_TYPES"
    assert rewrite(f":mod:`{P}.attention`") == f":mod:`{P}.multihead`"
    for unchanged in (f"{P}.attention(q, k, v)", f"{P}.rope_frequencies(64)", f"from {P} import attention",
                      f":func:`{P}.rope_frequencies`"):
        assert rewrite(unchanged) == unchanged


def test_relative_imports_inside_the_package():
    lab_module = reorg.PACKAGE / "lab" / "experiments.py"
    library_module = reorg.PACKAGE / "newmodule.py"
    text = "from . import tables\nfrom .attention import self_attention\nfrom ._checks import x\nfrom .tasks import T\n"
    assert reorg.rewrite_python(lab_module, text) == (
        "from . import tables\nfrom ..multihead import self_attention\nfrom .._checks import x\nfrom .tasks import T\n")
    assert reorg.rewrite_python(library_module, "    from .language_model import load\nfrom .rope import r\n") == (
        "    from .lab.language_model import load\nfrom .rope import r\n")


def test_rules_are_idempotent_and_notebooks_keep_their_format():
    samples = [f"from {P} import interactive, rope\n{P}.geometry.mds(x)\nfrom {P}.attention import causal_mask\n"]
    for text in samples:
        once = reorg.absolute_rules(text)
        assert reorg.absolute_rules(once) == once
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {"tags": ["hide-input"]},
                           "outputs": [], "source": [f"import {P}\n", f"from {P} import experiments as ex"]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    new = json.loads(reorg.rewrite_notebook(text))
    assert new["cells"][0]["source"] == [f"import {P}\n", f"from {P}.lab import experiments as ex"]
    assert new["cells"][0]["metadata"] == {"tags": ["hide-input"]} and new["cells"][0]["outputs"] == []
    unchanged = json.dumps({**notebook, "cells": []}, indent=1, ensure_ascii=False) + "\n"
    assert reorg.rewrite_notebook(unchanged) == unchanged


REORGANISED = (reorg.PACKAGE / "lab" / "__init__.py").exists()


@pytest.mark.skipif(not REORGANISED, reason="the reorganisation has not been run on this checkout")
def test_import_posenc_is_the_library():
    """After the reorganisation: `import posenc` loads no lab module, and no public name shadows a module."""
    import pkgutil
    import subprocess
    import sys

    code = ("import sys, posenc; loaded = sorted(m for m in sys.modules if m.startswith('posenc.lab')); "
            "print(loaded); assert not loaded, loaded; import posenc.lab.interactive")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=reorg.ROOT)
    import posenc

    modules = {info.name for info in pkgutil.iter_modules(posenc.__path__)}
    assert not modules & set(posenc.__all__), modules & set(posenc.__all__)
    assert posenc.lab.interactive.__name__ == f"{P}.lab.interactive"


def test_paths_to_the_repository_root_climb_one_more_level():
    text = ("root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"
            "cache = Path(__file__).resolve().parents[1] / 'x'\nbeside = Path(__file__).resolve().parent / 'data'\n")
    assert reorg.deepen_root_paths(text) == (
        "root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
        "cache = Path(__file__).resolve().parents[2] / 'x'\nbeside = Path(__file__).resolve().parent / 'data'\n")
