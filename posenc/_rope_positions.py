"""The positions of RoPE's one-call API and module (private): offsets, packed sequences, default positions.

Used by :func:`posenc.rope.rotate` and :class:`posenc.rope.RotaryEmbedding`. Shapes: ``positions`` ``(T,)`` or
``(B, T)``; ``offset`` an int >= 0 or an integer tensor ``(B,)``; ``cu_seqlens`` ``(N + 1,)``.
"""

from __future__ import annotations

import torch

from ._checks import require_int, require_tensor
from ._rope_dispatch import sequence_length_message


def check_offset(offset, batch, name: str = "offset", check_sign: bool = True):
    """An int >= 0, or an integer tensor ``(B,)`` (one offset per sequence) whose ``B`` is ``batch`` or 1;
    negative values are refused (on the CPU in eager calls for a tensor: elsewhere reading them would stall the
    device). Returns the offset (an int, or a ``(B, 1)`` tensor that broadcasts against positions ``(T,)``)."""
    if isinstance(offset, torch.Tensor):
        if offset.dtype == torch.bool or offset.is_floating_point() or offset.is_complex():
            raise TypeError(f"{name} must be an int or an integer tensor (B,), got dtype {offset.dtype}")
        if offset.ndim == 0:
            offset = offset.reshape(1)
        if offset.ndim != 1 or (batch is not None and offset.shape[0] not in (1, batch)):
            raise ValueError(
                f"{name} must be an int or a tensor of shape (B,) with one offset per sequence "
                f"(B = {batch}), got shape {tuple(offset.shape)}"
            )
        if check_sign:
            refuse_negative(name, offset)
        return offset[:, None]
    if isinstance(offset, torch.SymInt):  # a traced length (torch.compile with dynamic shapes)
        return offset
    offset = require_int(name, offset)
    if offset < 0:
        raise ValueError(f"{name} must be >= 0 (positions start at 0), got {offset}")
    return offset


def refuse_negative(name: str, values: torch.Tensor) -> None:
    """Positions are >= 0: a negative one is refused where its value can be read for free (the CPU, eager)."""
    if (
        values.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and values.numel()
        and bool((values < 0).any())
    ):
        raise ValueError(f"{name} must be >= 0 (positions start at 0), got a minimum of {values.min().item()}")


def varlen_positions(cu_seqlens, total, offset, device):
    """Positions ``(total,)`` of sequences packed along one axis: ``i - cu_seqlens[n]`` for the ``i``-th packed
    token of sequence ``n`` (plus ``offset[n]``). Tensor operations only: no host sync, traceable."""
    require_tensor("cu_seqlens", cu_seqlens)
    if (
        cu_seqlens.ndim != 1
        or cu_seqlens.shape[0] < 2
        or cu_seqlens.is_floating_point()
        or cu_seqlens.dtype == torch.bool
        or cu_seqlens.is_complex()
    ):
        raise ValueError(
            f"cu_seqlens must be a 1-D integer tensor (N + 1,) of cumulative sequence lengths "
            f"starting at 0, got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():
        if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != total or bool((cu_seqlens.diff() < 0).any()):
            raise ValueError(
                f"cu_seqlens must start at 0, never decrease and end at the packed length {total}, "
                f"got {cu_seqlens.tolist()}"
            )
    cu_seqlens = cu_seqlens.to(device=device, dtype=torch.int64)
    index = torch.arange(total, device=device)
    sequence = torch.searchsorted(cu_seqlens[1:], index, right=True).clamp_(max=cu_seqlens.shape[0] - 2)
    positions = index - cu_seqlens[sequence]
    if isinstance(offset, torch.Tensor):
        offset = check_offset(offset, cu_seqlens.shape[0] - 1)[:, 0].to(device)
        return positions + (offset[sequence] if offset.shape[0] > 1 else offset)
    return positions + check_offset(offset, None)


def default_positions(length, offset, device, batch):
    """``offset + arange(length)``: ``(T,)`` for an int offset, ``(B, T)`` for one offset per sequence."""
    offset = check_offset(offset, batch)
    if isinstance(offset, torch.Tensor):
        return offset.to(device) + torch.arange(length, device=device)
    return torch.arange(length, device=device) + offset


def batch_size(x, axis):
    """The batch size of ``x`` (its axis 0) when ``x`` has an axis before the sequence axis ``axis``, else None."""
    return x.shape[0] if x.ndim + axis >= 1 else None


def check_positions(positions, x, axis, name="positions", x_name="x"):
    """Check positions ``(T,)`` or ``(B, T)`` against ``x``: its length on the sequence axis, its batch size."""
    if positions.shape[-1] != x.shape[axis]:
        raise ValueError(
            sequence_length_message(f"{name} {tuple(positions.shape)} hold", positions.shape[-1], x_name, x, axis)
        )
    if positions.ndim == 2 and x.ndim + axis >= 1 and positions.shape[0] not in (1, x.shape[0]):
        raise ValueError(
            f"{name} {tuple(positions.shape)} have batch size {positions.shape[0]} but {x_name} "
            f"{tuple(x.shape)} has batch size {x.shape[0]} on axis 0"
        )
