"""Tiny random ``transformers`` models: the reference computations that chapter 13 and the tests hold posenc against.

Built offline from a config with small sizes, eager attention (transformers' plain softmax path, the one its other
attention implementations are checked against) and seeded weights: a few thousand parameters, built in milliseconds.
"""

from __future__ import annotations

import copy

#: The sizes of a tiny model: a few thousand parameters (the tests' default; chapter 13 gives its own).
TINY_SIZES = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    pad_token_id=0,
)


def tiny_model(config, seed: int = 0, head=None, **sizes):
    """A ``transformers`` model with random weights drawn after ``torch.manual_seed(seed)``, in eval mode.

    ``config``: a config instance (copied; ``sizes`` are set on the copy) or a config class, built from ``sizes``
    (give the small sizes, e.g. ``hidden_size=32``: a class's defaults are a full-size model). ``head``: the class to
    build, ``AutoModelForCausalLM`` by default (any ``transformers`` model class or auto class). The model uses eager
    attention; the caller's config is not changed.
    """
    import torch
    import transformers

    if isinstance(config, type):
        if not issubclass(config, transformers.PretrainedConfig):
            raise TypeError(f"config must be a transformers config or config class, got the class {config.__name__}")
        config = config(**sizes)
    elif isinstance(config, transformers.PretrainedConfig):
        config = copy.deepcopy(config)
        for key, value in sizes.items():
            setattr(config, key, value)
    else:
        raise TypeError(f"config must be a transformers config or config class, got {type(config).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    config._attn_implementation = "eager"
    head = transformers.AutoModelForCausalLM if head is None else head
    torch.manual_seed(seed)
    model = head.from_config(config) if hasattr(head, "from_config") else head(config)
    return model.eval()


__all__ = ["TINY_SIZES", "tiny_model"]
