"""Argument checks shared by every module, one per kind of argument; each raises ValueError or TypeError naming
the argument.

* whole numbers and sizes: :func:`require_int`, :func:`check_head_dim`, :func:`require_positive_number` (Python
  and numpy numbers alike);
* tensors: :func:`require_tensor`, :func:`require_real_floating` (what RoPE rotates);
* the sequence axis of a ``(B, H, T, D)`` or ``(B, T, H, D)`` tensor: :func:`check_seq_dim`;
* positions and times: :func:`as_positions` (``(L,)`` or ``(B, L)``), :func:`as_coordinates` (``(L, n)`` or
  ``(B, L, n)``), :func:`check_times` (any shape, a number allowed), :func:`as_float64` (real values as float64);
* frequency tables: :func:`check_inv_freq`;
* matrices: :func:`float_matrix` (data, float64), :func:`check_generator` (a generator ``X`` of ``exp(tX)``);
* memory layouts of RoPE's pairs: :func:`check_layout`.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

#: The memory layouts of RoPE's feature pairs (see :func:`posenc.rope.pair_indices`).
LAYOUTS = ("half", "interleaved")


def require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_real_floating(name: str, value) -> torch.Tensor:
    """A tensor of real floating-point numbers (float16, bfloat16, float32, float64): integer, bool and complex
    tensors are refused (a rotation of integers would be rounded away, a complex one would lose its imaginary part)."""
    require_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(
            f"{name} must be a real floating-point tensor (float16, bfloat16, float32 or float64), "
            f"got dtype {value.dtype}"
        )
    return value


def require_int(name: str, value, *, minimum: int | None = None, even: bool = False) -> int:
    """A whole number: a Python int or a numpy integer (returned as an int); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, numbers.Integral)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not isinstance(value, int):  # numpy integers (registered as numbers.Integral); a SymInt stays as it is
        value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even (rotations act on pairs of features), got {value}")
    return value


def check_head_dim(head_dim, name: str = "head_dim") -> int:
    """A head dimension of rotated pairs: an even int >= 2."""
    return require_int(name, head_dim, minimum=2, even=True)


def require_positive_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return float(value)


#: The sequence axes RoPE accepts: -2 for ``(..., H, T, D)`` (heads first, transformers' layout), -3 for
#: ``(..., T, H, D)`` (sequence first, flash-attn's and torchtune's layout).
SEQ_DIMS = (-2, -3)


def check_seq_dim(seq_dim, ndim: int, name: str = "seq_dim") -> int:
    """The sequence axis of a tensor with ``ndim`` dims, as a negative index: -2 or -3 (or their non-negative
    spellings ``ndim - 2``, ``ndim - 3``)."""
    given = require_int(name, seq_dim)
    axis = given - ndim if given >= 0 else given
    if axis not in SEQ_DIMS or ndim < -axis:
        raise ValueError(
            f"{name} must be -2 (x of shape (..., H, T, D)) or -3 (x of shape (..., T, H, D), which "
            f"needs 3 or more dims), got {given} for a tensor with {ndim} dims"
        )
    return axis


def check_layout(layout: str, name: str = "layout") -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{name} must be one of {LAYOUTS}, got {layout!r}")
    return layout


def inspectable(tensor: torch.Tensor) -> bool:
    """Whether checks that read the values may run: not on ``meta``, not while compiling."""
    return tensor.device.type != "meta" and not torch.compiler.is_compiling()


def _readable_per_call(tensor: torch.Tensor) -> bool:
    """Whether a check that runs on every call (the finiteness of positions) may read values: in eager calls on the
    CPU only. Reading a value back from an accelerator stalls it until its queue drains (a host sync), ``meta``
    tensors have no values, and a traced graph (``torch.compile``, ``torch.export``) cannot branch on them."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def _real_values(name: str, values, device, what: str = "integer or real numbers") -> torch.Tensor:
    """A list, tuple, range or tensor of integer or real numbers as a tensor; floats must be finite."""
    if isinstance(values, (list, tuple, range)):
        values = torch.as_tensor(list(values), device=device)
    require_tensor(name, values)
    if values.dtype == torch.bool or values.is_complex():
        raise TypeError(f"{name} must hold {what}, got dtype {values.dtype}")
    if values.is_floating_point() and _readable_per_call(values) and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} must be finite; it contains NaN or infinity")
    return values


def as_positions(name: str, positions, *, device=None, max_ndim: int = 2) -> torch.Tensor:
    """Turn ``positions`` into a tensor of shape ``(L,)`` or ``(B, L)`` and check it is finite.

    Integer and real positions are both accepted (continuous time is allowed). The shape and dtype are checked
    everywhere; the finiteness of real positions only in eager calls on the CPU (see :func:`_readable_per_call`).
    """
    positions = _real_values(name, positions, device)
    if positions.ndim == 0 or positions.ndim > max_ndim:
        raise ValueError(
            f"{name} must have shape (L,) or (B, L) (1 to {max_ndim} dims), got shape {tuple(positions.shape)}"
        )
    return positions


def as_coordinates(name: str, positions, n_axes: int, device=None) -> torch.Tensor:
    """N-D positions, one coordinate per axis: ``(L, n_axes)`` or ``(B, L, n_axes)``, integer or real, finite."""
    positions = _real_values(name, positions, device, "integer or real coordinates")
    if positions.ndim not in (2, 3) or positions.shape[-1] != n_axes:
        raise ValueError(
            f"{name} must have shape (L, {n_axes}) or (B, L, {n_axes}), one coordinate per axis, "
            f"got {tuple(positions.shape)}"
        )
    return positions


def coordinates_table(coordinates, n_axes: int) -> torch.Tensor | None:
    """A module's table of coordinates ``(N, n_axes)`` (integer or real, finite), copied; None stays None."""
    if coordinates is None:
        return None
    coordinates = as_coordinates("coordinates", coordinates, n_axes)
    if coordinates.ndim != 2:
        raise ValueError(f"coordinates must have shape (N, {n_axes}), got {tuple(coordinates.shape)}")
    return coordinates.clone()


def check_times(name: str, times, device=None, dtype=torch.float64) -> torch.Tensor:
    """``times`` (a Python number or a real tensor of any shape) as a finite tensor; a number becomes ``dtype``."""
    if isinstance(times, (int, float)) and not isinstance(times, bool):
        times = torch.tensor(float(times), device=device, dtype=dtype)
    return _real_values(name, times, device)


def as_float64(name: str, values, device=None) -> torch.Tensor:
    """Real values (a list, tuple, range or tensor of any shape) as a float64 tensor on ``device``."""
    return _real_values(name, values, device, "real numbers").to(dtype=torch.float64, device=device)


def check_inv_freq(
    name: str, inv_freq, *, pairs: int | None = None, max_pairs: int | None = None, floating: bool = False
) -> torch.Tensor:
    """A frequency table ``(P,)``, ``P >= 1``: exactly ``pairs`` entries, or at most ``max_pairs``; with
    ``floating`` a floating-point dtype."""
    require_tensor(name, inv_freq)
    if floating and (inv_freq.ndim != 1 or not inv_freq.is_floating_point()):
        raise ValueError(
            f"{name} must be a 1-D floating-point tensor (one frequency per pair), "
            f"got {inv_freq.dtype} {tuple(inv_freq.shape)}"
        )
    if inv_freq.ndim != 1 or inv_freq.numel() == 0:
        raise ValueError(f"{name} must have shape (P,) with P >= 1, got shape {tuple(inv_freq.shape)}")
    if pairs is not None and inv_freq.shape[0] != pairs:
        raise ValueError(f"{name} must have shape ({pairs},), got shape {tuple(inv_freq.shape)}")
    if max_pairs is not None and inv_freq.shape[0] > max_pairs:
        raise ValueError(
            f"{name} must have shape (P,) with 2 P <= head_dim = {2 * max_pairs}, got shape {tuple(inv_freq.shape)}"
        )
    return inv_freq


def check_frequencies(frequencies, name: str = "frequencies") -> torch.Tensor:
    """An N-D frequency table ``(P, n_axes)``: one frequency vector per pair."""
    require_tensor(name, frequencies)
    if frequencies.ndim != 2:
        raise ValueError(f"{name} must have shape (P, n_axes), got {tuple(frequencies.shape)}")
    return frequencies


def float_matrix(name: str, value, *, square: bool = False, dtype=torch.float64) -> torch.Tensor:
    """A real floating-point matrix ``(n, d)`` (``(n, n)`` with ``square``), ``n >= 2``, finite, cast to ``dtype``."""
    require_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a real floating-point tensor, got dtype {value.dtype}")
    if value.ndim != 2 or (square and value.shape[0] != value.shape[1]):
        shape = "(n, n)" if square else "(n, d)"
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    if value.shape[0] < 2:
        raise ValueError(f"{name} must describe at least 2 positions, got {value.shape[0]}")
    value = value.to(dtype)
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite; it contains NaN or infinity")
    return value


def check_generator(name: str, generator, *, batched: bool = False) -> torch.Tensor:
    """``generator`` as a real float tensor ``(D, D)`` (or ``(H, D, D)`` with ``batched``); finite."""
    require_tensor(name, generator)
    if generator.dtype == torch.bool or generator.is_complex():
        raise TypeError(f"{name} must be a real matrix, got dtype {generator.dtype}")
    shapes = "(D, D) or (H, D, D)" if batched else "(D, D)"
    if generator.ndim not in ((2, 3) if batched else (2,)) or generator.shape[-1] != generator.shape[-2]:
        raise ValueError(f"{name} must be a square matrix of shape {shapes}, got shape {tuple(generator.shape)}")
    if generator.shape[-1] == 0:
        raise ValueError(f"{name} must be at least 1 x 1, got shape {tuple(generator.shape)}")
    if not generator.is_floating_point():
        generator = generator.to(torch.float32)
    if generator.device.type != "meta" and not bool(torch.isfinite(generator).all()):
        raise ValueError(f"{name} must be finite; it contains NaN or infinity")
    return generator
