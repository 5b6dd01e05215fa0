import os

import pytest
import torch

# Triton kernels run on CPU tensors through Triton's interpreter where no CUDA device is present
# (tests/test_triton_rope.py);
# it must be set before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from posenc.lab.tiny_models import TINY_SIZES  # noqa: E402  (after TRITON_INTERPRET: posenc may import triton)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_model():
    """A factory of tiny random transformers models, offline: ``tiny_model(config, seed=0, head=None, **sizes)``, which
    is :func:`posenc.lab.tiny_models.tiny_model` with a config class built from :data:`TINY_SIZES` updated with
    ``sizes`` (a config instance is used as it is, ``sizes`` set on a copy).
    """
    pytest.importorskip("transformers")
    from posenc.lab.tiny_models import tiny_model as build

    def build_tiny(config, seed: int = 0, head=None, **sizes):
        return build(config, seed, head, **({**TINY_SIZES, **sizes} if isinstance(config, type) else sizes))

    return build_tiny


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long CPU runs, e.g. chapter 11 at full scale) run only when asked: ``-m slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
