"""The plug-in protocol of positional encodings, sorted by where they act.

* ``kind = "input"``: a vector added to the token embeddings (sinusoidal, learned);
* ``kind = "qk"``: a position-dependent map applied to queries and keys (RoPE, and the group encodings);
* ``kind = "logits"``: a bias added to the attention logits (ALiBi);
* ``kind = "none"``: nothing (NoPE).

:func:`posenc.attention.self_attention` and :func:`posenc.attention.attention` accept any of them, so a model
swaps encodings by swapping one object. Each plug-in lives with its family: :class:`posenc.absolute.SinusoidalInput`
and :class:`~posenc.absolute.LearnedInput`, :class:`posenc.rope.RotaryEmbedding`, :class:`posenc.alibi.ALiBi`,
:class:`posenc.nd_rope.NDRoPE`, and :class:`posenc.group_encodings.GroupEncoding` /
:class:`~posenc.group_encodings.MultiGroupEncoding`.
"""
from __future__ import annotations

import torch
from torch import nn

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


__all__ = ["KINDS", "PositionalEncoding", "NoPE"]
