"""A user's script, type-checked (not run) by tests/test_typing.py with ``mypy --strict``.

It uses the library as the README does, and states with ``assert_type`` what a checker must infer from posenc's
annotations: a value typed ``Any`` would pass every other check silently, so each public call the README makes has
its result type asserted here.
"""

from __future__ import annotations

from typing import assert_type

import torch
from torch import Tensor

import posenc


def tables(length: int) -> tuple[Tensor, Tensor]:
    inv_freq, attention_factor = posenc.rope_frequencies(
        128, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    )
    assert_type(inv_freq, Tensor)
    assert_type(attention_factor, float)
    cos, sin = posenc.rope_cos_sin(torch.arange(length), inv_freq, attention_factor)
    assert_type(cos, Tensor)
    return cos, sin


def rotate_one(q: Tensor) -> Tensor:
    cos, sin = tables(q.shape[-2])
    assert_type(posenc.apply_rope(q, cos, sin, layout="half"), Tensor)
    assert_type(posenc.apply_rope_qk(q, q, cos, sin), tuple[Tensor, Tensor])
    return posenc.rotate(q, torch.arange(q.shape[-2]))


def with_a_module(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    rope = posenc.RotaryEmbedding(64, {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=512)
    assert_type(rope.inv_freq, Tensor)  # a buffer, typed as the tensor it is
    cos, sin = posenc.rope_cos_sin(torch.arange(16), rope.inv_freq)
    assert_type(rope(q, k), tuple[Tensor, Tensor])  # __call__, as forward
    assert_type(rope.forward(q, k, offset=3), tuple[Tensor, Tensor])
    return rope(q, k, torch.arange(q.shape[-2])[None])


def images(x: Tensor) -> Tensor:
    """(B, T, H, D) patches of a 4 x 4 grid, rotated by their 2-D coordinates."""
    frequencies = posenc.nd_rope.axial_frequencies(x.shape[-1], 2)
    positions = posenc.nd_rope.grid_positions(4, 4)
    assert_type(positions, Tensor)
    rotated = posenc.nd_rope.rotate_nd(x, positions, frequencies, seq_dim=-3)
    encoding = posenc.NDRoPE(x.shape[-1], seq_dim=-3)
    q, k = encoding.encode_qk(x, x, positions, positions)
    assert_type(q, Tensor)
    return rotated


def xpos(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    q_rot, k_rot = posenc.xpos.apply_xpos_qk(q, k, torch.arange(q.shape[-2]))
    assert_type(q_rot, Tensor)
    encoding = posenc.xpos.XPos(q.shape[-1])
    return encoding.encode_qk(q, k, torch.arange(q.shape[-2]), torch.arange(k.shape[-2]))
