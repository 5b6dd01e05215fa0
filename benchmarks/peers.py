"""RoPE as posenc and the libraries people use apply it, behind one interface.

Each builder takes ``(head_dim, seq_len, dtype, device)``, does its library's setup (tables, caches) once,
untimed, and returns ``rotate(q, k) -> (q_rot, k_rot)`` for inputs in that library's own layout
(:data:`SEQUENCE_FIRST` lists the libraries that take ``(B, L, H, D)``; the others take ``(B, H, L, D)``).
A library that is not installed is reported as missing, never an error.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings
from pathlib import Path

import torch

import posenc
from posenc.rope import apply_rope_

SEQUENCE_FIRST = {"torchtune"}
INTERLEAVED = {"rotary-embedding-torch", "torchtune"}  # pairs (2i, 2i+1); posenc and transformers: (i, i + D/2)


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def posenc_tables(head_dim, seq_len, device):
    inv_freq, _ = posenc.rope_frequencies(head_dim, device=device)
    return posenc.rope_cos_sin(torch.arange(seq_len, device=device), inv_freq)


def posenc_rotation(head_dim, seq_len, dtype, device, compiled=False):
    cos, sin = posenc_tables(head_dim, seq_len, device)
    return lambda q, k: (
        posenc.apply_rope(q, cos, sin, compiled=compiled),
        posenc.apply_rope(k, cos, sin, compiled=compiled),
    )


def posenc_in_place(head_dim, seq_len, dtype, device, compiled=False):
    cos, sin = posenc_tables(head_dim, seq_len, device)
    return lambda q, k: (apply_rope_(q, cos, sin, compiled=compiled), apply_rope_(k, cos, sin, compiled=compiled))


def posenc_into(head_dim, seq_len, dtype, device):
    """posenc's default kernel writing into given buffers (private API: it shows the cost of a fresh output)."""
    from posenc._rope_dispatch import ENGINE

    cos, sin = posenc_tables(head_dim, seq_len, device)  # (L, D/2): already aligned to any (..., L, D)
    return lambda q, k, out_q, out_k: (
        ENGINE.rotate_into(out_q, q, cos, sin, "half"),
        ENGINE.rotate_into(out_k, k, cos, sin, "half"),
    )


def transformers_rotation(head_dim, seq_len, dtype, device):
    """``apply_rotary_pos_emb`` with cos and sin precomputed (untimed) by ``LlamaRotaryEmbedding``."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, max_position_embeddings=seq_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rotary = LlamaRotaryEmbedding(config).to(device)
    like = torch.empty(0, dtype=dtype, device=device)  # cos and sin come out in q's dtype, as in a model
    cos, sin = rotary(like, torch.arange(seq_len, device=device)[None])
    return lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)


def transformers_decode_step(head_dim, n_heads, dtype, device):
    """One generation step as a Llama model takes it: ``LlamaRotaryEmbedding`` turns ``position_ids`` ``(B, 1)``
    into cos and sin, then ``apply_rotary_pos_emb`` rotates q and k (both timed: a model pays both every step)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=head_dim * n_heads, num_attention_heads=n_heads, max_position_embeddings=8192)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rotary = LlamaRotaryEmbedding(config).to(device)

    def step(q, k, position, position_ids):
        return apply_rotary_pos_emb(q, k, *rotary(q, position_ids))

    return step


def posenc_decode_step(head_dim, n_heads, dtype, device, by="offset"):
    """One generation step with :class:`posenc.RotaryEmbedding`: ``by="offset"`` passes the number of cached tokens
    (an int, or a ``(B,)`` tensor: one per sequence; the tables are rows of the module's cache), ``by="positions"``
    the ``(B, 1)`` position ids."""
    rotary = posenc.RotaryEmbedding(head_dim, max_position_embeddings=8192).to(device)
    if by == "offset":
        return lambda q, k, position, position_ids: rotary(q, k, offset=position)
    return lambda q, k, position, position_ids: rotary(q, k, positions=position_ids)


def rotary_embedding_torch_rotation(head_dim, seq_len, dtype, device):
    """``RotaryEmbedding.rotate_queries_or_keys``, its everyday call (angles cached after the first call)."""
    from rotary_embedding_torch import RotaryEmbedding

    rotary = RotaryEmbedding(dim=head_dim, cache_max_seq_len=max(8192, seq_len)).to(device)
    return lambda q, k: (rotary.rotate_queries_or_keys(q), rotary.rotate_queries_or_keys(k))


def torchtune_module():
    """torchtune's ``RotaryPositionalEmbeddings``: from the package, or from its module file when the package
    does not import (torchtune 0.6 refuses to import without torchao)."""
    try:
        from torchtune.modules import RotaryPositionalEmbeddings

        return RotaryPositionalEmbeddings, "package"
    except ImportError:
        spec = importlib.util.find_spec("torchtune")
        if spec is None or not spec.submodule_search_locations:
            raise
        path = Path(list(spec.submodule_search_locations)[0]) / "modules" / "position_embeddings.py"
        module_spec = importlib.util.spec_from_file_location("torchtune_position_embeddings", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.RotaryPositionalEmbeddings, "module file"


def torchtune_rotation(head_dim, seq_len, dtype, device):
    rotary = torchtune_module()[0](dim=head_dim, max_seq_len=seq_len).to(device)
    return lambda q, k: (rotary(q), rotary(k))


# name -> (builder, PyPI distribution whose version is reported)
PEERS = {
    "transformers": (transformers_rotation, "transformers"),
    "rotary-embedding-torch": (rotary_embedding_torch_rotation, "rotary-embedding-torch"),
    "torchtune": (torchtune_rotation, "torchtune"),
}


def available_peers() -> dict:
    """name -> builder for every installed peer; name -> reason for the missing ones."""
    found, missing = {}, {}
    for name, (builder, distribution) in PEERS.items():
        if version(distribution) is None:
            missing[name] = f"{distribution} is not installed (pip install -r benchmarks/requirements.txt)"
            continue
        try:
            if name == "torchtune":
                torchtune_module()
            found[name] = builder
        except Exception as error:  # a peer that cannot load is reported, not fatal
            missing[name] = f"{type(error).__name__}: {error}"
    return found, missing


def native_layout(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` of shape ``(B, H, L, D)`` in the layout the library takes, contiguous."""
    return t.transpose(1, 2).contiguous() if name in SEQUENCE_FIRST else t
