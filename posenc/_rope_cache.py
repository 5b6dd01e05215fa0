"""The table cache of :class:`posenc.rope.RotaryEmbedding` (private): rows of cos and sin for positions
``0 .. N - 1``, cut for default positions and gathered by index for integer CPU positions.

Rows ``(N, R/2)`` are the numbers :func:`posenc.rope.rope_cos_sin` computes for ``arange(N)``; ``N`` is a power of
two >= 64, grown when a call reaches past it (amortised), and the cache is rebuilt when ``inv_freq`` changes
(device, dtype, storage, in-place version) or the attention factor does. Each row is also kept widened to one entry
per feature (``full`` ``(N, 2, R)``, see :func:`posenc._rope_dispatch.full_tables`): a decode step's ``(B, 1)``
position ids then cost one gather of full-width rows.
"""

from __future__ import annotations

import torch

from ._rope_dispatch import cos_sin_tables, full_tables, pair_slices

#: Positions up to which explicit CPU positions may read :class:`posenc.rope.RotaryEmbedding`'s cached tables (or up
#: to ``max_position_embeddings`` when that is larger): the cache never grows past it for them.
CACHE_LIMIT = 1 << 16


class TableCache:
    """Cached rows of one module's tables. ``entry``: None or ``(key, cos (N, R/2), sin (N, R/2), full (N, 2, R))``;
    ``cos`` and ``sin`` are views of ``full``."""

    def __init__(self, layout: str, limit: int):
        self.layout, self.limit = layout, limit
        self.entry: tuple | None = None

    def grown(self, inv_freq: torch.Tensor, attention_factor: float, end: int) -> tuple:
        """The entry, grown to hold rows ``0 .. end - 1`` and rebuilt when ``inv_freq`` or the factor changed."""
        key = (inv_freq.device, inv_freq.dtype, inv_freq.data_ptr(), inv_freq._version, attention_factor)
        entry = self.entry
        if entry is None or entry[0] != key or entry[1].shape[0] < end:
            size = 1 << max(6, (end - 1).bit_length())  # a power of two >= 64: growth is amortised
            cos, sin = cos_sin_tables(torch.arange(size, device=inv_freq.device), inv_freq, attention_factor)
            full = torch.stack(full_tables(cos, sin, self.layout), dim=1)  # (N, 2, R)
            first, _ = pair_slices(full.shape[-1], self.layout)
            entry = self.entry = (key, full[:, 0, first], full[:, 1, first], full)
        return entry

    def rows(self, inv_freq: torch.Tensor, attention_factor: float, offset: int, length: int):
        """``(cos, sin)``: rows ``offset .. offset + length - 1``, each ``(length, R/2)`` (views): no host sync."""
        entry = self.grown(inv_freq, attention_factor, offset + length)
        return entry[1][offset : offset + length], entry[2][offset : offset + length]

    def gathered(self, inv_freq: torch.Tensor, attention_factor: float, positions: torch.Tensor):
        """``(cos_full, sin_full)``: the full-width rows ``(*P, T, R)`` of integer CPU ``positions`` ``(*P, T)``
        read by index (one gather for both), or None where the cache does not serve them (a position past
        :attr:`limit`, or a negative one: the caller then checks and computes). Eager CPU calls only: an index out
        of range is an error there, not a device fault."""
        entry = self.grown(inv_freq, attention_factor, 1)
        try:
            rows = entry[3].index_select(0, positions.reshape(-1))
        except IndexError:
            if bool((positions < 0).any()):
                return None
            top = int(positions.max())
            if top >= self.limit:
                return None
            rows = self.grown(inv_freq, attention_factor, top + 1)[3].index_select(0, positions.reshape(-1))
        return rows.view(*positions.shape, 2, rows.shape[-1]).unbind(-2)


def serves_by_index(positions: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether integer ``positions`` may be read from the cache by index: on the CPU in eager calls (where reading
    the values costs no device sync and a bad index is an error, not a fault). The caller checks that its rope
    type is static."""
    return not (
        positions.device.type != "cpu"
        or x.device != positions.device
        or positions.is_floating_point()
        or torch.compiler.is_compiling()
        or positions.numel() == 0
    )
