"""The plug-in protocol of positional encodings, sorted by where they act.

* ``kind = "input"``: a vector added to the token embeddings (sinusoidal, learned);
* ``kind = "qk"``: a position-dependent map applied to queries and keys (RoPE, and the group encodings);
* ``kind = "logits"``: a bias added to the attention logits (ALiBi);
* ``kind = "content"``: the logits themselves, computed from the queries, the keys and the hidden states rather than
  from positions (the data-dependent encodings CoPE, FoX, PaTH of :mod:`posenc.data_dependent`; they need the
  content, which the three hooks above never see);
* ``kind = "none"``: nothing (NoPE).

:func:`posenc.multihead.self_attention` and :func:`posenc.multihead.attention` accept any of them, so a model
swaps encodings by swapping one object. Each plug-in lives with its family: :class:`posenc.absolute.SinusoidalInput`
and :class:`~posenc.absolute.LearnedInput`, :class:`posenc.rope.RotaryEmbedding`, :class:`posenc.alibi.ALiBi`,
:class:`posenc.nd_rope.NDRoPE`, and :class:`posenc.group_encodings.GroupEncoding` /
:class:`~posenc.group_encodings.MultiGroupEncoding`, the learned generators of :mod:`posenc.learned_generators`
and the data-dependent encodings of :mod:`posenc.data_dependent`.
"""

from __future__ import annotations

import torch
from torch import nn

#: The five kinds of plug-in, the values of ``PositionalEncoding.kind``, in order no position, added to the input,
#: applied to q and k, added to the logits, or computing the logits from the content.
KINDS = ("none", "input", "qk", "logits", "content")


class PositionalEncoding(nn.Module):
    """Base class: override the hook that matches ``kind``; the others are identities."""

    kind = "none"
    #: Buffers that keep the dtype they were built in (float32 or float64 frequency tables, slopes, generators)
    #: whatever ``.to(dtype)``, ``.half()``, ``.bfloat16()`` or ``.double()`` does to the module: a model cast to
    #: bf16 still computes its angles in float32, and its outputs take the inputs' dtype. Devices do follow.
    _fixed_dtype_buffers: tuple[str, ...] = ()

    def _apply(self, fn, *args, **kwargs):
        kept = {name: self._buffers[name] for name in self._fixed_dtype_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, *args, **kwargs)
        for name, before in kept.items():
            after = self._buffers.get(name)
            if after is not None and after.dtype != before.dtype:
                # the cast rounded the table: take the original values, on the new device
                self._buffers[name] = before.to(device=after.device)
        return self

    def encode_input(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, L, d_model)``, ``positions``: ``(L,)`` or ``(B, L)``."""
        return x

    def encode_qk(self, q, k, q_positions, k_positions):
        """``q``: ``(B, H, Lq, D)``, ``k``: ``(B, H, Lk, D)``; positions ``(Lq,)`` and ``(Lk,)`` (or batched)."""
        return q, k

    def logit_bias(self, q_positions, k_positions):
        """A bias broadcastable to ``(B, H, Lq, Lk)``, or ``None``."""
        return None

    def content_logits(self, q, k, hidden=None, allowed=None):
        """The scaled logits ``(B, H, Lq, Lk)`` of a "content" encoding, before the mask; here ``q k^T / sqrt(D)``.

        ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, H, Lk, D)``; the queries are the last ``Lq`` of the ``Lk`` tokens (as with
        a
        KV cache). ``hidden``: the layer's input ``(B, Lk, d_model)`` (the hidden states of the key tokens), or None.
        ``allowed``: boolean, broadcastable to ``(B, H, Lq, Lk)``, True where query ``i`` may see key ``j`` (the
        causal mask), or None (every key visible). The caller masks the result; an encoding that must know the mask
        inside (CoPE's gates) reads ``allowed``.
        """
        return (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5


class NoPE(PositionalEncoding):
    """No positional signal at all."""


__all__ = ["KINDS", "PositionalEncoding", "NoPE"]
