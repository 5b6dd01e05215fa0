"""Scaled dot-product attention that takes any kind of positional encoding.

Shapes: ``q`` ``(B, H, Lq, D)``, ``k`` and ``v`` ``(B, H, Lk, D)``; positions ``(Lq,)``/``(Lk,)`` or batched.
"""

from __future__ import annotations

import math

import torch

from ._checks import as_positions, require_int, require_tensor
from .encodings import KINDS, NoPE, PositionalEncoding


def _check_encoding(encoding):
    if encoding is None:
        return NoPE()
    if not isinstance(encoding, PositionalEncoding) or encoding.kind not in KINDS:
        raise TypeError(
            f"encoding must be a posenc.encodings.PositionalEncoding or None, got {type(encoding).__name__}"
        )
    return encoding


def causal_mask(query_length: int, key_length: int, device=None) -> torch.Tensor:
    """``(Lq, Lk)`` boolean, True where query ``i`` may see key ``j``; queries are the last ``Lq`` positions."""
    offset = key_length - query_length
    rows = torch.arange(query_length, device=device)[:, None] + offset
    return torch.arange(key_length, device=device)[None, :] <= rows


def attention(
    q,
    k,
    v,
    *,
    encoding=None,
    q_positions=None,
    k_positions=None,
    causal: bool = False,
    return_weights: bool = False,
    hidden=None,
):
    """Softmax attention with a "qk", "logits" or "content" encoding (or none).

    Default positions: keys ``0 .. Lk-1``, queries the last ``Lq`` of them (as with a KV cache).
    A "content" encoding computes the logits itself (:meth:`PositionalEncoding.content_logits`) from ``q``, ``k``,
    ``hidden`` (the hidden states of the key tokens, ``(B, Lk, d_model)``, for encodings whose gates read them) and
    the causal mask; it ignores the positions (it counts tokens in their order, queries the last ``Lq`` keys).

    Args:
        q: queries ``(B, H, Lq, D)``.
        k: keys ``(B, H, Lk, D)``.
        v: values ``(B, H, Lk, Dv)``.
        encoding: a :class:`~posenc.encodings.PositionalEncoding` of kind "none", "qk", "logits" or "content", or
            None (no position).
        q_positions: ``(Lq,)`` or ``(B, Lq)``; default the last ``Lq`` of the keys' positions.
        k_positions: ``(Lk,)`` or ``(B, Lk)``; default ``arange(Lk)``.
        causal: mask the keys after each query's position.
        return_weights: also return the attention weights.
        hidden: the key tokens' hidden states ``(B, Lk, d_model)``, for "content" encodings that read them.

    Returns:
        ``out`` ``(B, H, Lq, Dv)``, or ``(out, weights)`` with ``weights`` ``(B, H, Lq, Lk)`` when ``return_weights``.

    Example:
        >>> q = k = v = torch.randn(1, 2, 6, 8)
        >>> out = attention(q, k, v, encoding=posenc.RotaryEmbedding(8), causal=True)
        >>> out.shape
        torch.Size([1, 2, 6, 8])
    """
    _check_qkv(q, k, v)
    encoding = _check_encoding(encoding)
    if encoding.kind == "input":
        raise ValueError("an 'input' encoding acts on token embeddings; use self_attention(x, ...) for it")
    q_positions, k_positions = _positions(q, k, q_positions, k_positions)
    allowed = None
    if causal:
        allowed = q_positions[..., :, None] >= k_positions[..., None, :]
        while allowed.ndim < 4:
            allowed = allowed.unsqueeze(-3)
    logits = _logits(encoding, q, k, q_positions, k_positions, hidden, allowed)
    if allowed is not None:  # causal
        logits = logits.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    out = weights @ v
    return (out, weights) if return_weights else out


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, t)
        if t.ndim != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dimension, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {k.shape[-2]} and {v.shape[-2]}")


def _positions(q, k, q_positions, k_positions) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked positions ``(Lq,)``/``(Lk,)`` or batched; default keys ``arange(Lk)`` and queries the last ``Lq``."""
    lq, lk = q.shape[-2], k.shape[-2]
    if k_positions is None:
        k_positions = torch.arange(lk, device=k.device)
    if q_positions is None:
        q_positions = torch.arange(lk - lq, lk, device=q.device) if lq <= lk else torch.arange(lq, device=q.device)
    q_positions = as_positions("q_positions", q_positions, device=q.device)
    k_positions = as_positions("k_positions", k_positions, device=k.device)
    if q_positions.shape[-1] != lq or k_positions.shape[-1] != lk:
        raise ValueError(
            f"q_positions/k_positions must have lengths {lq}/{lk}, got {q_positions.shape[-1]}/{k_positions.shape[-1]}"
        )
    return q_positions, k_positions


def _logits(encoding, q, k, q_positions, k_positions, hidden, allowed) -> torch.Tensor:
    """The logits ``(B, H, Lq, Lk)`` before the causal mask: the content encoding's own, or the scaled dot products
    of the encoded ``q`` and ``k`` plus the encoding's bias."""
    if encoding.kind == "content":
        lk = k.shape[-2]
        if hidden is not None:
            require_tensor("hidden", hidden)
            if hidden.ndim != 3 or hidden.shape[1] != lk:
                raise ValueError(f"hidden must have shape (B, Lk, d_model) with Lk = {lk}, got {tuple(hidden.shape)}")
        return encoding.content_logits(q, k, hidden=hidden, allowed=allowed)
    q, k = encoding.encode_qk(q, k, q_positions, k_positions)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    bias = encoding.logit_bias(q_positions, k_positions)
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    return logits


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(B, L, H * D)`` -> ``(B, H, L, D)``."""
    b, l, width = x.shape
    return x.view(b, l, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D)`` -> ``(B, L, H * D)``."""
    b, h, l, d = x.shape
    return x.transpose(1, 2).reshape(b, l, h * d)


def self_attention(
    x,
    w_q,
    w_k,
    w_v,
    n_heads: int,
    *,
    encoding=None,
    positions=None,
    causal: bool = False,
    w_o=None,
    return_weights: bool = False,
):
    """Multi-head self-attention of ``x`` ``(B, L, d_model)`` with any of the three kinds of encoding.

    ``w_q``, ``w_k``, ``w_v``: ``(H * D, d_model)`` projection weights (``nn.Linear`` layout); ``w_o``:
    optional ``(d_model, H * D)``. An "input" encoding is added to ``x`` before the projections, a "qk"
    encoding rotates the projected queries and keys, a "logits" encoding biases the scores, a "content" encoding
    computes the scores from the queries, the keys and ``x`` itself (its gates read ``x``).
    Returns ``(B, L, H * D)`` (or ``(B, L, d_model)`` with ``w_o``), plus the weights when asked.
    """
    require_tensor("x", x)
    require_int("n_heads", n_heads, minimum=1)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, L, d_model), got {tuple(x.shape)}")
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        require_tensor(name, w)
        if w.ndim != 2 or w.shape[1] != x.shape[-1] or w.shape[0] % n_heads:
            raise ValueError(
                f"{name} must have shape (n_heads * D, d_model) = ({n_heads} * D, {x.shape[-1]}), got {tuple(w.shape)}"
            )
    encoding = _check_encoding(encoding)
    if positions is None:
        positions = torch.arange(x.shape[1], device=x.device)
    positions = as_positions("positions", positions, device=x.device)
    if positions.shape[-1] != x.shape[1]:
        raise ValueError(f"positions must have length L={x.shape[1]}, got {positions.shape[-1]}")
    if encoding.kind == "input":
        x = encoding.encode_input(x, positions)
        encoding_for_scores = NoPE()
    else:
        encoding_for_scores = encoding
    q, k, v = (split_heads(x @ w.T, n_heads) for w in (w_q, w_k, w_v))
    result = attention(
        q,
        k,
        v,
        encoding=encoding_for_scores,
        q_positions=positions,
        k_positions=positions,
        causal=causal,
        return_weights=return_weights,
        hidden=x if encoding_for_scores.kind == "content" else None,
    )
    out, weights = result if return_weights else (result, None)
    out = merge_heads(out)
    if w_o is not None:
        out = out @ w_o.T
    return (out, weights) if return_weights else out
