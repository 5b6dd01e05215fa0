"""Argument checks shared by every module: each raises ValueError or TypeError naming the argument."""
from __future__ import annotations

import math

import torch


def require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_int(name: str, value, *, minimum: int | None = None, even: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even (rotations act on pairs of features), got {value}")
    return value


def require_positive_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


def as_positions(name: str, positions, *, device=None, max_ndim: int = 2) -> torch.Tensor:
    """Turn ``positions`` into a tensor of shape ``(L,)`` or ``(B, L)`` and check it is finite.

    Integer and real positions are both accepted (continuous time is allowed).
    """
    if isinstance(positions, (list, tuple, range)):
        positions = torch.as_tensor(list(positions), device=device)
    require_tensor(name, positions)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"{name} must hold integer or real numbers, got dtype {positions.dtype}")
    if positions.ndim == 0 or positions.ndim > max_ndim:
        raise ValueError(
            f"{name} must have shape (L,) or (B, L) (1 to {max_ndim} dims), got shape {tuple(positions.shape)}"
        )
    checkable = positions.device.type != "meta" and not torch.compiler.is_compiling()
    if positions.is_floating_point() and checkable:
        if not bool(torch.isfinite(positions).all()):
            raise ValueError(f"{name} must be finite; it contains NaN or infinity")
    return positions
