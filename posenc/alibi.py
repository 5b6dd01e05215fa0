"""ALiBi: no vectors at all, a per-head linear penalty on the attention logits.

``logit[h, i, j] += -m_h * (i - j)`` (causal) or ``-m_h * |i - j|`` (symmetric).
"""

from __future__ import annotations

import math

import torch

from ._checks import require_int
from .encodings import PositionalEncoding


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """Head slopes ``m_h``, shape ``(n_heads,)``, float32.

    For a power of two ``n``: ``m_h = 2^(-8h/n)``, ``h = 1..n``. Otherwise (the reference rule): the slopes for
    the largest power of two ``c < n``, then every other slope of the ``2c`` set for the remaining heads.
    """
    require_int("n_heads", n_heads, minimum=1)
    closest = 2 ** math.floor(math.log2(n_heads))

    def geometric(count: int, exponents: torch.Tensor) -> torch.Tensor:
        ratio = torch.full((), 2 ** (-(2 ** -(math.log2(count) - 3))), device=device, dtype=torch.float32)
        return torch.pow(ratio, exponents)

    slopes = geometric(closest, torch.arange(1, 1 + closest, device=device, dtype=torch.int32))
    if closest != n_heads:
        remaining = n_heads - closest
        odd = torch.arange(1, 1 + 2 * remaining, 2, device=device, dtype=torch.int32)
        slopes = torch.cat((slopes, geometric(2 * closest, odd)))
    return slopes


def alibi_bias(
    query_length: int,
    key_length: int | None = None,
    slopes=None,
    n_heads: int | None = None,
    causal: bool = True,
    offset: int = 0,
    device=None,
) -> torch.Tensor:
    """Bias to add to the logits: shape ``(H, query_length, key_length)``, float32.

    Query ``i`` sits at position ``offset + i`` (``offset`` = tokens already cached), key ``j`` at ``j``.
    ``causal=True`` gives ``-m (i - j)`` (to be used with a causal mask); ``causal=False`` gives ``-m |i - j|``.
    Pass either ``slopes`` ``(H,)`` or ``n_heads``.
    """
    require_int("query_length", query_length, minimum=1)
    key_length = query_length + offset if key_length is None else require_int("key_length", key_length, minimum=1)
    if slopes is None:
        if n_heads is None:
            raise ValueError("alibi_bias needs slopes (shape (H,)) or n_heads")
        slopes = alibi_slopes(n_heads, device=device)
    elif not isinstance(slopes, torch.Tensor) or slopes.ndim != 1:
        raise ValueError(f"slopes must be a 1-D tensor of shape (H,), got {slopes!r}")
    device = slopes.device
    return alibi_bias_at(
        torch.arange(query_length, device=device) + offset, torch.arange(key_length, device=device), slopes, causal
    )


def alibi_bias_at(
    q_positions: torch.Tensor, k_positions: torch.Tensor, slopes: torch.Tensor, causal: bool = True
) -> torch.Tensor:
    """The ALiBi bias for queries at ``q_positions`` and keys at ``k_positions`` (``(L,)`` or ``(B, L)`` each):
    ``-m_h (i - j)`` (or ``-m_h |i - j|``), float32, ``(H, Lq, Lk)`` or ``(B, H, Lq, Lk)``."""
    distance = (q_positions[..., :, None] - k_positions[..., None, :]).to(torch.float32)
    if not causal:
        distance = distance.abs()
    return -slopes.float().view(-1, 1, 1) * distance.unsqueeze(-3)


class ALiBi(PositionalEncoding):
    """ALiBi as a "logits" plug-in for :func:`posenc.attention`: the bias of :func:`alibi_bias_at`."""

    kind = "logits"
    _fixed_dtype_buffers = ("slopes",)

    def __init__(self, n_heads: int, causal: bool = True, slopes=None):
        """``slopes``: one positive slope per head (a sequence or a ``(n_heads,)`` tensor) in place of the standard
        schedule :func:`alibi_slopes`, which is tuned for many heads and long contexts (a few heads get only gentle
        slopes, the steepest 1/4 for 4 heads)."""
        super().__init__()
        self.causal = causal
        if slopes is None:
            slopes = alibi_slopes(require_int("n_heads", n_heads, minimum=1))
        else:
            require_int("n_heads", n_heads, minimum=1)
            try:
                slopes = torch.as_tensor(slopes, dtype=torch.float32).detach().clone()
            except (TypeError, ValueError, RuntimeError) as error:
                raise TypeError(f"slopes must be a sequence of numbers, got {slopes!r}") from error
            if slopes.shape != (n_heads,):
                raise ValueError(f"slopes must have shape (n_heads,) = ({n_heads},), got {tuple(slopes.shape)}")
            if not bool(torch.isfinite(slopes).all() and (slopes > 0).all()):
                raise ValueError(f"slopes must be positive and finite, got {slopes.tolist()}")
        self.register_buffer("slopes", slopes, persistent=False)

    def logit_bias(self, q_positions, k_positions):
        return alibi_bias_at(q_positions, k_positions, self.slopes, self.causal)


__all__ = ["alibi_slopes", "alibi_bias", "alibi_bias_at", "ALiBi"]
