"""RotaryEmbedding's memo of checked decode steps (a private engine of :class:`posenc.RotaryEmbedding`).

A decode step calls the module again and again with the same shapes: one new token per sequence, its positions or
offsets as a tensor. Once an eager CPU call with a given signature (shapes, dtypes, axes, the kind, shape and dtype
of its positions or offsets) has passed every check, been served by the table cache by index and been rotated by
the small-input pass, :class:`DecodeSteps` remembers the shape its gathered rows take; a later call with that
signature goes straight to one gather of the cache's rows and the same rotation, so the result is the same bit for
bit. The values are still checked there: the gather fails on a negative position or one past the cache, and the
call then takes the general path, which refuses the first and grows the cache or computes for the second.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._rope_dispatch import ENGINE, align_table, rotate_small


class DecodeSteps:
    """Signatures of checked decode steps -> the shape ``(..., 2, R)`` of their gathered rows aligned to ``q``."""

    limit = 256  # signatures kept before the memo starts again

    def __init__(self) -> None:
        self._shapes: dict = {}

    def __len__(self) -> int:
        return len(self._shapes)

    @staticmethod
    def key(module, q, k, positions, offset, seq_dim):
        """The signature of a call that the cache may serve by index (tensor positions with an int offset 0, or
        one tensor offset per sequence), or None: shapes, dtypes and axes, everything its checks read."""
        if not (seq_dim is None or type(seq_dim) is int):
            return None
        if positions is None:
            if not isinstance(offset, Tensor):
                return None
            by = offset
        elif isinstance(positions, Tensor) and type(offset) is int and offset == 0:
            by = positions
        else:
            return None
        return (q.shape, k.shape, q.dtype, k.dtype, seq_dim, module.seq_dim, by.shape, by.dtype, positions is None)

    def remember(self, module, q, k, positions, offset, seq_dim, axis: int, full) -> None:
        """After a checked eager call whose tables the cache gathered by index (``full``: the full-width cos and
        sin rows): remember its signature when the small-input pass rotated it."""
        key = self.key(module, q, k, positions, offset, seq_dim)
        if key is None or module.compiled or (positions is None and q.shape[axis] != 1):
            return
        cos_full, sin_full = align_table(full[0], q, axis), align_table(full[1], q, axis)
        if ENGINE.small_fits(q, k, cos_full, sin_full):
            if len(self._shapes) >= self.limit:
                self._shapes.clear()
            self._shapes[key] = (*cos_full.shape[:-1], 2, cos_full.shape[-1])

    def repeat(self, module, q, k, positions, offset, seq_dim):
        """``(q_rot, k_rot)`` for a call whose signature :meth:`remember` holds (a decode step after the first),
        else None. Shapes, dtypes and axes were checked for that signature; per call remain where the tensors
        live, the gradient mode and the values (one gather of the cache's rows)."""
        if torch.compiler.is_compiling() or not (isinstance(q, Tensor) and isinstance(k, Tensor)):
            return None  # traced calls never look the dict up (no guards on it); bad arguments get the checks
        key = self.key(module, q, k, positions, offset, seq_dim)
        shape = None if key is None else self._shapes.get(key)
        by = offset if positions is None else positions
        if (
            shape is None
            or module.compiled
            or not (q.is_cpu and k.is_cpu and by.is_cpu and module.inv_freq.is_cpu)
            or not ENGINE.records_nothing(q, k)
        ):
            return None
        rows = module._table_cache.grown(module.inv_freq, module.attention_factor, 1)[3]
        if rows.requires_grad:  # rows built from an inv_freq that wants a gradient: the general path decides
            return None
        try:
            rows = rows.index_select(0, by if by.ndim == 1 else by.reshape(-1))
        except IndexError:
            return None
        cos_full, sin_full = rows.view(shape).unbind(-2)
        return rotate_small(q, k, cos_full, sin_full, module.layout)
