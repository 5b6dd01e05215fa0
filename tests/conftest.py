import copy
import os

import pytest
import torch

# Triton kernels run on CPU tensors through Triton's interpreter where no CUDA device is present
# (tests/test_triton_rope.py);
# it must be set before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The sizes of a tiny random transformers model: a few thousand parameters, built in milliseconds.
TINY_SIZES = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_model():
    """A factory of tiny random transformers models, offline: ``tiny_model(config, seed=0, head=None, **sizes)``.

    ``config``: a config instance (copied, ``sizes`` set on the copy) or a config class (built from
    :data:`TINY_SIZES` updated with ``sizes``). ``head``: the class to build (``AutoModelForCausalLM`` by default;
    any ``transformers`` model class or auto class). The model uses eager attention, has its weights drawn after
    ``torch.manual_seed(seed)``, and is returned in eval mode.
    """
    transformers = pytest.importorskip("transformers")

    def build(config, seed: int = 0, head=None, **sizes):
        if isinstance(config, type):
            config = config(**{**TINY_SIZES, **sizes})
        else:
            config = copy.deepcopy(config)
            for key, value in sizes.items():
                setattr(config, key, value)
        config._attn_implementation = "eager"
        head = transformers.AutoModelForCausalLM if head is None else head
        torch.manual_seed(seed)
        model = head.from_config(config) if hasattr(head, "from_config") else head(config)
        return model.eval()

    return build


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long CPU runs, e.g. chapter 11 at full scale) run only when asked: ``-m slow``."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
