"""The examples in posenc's docstrings (the API reference shows them) run and print what they say."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest
import torch

import posenc

MODULES = [name for _, name, _ in pkgutil.iter_modules(posenc.__path__, "posenc.") if name != "posenc.lab"]
WITH_EXAMPLES = [name for name in MODULES if ">>>" in Path(importlib.import_module(name).__file__).read_text()]


def test_some_docstrings_have_examples():
    assert {"posenc.xpos", "posenc.nd_rope"} <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples(name):
    torch.manual_seed(0)
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        globs={"torch": torch, "posenc": posenc, **vars(module)},
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted and not result.failed, f"{name}: {result.failed} of {result.attempted} examples failed"
