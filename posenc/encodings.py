"""Positional encodings as plug-in modules, sorted by where they act.

* ``kind = "input"``: a vector added to the token embeddings (sinusoidal, learned);
* ``kind = "qk"``: a position-dependent map applied to queries and keys (RoPE, and the group encodings);
* ``kind = "logits"``: a bias added to the attention logits (ALiBi);
* ``kind = "none"``: nothing (NoPE).

:func:`posenc.attention.self_attention` and :func:`posenc.attention.attention` accept any of them, so a model
swaps encodings by swapping one object.
"""
from __future__ import annotations

import torch
from torch import nn

from .absolute import LearnedPositionalEmbedding, sinusoidal_encoding
from .alibi import alibi_slopes
from .rope import RotaryEmbedding, apply_rope

KINDS = ("none", "input", "qk", "logits")


class PositionalEncoding(nn.Module):
    """Base class: override the hook that matches ``kind``; the others are identities."""

    kind = "none"

    def encode_input(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, L, d_model)``, ``positions``: ``(L,)`` or ``(B, L)``."""
        return x

    def encode_qk(self, q, k, q_positions, k_positions):
        """``q``: ``(B, H, Lq, D)``, ``k``: ``(B, H, Lk, D)``; positions ``(Lq,)`` and ``(Lk,)`` (or batched)."""
        return q, k

    def logit_bias(self, q_positions, k_positions):
        """A bias broadcastable to ``(B, H, Lq, Lk)``, or ``None``."""
        return None


class NoPE(PositionalEncoding):
    """No positional signal at all."""


class SinusoidalInput(PositionalEncoding):
    kind = "input"

    def __init__(self, dim: int, base: float = 10_000.0):
        super().__init__()
        self.dim, self.base = dim, base

    def encode_input(self, x, positions):
        return x + sinusoidal_encoding(positions, self.dim, self.base, dtype=x.dtype).to(x.device)


class LearnedInput(PositionalEncoding):
    kind = "input"

    def __init__(self, max_positions: int, dim: int):
        super().__init__()
        self.table = LearnedPositionalEmbedding(max_positions, dim)

    def encode_input(self, x, positions):
        return x + self.table(positions).to(x.dtype)


class RoPE(PositionalEncoding):
    kind = "qk"

    def __init__(self, head_dim: int, rope_parameters: dict | None = None, max_position_embeddings: int = 2048,
                 layout: str = "half"):
        super().__init__()
        self.rotary = RotaryEmbedding(head_dim, rope_parameters, max_position_embeddings, layout)

    def encode_qk(self, q, k, q_positions, k_positions):
        q_cos, q_sin = self.rotary.cos_sin(q_positions)
        k_cos, k_sin = self.rotary.cos_sin(k_positions)
        return apply_rope(q, q_cos, q_sin, self.rotary.layout), apply_rope(k, k_cos, k_sin, self.rotary.layout)


class ALiBi(PositionalEncoding):
    kind = "logits"

    def __init__(self, n_heads: int, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def logit_bias(self, q_positions, k_positions):
        distance = q_positions[..., :, None].float() - k_positions[..., None, :].float()
        if not self.causal:
            distance = distance.abs()
        return -self.slopes.view(-1, 1, 1) * distance.unsqueeze(-3)


__all__ = ["KINDS", "PositionalEncoding", "NoPE", "SinusoidalInput", "LearnedInput", "RoPE", "ALiBi"]
