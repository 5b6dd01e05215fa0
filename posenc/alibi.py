"""ALiBi: no vectors at all, a per-head linear penalty on the attention logits.

``logit[h, i, j] += -m_h * (i - j)`` (causal) or ``-m_h * |i - j|`` (symmetric).
"""
from __future__ import annotations

import math

import torch

from ._checks import require_int


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


def alibi_bias(query_length: int, key_length: int | None = None, slopes=None, n_heads: int | None = None,
               causal: bool = True, offset: int = 0, device=None) -> torch.Tensor:
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
    distance = (torch.arange(query_length, device=device)[:, None] + offset) - torch.arange(key_length, device=device)
    distance = distance.to(torch.float32)
    if not causal:
        distance = distance.abs()
    return -slopes.float()[:, None, None] * distance
