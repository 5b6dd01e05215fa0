import os

import pytest
import torch

# Triton kernels run on CPU tensors through Triton's interpreter where no CUDA device is present (tests/test_triton_rope.py);
# it must be set before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long CPU runs, e.g. chapter 11 at full scale) run only when asked: ``-m slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
