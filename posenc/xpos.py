"""xPos (Sun et al. 2022) as RoPE's own elementwise pass: rotation and a per-pair scale, folded into cos/sin tables.

Pair ``j`` of the query at position ``n`` is RoPE's rotation at ``n`` times ``zeta_j^(n/B)``, pair ``j`` of the key at
``m`` the rotation at ``m`` times ``zeta_j^(-m/B)``, with ``zeta_j = (2j + 0.4 D) / (1.4 D)``
(:func:`posenc.generators.xpos_scales`) and ``B = scale_base`` (512 in the paper). A logit then depends on ``n - m``
only, through RoPE's rotation by ``(n - m) theta_j`` and the decay ``zeta_j^((n - m)/B)``: the damped rotation
``exp(nX)`` of :func:`posenc.generators.xpos_generator` for the query and ``exp(mX)^{-T}`` for the key, which
:class:`posenc.GroupEncoding` applies as dense ``D x D`` maps. Here a scale is the same for both features of a pair, so
it commutes with the pair's rotation and multiplies the cos/sin tables instead: one call of :func:`posenc.apply_rope`
per tensor, the same kernel as RoPE's (Triton on CUDA).

Positions are taken as given (the query uses ``n``, the key ``m``). The authors' code centres them on the middle of
the sequence first; that multiplies every query pair by a constant and every key pair by its inverse, so the logits
are the same. Tables are float32, as RoPE's: ``zeta_0^(-m/B)`` overflows float32 past ``|m|`` of about
``88 B / |ln zeta_0| = 70 B`` (36,000 positions at ``B = 512``), where the decay has long made those logits vanish.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import (
    as_positions,
    check_head_dim,
    check_layout,
    check_seq_dim,
    require_positive_number,
    require_real_floating,
)
from .encodings import PositionalEncoding
from .rope import apply_rope, rope_cos_sin
from .rope_types import rope_frequencies


def xpos_log_scales(head_dim: int, scale_base: float = 512.0, device: torch.device | str | None = None) -> Tensor:
    """``ln(zeta_j) / B`` for the ``D/2`` pairs: ``(D/2,)``, float32 (computed in float64, with ``log1p``).

    Args:
        head_dim: ``D``, even.
        scale_base: ``B``, positive.
        device: where the result lives.

    Returns:
        The per-pair log-decay per position, all negative, with ``zeta_j^(t/B) = exp(t * xpos_log_scales(D)[j])``.
    """
    check_head_dim(head_dim)
    base = require_positive_number("scale_base", scale_base)
    pairs = torch.arange(head_dim // 2, dtype=torch.float64, device=device)
    # ln(zeta_j) = log1p(-(D - 2j) / (1.4 D)), accurate where zeta_j is close to 1 (the last pairs)
    return (torch.log1p(-(head_dim - 2 * pairs) / (1.4 * head_dim)) / base).float()


def xpos_cos_sin(
    positions: Tensor | list[int] | range, inv_freq: Tensor, log_scales: Tensor, key: bool = False
) -> tuple[Tensor, Tensor]:
    """RoPE's half-size tables scaled per pair: ``cos(t theta_j) zeta_j^(+-t/B)`` and the same for sin.

    Args:
        positions: ``(T,)`` or ``(B, T)``, integer or real.
        inv_freq: ``theta``, ``(D/2,)`` (:func:`posenc.rope_frequencies`).
        log_scales: ``ln(zeta_j) / B``, ``(D/2,)`` (:func:`xpos_log_scales`).
        key: the key's tables (scale ``zeta_j^(-t/B)``) instead of the query's (``zeta_j^(t/B)``).

    Returns:
        ``(cos, sin)``, each ``(*P, T, D/2)`` and float32, tables for :func:`posenc.apply_rope`.
    """
    positions = as_positions("positions", positions, device=inv_freq.device)
    if log_scales.shape != inv_freq.shape:
        raise ValueError(
            f"log_scales must have the shape of inv_freq {tuple(inv_freq.shape)}, got {tuple(log_scales.shape)}"
        )
    cos, sin = rope_cos_sin(positions, inv_freq)
    exponent = positions[..., None].to(torch.float32) * log_scales.to(inv_freq.device, torch.float32)
    scale = torch.exp(-exponent if key else exponent)
    return cos * scale, sin * scale


def apply_xpos_qk(
    q: Tensor,
    k: Tensor,
    q_positions: Tensor | list[int] | range | None = None,
    k_positions: Tensor | list[int] | range | None = None,
    *,
    base: float = 10_000.0,
    scale_base: float = 512.0,
    layout: str = "half",
    seq_dim: int | None = None,
) -> tuple[Tensor, Tensor]:
    """xPos on queries and keys: each rotated as RoPE and scaled by ``zeta_j^(n/B)`` (query), ``zeta_j^(-m/B)`` (key).

    Args:
        q: ``(B, H, Tq, D)``, or ``(B, Tq, H, D)`` with ``seq_dim=-3``; real floating point.
        k: ``(B, H_kv, Tk, D)``, or ``(B, Tk, H_kv, D)`` with ``seq_dim=-3``.
        q_positions: ``(Tq,)`` or ``(B, Tq)``; default ``arange(Tq)``.
        k_positions: ``(Tk,)`` or ``(B, Tk)``; default ``q_positions`` when the lengths agree, else ``arange(Tk)``.
        base: RoPE's base of the frequencies ``theta_j = base^(-2j/D)``.
        scale_base: ``B``.
        layout: ``"half"`` or ``"interleaved"`` pairs (:func:`posenc.pair_indices`); the authors' code interleaves.
        seq_dim: the sequence axis, as for :func:`posenc.apply_rope`.

    Returns:
        ``(q_x, k_x)`` shaped and typed like ``q`` and ``k`` (the angles and scales are float32).

    Example:
        >>> q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
        >>> q_x, k_x = apply_xpos_qk(q, k)
        >>> q_x.shape
        torch.Size([1, 2, 8, 16])
    """
    require_real_floating("q", q)
    require_real_floating("k", k)
    check_layout(layout)
    axis = -2 if seq_dim is None else check_seq_dim(seq_dim, q.ndim)
    if q_positions is None:
        q_positions = torch.arange(q.shape[axis], device=q.device)
    if k_positions is None:
        k_positions = q_positions if k.shape[axis] == q.shape[axis] else torch.arange(k.shape[axis], device=k.device)
    inv_freq, _ = rope_frequencies(q.shape[-1], {"rope_type": "default", "rope_theta": base}, device=q.device)
    log_scales = xpos_log_scales(q.shape[-1], scale_base, device=q.device)
    q_cos, q_sin = xpos_cos_sin(q_positions, inv_freq, log_scales)
    k_cos, k_sin = xpos_cos_sin(k_positions, inv_freq, log_scales, key=True)
    return (apply_rope(q, q_cos, q_sin, layout, seq_dim=seq_dim), apply_rope(k, k_cos, k_sin, layout, seq_dim=seq_dim))


class XPos(PositionalEncoding):
    """xPos as a "qk" plug-in for :func:`posenc.attention`: :func:`apply_xpos_qk` with fixed frequencies and scales.

    Equal to ``GroupEncoding(xpos_generator(head_dim, base, scale_base, layout))`` within float32 rounding, at the
    cost of RoPE's elementwise pass instead of a ``D x D`` product per position.

    Args:
        head_dim: ``D``, even.
        base: RoPE's base.
        scale_base: ``B``.
        layout: ``"half"`` or ``"interleaved"``.
        seq_dim: the sequence axis of ``q`` and ``k`` (``-2``: ``(B, H, T, D)``, ``-3``: ``(B, T, H, D)``).
    """

    kind = "qk"
    _fixed_dtype_buffers = ("inv_freq", "log_scales")
    inv_freq: Tensor
    log_scales: Tensor

    def __init__(
        self, head_dim: int, base: float = 10_000.0, scale_base: float = 512.0, layout: str = "half", seq_dim: int = -2
    ) -> None:
        super().__init__()
        check_head_dim(head_dim)
        check_layout(layout)
        if seq_dim not in (-2, -3):
            raise ValueError(f"seq_dim must be -2 ((B, H, T, D)) or -3 ((B, T, H, D)), got {seq_dim!r}")
        self.head_dim, self.layout, self.seq_dim = head_dim, layout, seq_dim
        self.base, self.scale_base = float(base), float(scale_base)
        inv_freq, _ = rope_frequencies(head_dim, {"rope_type": "default", "rope_theta": self.base})
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("log_scales", xpos_log_scales(head_dim, scale_base), persistent=False)

    def encode_qk(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """``q`` ``(B, H, Lq, D)``, ``k`` ``(B, H, Lk, D)`` (or ``(B, L, H, D)`` with ``seq_dim=-3``); positions
        ``(Lq,)``, ``(Lk,)`` or batched. Returns ``(q_x, k_x)`` shaped and typed like ``q``, ``k``."""
        q_cos, q_sin = xpos_cos_sin(q_positions, self.inv_freq, self.log_scales)
        k_cos, k_sin = xpos_cos_sin(k_positions, self.inv_freq, self.log_scales, key=True)
        return (
            apply_rope(q, q_cos, q_sin, self.layout, seq_dim=self.seq_dim),
            apply_rope(k, k_cos, k_sin, self.layout, seq_dim=self.seq_dim),
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base}, scale_base={self.scale_base}, layout={self.layout!r}, "
            f"seq_dim={self.seq_dim}"
        )


__all__ = ["xpos_log_scales", "xpos_cos_sin", "apply_xpos_qk", "XPos"]
