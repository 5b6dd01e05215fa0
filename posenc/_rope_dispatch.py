"""How RoPE's rotation is computed once its arguments are known (private; the public API is :mod:`posenc.rope`).

* the formula, :func:`rotation_formula`, on tables already aligned with ``x`` (:func:`align_table`): the
  reference every faster path equals bit for bit; :func:`posenc.rope.rope_reference` is its public, checked form;
* the table layouts: half-size ``(..., R/2)`` and full-width ``(..., R)`` tables (:func:`full_tables`,
  :func:`half_tables`) and where each pair's members sit (:func:`pair_slices`, :func:`pairs`);
* the checks of ``x`` against its tables (:func:`check_apply`, remembered per shape signature by
  :func:`checked_axis`);
* :func:`route`, the one dispatcher: the Triton kernel on CUDA, ``torch.compile``, the small-input pass or the
  blocked kernels of :mod:`posenc._rope_kernels` (:data:`ENGINE`).

Shapes: ``x`` ``(..., T, D)`` (or ``(..., T, H, D)`` with the sequence axis -3); half-size tables ``(T, R/2)`` or
``(B, T, R/2)`` with ``R <= D``.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._checks import check_seq_dim, require_real_floating, require_tensor
from ._rope_kernels import RotationEngine, tables_fit


def pair_slices(rotary_dim: int, layout: str) -> tuple[slice, slice]:
    """Where the two members of every pair sit among the first ``rotary_dim`` features: the layout rule, once."""
    half = rotary_dim // 2
    if layout == "half":
        return slice(0, half), slice(half, 2 * half)
    return slice(0, 2 * half, 2), slice(1, 2 * half, 2)


def cos_sin_tables(positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0):
    """The arithmetic of :func:`posenc.rope.rope_cos_sin` for checked ``positions`` ``(*P, T)`` and ``inv_freq``
    ``(R/2,)``: ``(cos, sin)``, each ``(*P, T, R/2)`` float32 (a decode step pays no checks twice)."""
    angles = positions[..., None].to(device=inv_freq.device, dtype=torch.float32) * inv_freq.float()
    if attention_factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def align_table(table: torch.Tensor, x: torch.Tensor, axis: int = -2) -> torch.Tensor:
    """A table ``(L, R/2)`` or ``(B, L, R/2)`` as a view that broadcasts against ``x`` whose
    sequence axis is ``axis`` (-2 or -3): batch axes first, then ones, ``L`` on the sequence axis, ones after it
    (the head axis of ``(B, T, H, D)``). A table with ``x.ndim`` dims is taken as already aligned."""
    ndim = x.ndim
    batch = table.ndim - 2
    if table.ndim == ndim or (batch == 0 and axis == -2):
        return table
    ones_before = ndim + axis - batch
    shape = (*table.shape[:batch], *(1,) * ones_before, table.shape[-2], *(1,) * (-axis - 2), table.shape[-1])
    return table.view(shape)


def sequence_length_message(what: str, length: int, x_name: str, x, axis: int) -> str:
    message = (
        f"{what} {length} positions but {x_name} {tuple(x.shape)} has sequence length {x.shape[axis]} on "
        f"axis seq_dim={axis}"
    )
    other = -3 if axis == -2 else -2
    if x.ndim >= 3 and x.shape[other] == length:
        layout = "(B, T, H, D)" if other == -3 else "(B, H, T, D)"
        message += f"; axis {other} of {x_name} has length {length}: for a {layout} tensor pass seq_dim={other}"
    return message


def check_apply(x, cos, sin, seq_dim, name: str = "x") -> int:
    """Check ``x`` against its tables; return the sequence axis (-2 or -3)."""
    require_real_floating(name, x)
    require_tensor("cos", cos)
    require_tensor("sin", sin)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., T, D), got shape {tuple(x.shape)}")
    axis = -2 if seq_dim is None else check_seq_dim(seq_dim, x.ndim)
    if cos.ndim < 2 or cos.ndim > x.ndim:
        raise ValueError(
            f"cos must have shape (T, R/2) or (B, T, R/2), got {tuple(cos.shape)} for {name} {tuple(x.shape)}"
        )
    rotary_dim, head_dim = 2 * cos.shape[-1], x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"the head dimension of {name} (last axis) must be even, got {head_dim}")
    if rotary_dim > head_dim:
        raise ValueError(
            f"cos/sin cover {rotary_dim} features but {name} has head dimension {head_dim}; expected "
            f"2 * cos.shape[-1] <= D"
        )
    aligned = cos.ndim == x.ndim
    length = cos.shape[axis] if aligned else cos.shape[-2]
    if length != x.shape[axis]:
        raise ValueError(sequence_length_message("cos/sin have", length, name, x, axis))
    if not aligned and cos.ndim - 2 > x.ndim + axis:
        raise ValueError(
            f"cos/sin {tuple(cos.shape)} have batch axes but {name} {tuple(x.shape)} has none before "
            f"its sequence axis seq_dim={axis}"
        )
    if seq_dim is None and x.ndim >= 4 and not aligned and not torch.compiler.is_compiling():
        if length > 1 and x.shape[-3] == length:
            raise ValueError(
                f"ambiguous sequence axis: cos/sin have {length} positions and both axis -2 and axis -3 "
                f"of {name} {tuple(x.shape)} have length {length}; pass seq_dim=-2 for a (B, H, T, D) "
                f"tensor or seq_dim=-3 for a (B, T, H, D) tensor"
            )
    return axis


def pairs(t: torch.Tensor, half: int, layout: str):
    """The two members of every rotated pair, as views ``(..., R/2)`` of ``t`` (one call each way: this runs
    several times per decode step)."""
    rotated = t if t.shape[-1] == 2 * half else t.narrow(-1, 0, 2 * half)
    if layout == "half":
        return rotated.chunk(2, -1)
    return rotated.unflatten(-1, (half, 2)).unbind(-1)


def rotation_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """The rotation, written once: ``x`` ``(..., T, D)`` with half-size tables aligned to it (:func:`align_table`),
    ``x1 cos - x2 sin`` and ``x2 cos + x1 sin`` per pair (bit for bit transformers' ``q * cos + rotate_half(q) *
    sin``), float32 math for narrower dtypes. Differentiable, traceable, and what ``compiled=True`` fuses."""
    half = cos.shape[-1]
    wide = x.dtype in (torch.float32, torch.float64)
    work = x if wide else x.float()
    x1, x2 = pairs(work, half, layout)
    first = x1 * cos - x2 * sin
    second = x2 * cos + x1 * sin
    if first.dtype != x.dtype:  # each half is rounded to x.dtype before it is joined: inductor then writes both
        first, second = first.to(x.dtype), second.to(x.dtype)  # halves in one loop
    if layout == "half":
        rotated = torch.cat((first, second), dim=-1)
    else:
        rotated = torch.stack((first, second), dim=-1).flatten(-2)
    if x.shape[-1] > 2 * half:
        rotated = torch.cat((rotated, x[..., 2 * half :].expand(*rotated.shape[:-1], -1)), dim=-1)
    return rotated


# The fast paths of the same formula (blocked out= kernels with their gradient, torch.compile) live in
# posenc._rope_kernels; they compute what rotation_formula computes.
ENGINE = RotationEngine(rotation_formula, pairs)


def _triton_for(x: torch.Tensor):
    """:mod:`posenc._triton_rope` (imported only then) for a CUDA ``x`` that takes the fused kernel, else None.
    Triton is not taken where it is missing or too old, where the device cannot run ``x``'s dtype (bf16 before
    sm_80; decided once per device) or under ``POSENC_KERNEL=formula``; decided from the device and dtype alone,
    so no value is read on the host."""
    if not x.is_cuda:
        return None
    from . import _triton_rope

    return _triton_rope if _triton_rope.use_triton(x) else None


#: Checked argument signatures -> sequence axis (eager calls only; shapes alone decide every check).
_CHECKED: dict = {}
_CHECKED_LIMIT = 4096


def checked_axis(x, cos, sin, seq_dim, name: str = "x") -> int:
    """:func:`check_apply`, remembered per shape signature in eager calls: the checks depend on the shapes,
    ``seq_dim`` and the argument's name only, so a repeated call (every decode step) pays a dict lookup."""
    require_real_floating(name, x)
    require_tensor("cos", cos)
    require_tensor("sin", sin)
    if torch.compiler.is_compiling() or not (seq_dim is None or type(seq_dim) is int):
        return check_apply(x, cos, sin, seq_dim, name)
    key = (x.shape, cos.shape, sin.shape, seq_dim, name)
    axis = _CHECKED.get(key)
    if axis is None:
        axis = check_apply(x, cos, sin, seq_dim, name)
        if len(_CHECKED) >= _CHECKED_LIMIT:
            _CHECKED.clear()
        _CHECKED[key] = axis
    return axis


def full_tables(cos, sin, layout):
    """Half-size tables ``(..., R/2)`` widened to one entry per rotated feature ``(..., R)``: both members of a
    pair get their pair's entry (``(c, c)`` for ``"half"``, each entry twice for ``"interleaved"``)."""
    if layout == "half":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return torch.stack((cos, cos), -1).flatten(-2), torch.stack((sin, sin), -1).flatten(-2)


def half_tables(cos_full, sin_full, layout):
    """The half-size tables ``(..., R/2)`` inside full-width ones (views): the first member of every pair."""
    half = cos_full.shape[-1] // 2
    if layout == "half":
        return cos_full[..., :half], sin_full[..., :half]
    return cos_full[..., ::2], sin_full[..., ::2]


def route(q, k, cos, sin, layout: str, axis: int, compiled: bool, in_place: bool = False, full=None):
    """The one place that picks how checked arguments are rotated: the Triton kernel (CUDA), ``torch.compile``
    (``compiled=True``), the small-input pass with full-width tables (a decode step on the CPU) or the engine's
    default (blocked kernel or formula). ``k`` is None for one tensor; ``full``: the tables already widened to
    ``(..., R)`` (:func:`full_tables`), not yet aligned, when the caller has them (then ``cos`` and ``sin`` may be
    None). Returns ``x_rot`` or ``(q_rot, k_rot)``."""
    triton_rope = None if compiled else _triton_for(q)
    if triton_rope is not None:
        if k is None and triton_rope.supports(q, cos, sin):
            return triton_rope.rope(q, cos, sin, layout, axis, in_place=in_place)
        if k is not None and triton_rope.supports_qk(q, k, cos, sin):
            return triton_rope.rope_qk(q, k, cos, sin, layout, axis)
    if full is not None and not compiled:
        cos_full, sin_full = align_table(full[0], q, axis), align_table(full[1], q, axis)
        if ENGINE.small_fits(q, k, cos_full, sin_full):
            return rotate_small(q, k, cos_full, sin_full, layout)
    if cos is None:
        cos, sin = half_tables(full[0], full[1], layout)
    cos, sin = align_table(cos, q, axis), align_table(sin, q, axis)
    if in_place:
        if not tables_fit(q, cos):
            raise ValueError(
                f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x of shape {tuple(q.shape)}; "
                "apply_rope_ cannot grow x in place"
            )
        if compiled and not torch.compiler.is_compiling():
            return ENGINE.compiled_in_place(q, cos, sin, layout)
        return ENGINE.rotate_in_place(q, cos, sin, layout)
    rotate: Callable[..., torch.Tensor]
    if compiled and not torch.compiler.is_compiling():
        rotate = ENGINE.compiled
    else:
        if ENGINE.small_fits(q, k, cos, sin):
            cos_full, sin_full = full_tables(cos, sin, layout)
            return rotate_small(q, k, cos_full, sin_full, layout)
        rotate = ENGINE.rotate_default
    if k is None:
        return rotate(q, cos, sin, layout)
    if k.ndim != q.ndim:
        return rotate(q, cos, sin, layout), rotate(k, align_table(cos, k, axis), align_table(sin, k, axis), layout)
    return rotate(q, cos, sin, layout), rotate(k, cos, sin, layout)


def rotate_small(q, k, cos_full, sin_full, layout):
    """The small-input pass (a decode step) of ``q``, and of ``k`` unless it is None, with full-width tables."""
    if k is None:
        return ENGINE.rotate_full(q, cos_full, sin_full, layout)
    return ENGINE.rotate_full(q, cos_full, sin_full, layout), ENGINE.rotate_full(k, cos_full, sin_full, layout)
