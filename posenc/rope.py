"""Rotary position embedding (RoPE): angles, the rotation itself in both memory layouts, and a module.

Shapes used throughout:

* ``x``: ``(..., L, D)``; usually ``(B, H, L, D)`` for queries or keys with heads first.
* ``positions``: ``(L,)`` or ``(B, L)``, integer or real (continuous time is allowed).
* ``inv_freq``: ``(R/2,)`` with ``R = rotary_dim <= D``; the first ``R`` features rotate, the rest pass through
  (partial rotary).
* ``cos``, ``sin``: ``(L, R/2)`` or ``(B, L, R/2)``: half-size tables, one entry per pair, float32.

Layouts. Pair ``i`` of a ``D``-vector is

* ``"half"`` (Hugging Face Llama, GPT-NeoX): features ``(i, i + R/2)``;
* ``"interleaved"`` (RoFormer, GPT-J, Meta's reference): features ``(2i, 2i + 1)``.

Angles, cos and sin are always float32, whatever the dtype of ``x``; the rotation of a bf16 or fp16 input
is carried out in float32 and rounded once at the end.

GPU. On CUDA the rotation is one fused Triton kernel (:mod:`posenc._triton_rope`: q and k in one launch, float32
math without fused multiply-adds, so equal to the formula bit for bit, 64-bit offsets, strides not copies, a
``torch.library`` custom op that ``torch.compile`` and ``torch.export`` keep as one node), whenever Triton imports
and is recent enough, the device runs the dtype (bf16 needs sm_80: a T4 takes the formula; decided once per device)
and ``POSENC_KERNEL`` is not ``formula``; tables that need a gradient take the formula. One dispatcher
(:func:`_route`) picks the path after one check of the arguments (remembered per shape signature in eager calls).

Speed (CPU). The rotation is written once, as the formula :func:`_rotation_formula` (bit for bit transformers'
``q * cos + rotate_half(q) * sin``). On a large input :func:`apply_rope` computes that same formula with the
blocked out= kernels of :mod:`posenc._rope_kernels` (all passes of the rotation over one cache-sized block at
a time; same values and gradients, bit for bit). ``compiled=True`` fuses the formula into one ``torch.compile``
kernel that reads ``x`` once and writes once, at a cost of seconds on its first call in a process.
:func:`apply_rope_` rotates in place. ``benchmarks/run.py`` (``make bench``) measures them against
transformers, rotary-embedding-torch and torchtune.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from ._checks import (
    LAYOUTS,
    as_positions,
    check_head_dim,
    check_inv_freq,
    check_layout,
    check_seq_dim,
    require_int,
    require_real_floating,
    require_tensor,
)
from ._rope_kernels import RotationEngine, tables_fit
from .encodings import PositionalEncoding
from .rope_types import DEFAULT_THETA, ROPE_TYPES, check_rope_parameters, rope_frequencies


def _pair_slices(rotary_dim: int, layout: str) -> tuple[slice, slice]:
    """Where the two members of every pair sit among the first ``rotary_dim`` features: the layout rule, once."""
    half = rotary_dim // 2
    if layout == "half":
        return slice(0, half), slice(half, 2 * half)
    return slice(0, 2 * half, 2), slice(1, 2 * half, 2)


def pair_indices(head_dim: int, layout: str = "half", device=None) -> torch.Tensor:
    """The two feature indices of every rotated pair.

    Args:
        head_dim: ``D``, an even int >= 2.
        layout: ``"half"`` or ``"interleaved"``.
        device: where the result lives.

    Returns:
        ``(D/2, 2)`` int64: row ``i`` is ``(i, i + D/2)`` for ``"half"`` and ``(2i, 2i + 1)`` for ``"interleaved"``.
    """
    check_head_dim(head_dim)
    check_layout(layout)
    features = torch.arange(head_dim, device=device)
    first, second = _pair_slices(head_dim, layout)
    return torch.stack((features[first], features[second]), dim=-1)


def rope_angles(positions, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles ``positions * inv_freq`` in float32.

    Args:
        positions: ``(L,)`` or ``(B, L)`` (a list or a tensor), any finite integer or real numbers (negative ones
            too: relative offsets ``m - n`` are angles as well).
        inv_freq: ``(R/2,)`` frequencies.

    Returns:
        ``(*P, L, R/2)`` float32 on ``inv_freq``'s device.
    """
    require_tensor("inv_freq", inv_freq)
    positions = as_positions("positions", positions, device=inv_freq.device)
    check_inv_freq("inv_freq", inv_freq)
    return positions[..., None].to(device=inv_freq.device, dtype=torch.float32) * inv_freq.float()


def rope_cos_sin(positions, inv_freq: torch.Tensor, attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-size float32 tables of :func:`rope_angles`.

    Args:
        positions: ``(L,)`` or ``(B, L)``, as for :func:`rope_angles`.
        inv_freq: ``(R/2,)``.
        attention_factor: a scale applied to both tables (YaRN's attention factor; 1 leaves them unscaled).

    Returns:
        ``(cos, sin)``, each ``(*P, L, R/2)`` float32, ready for :func:`apply_rope`.
    """
    angles = rope_angles(positions, inv_freq)
    if attention_factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def _align_table(table: torch.Tensor, x: torch.Tensor, axis: int = -2) -> torch.Tensor:
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


def _sequence_length_message(what: str, length: int, x_name: str, x, axis: int) -> str:
    message = (
        f"{what} {length} positions but {x_name} {tuple(x.shape)} has sequence length {x.shape[axis]} on "
        f"axis seq_dim={axis}"
    )
    other = -3 if axis == -2 else -2
    if x.ndim >= 3 and x.shape[other] == length:
        layout = "(B, T, H, D)" if other == -3 else "(B, H, T, D)"
        message += f"; axis {other} of {x_name} has length {length}: for a {layout} tensor pass seq_dim={other}"
    return message


def _check_apply(x, cos, sin, seq_dim, name: str = "x") -> int:
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
        raise ValueError(_sequence_length_message("cos/sin have", length, name, x, axis))
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


def _pairs(t: torch.Tensor, half: int, layout: str):
    """The two members of every rotated pair, as views ``(..., R/2)`` of ``t`` (one call each way: this runs
    several times per decode step)."""
    rotated = t if t.shape[-1] == 2 * half else t.narrow(-1, 0, 2 * half)
    if layout == "half":
        return rotated.chunk(2, -1)
    return rotated.unflatten(-1, (half, 2)).unbind(-1)


def _rotation_formula(x, cos, sin, layout):
    """The reference rotation: differentiable, traceable, and what ``compiled=True`` fuses into one pass."""
    half = cos.shape[-1]
    wide = x.dtype in (torch.float32, torch.float64)
    work = x if wide else x.float()
    x1, x2 = _pairs(work, half, layout)
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
# posenc._rope_kernels; they compute what _rotation_formula computes.
_ENGINE = RotationEngine(_rotation_formula, _pairs)


def _use_triton(x: torch.Tensor) -> bool:
    """CUDA inputs take the fused Triton kernel of :mod:`posenc._triton_rope` (imported only then), unless Triton is
    missing or too old, the device cannot run ``x``'s dtype (bf16 before sm_80; decided once per device), or
    ``POSENC_KERNEL=formula``; decided from the device and dtype alone, so no value is read on the host."""
    if not x.is_cuda:
        return False
    from . import _triton_rope

    return _triton_rope.use_triton(x)


def _triton():
    from . import _triton_rope

    return _triton_rope


#: Checked argument signatures -> sequence axis (eager calls only; shapes alone decide every check).
_CHECKED: dict = {}
_CHECKED_LIMIT = 4096


def _checked_axis(x, cos, sin, seq_dim, name: str = "x") -> int:
    """:func:`_check_apply`, remembered per shape signature in eager calls: the checks depend on the shapes,
    ``seq_dim`` and the argument's name only, so a repeated call (every decode step) pays a dict lookup."""
    require_real_floating(name, x)
    require_tensor("cos", cos)
    require_tensor("sin", sin)
    if torch.compiler.is_compiling() or not (seq_dim is None or type(seq_dim) is int):
        return _check_apply(x, cos, sin, seq_dim, name)
    key = (x.shape, cos.shape, sin.shape, seq_dim, name)
    axis = _CHECKED.get(key)
    if axis is None:
        axis = _check_apply(x, cos, sin, seq_dim, name)
        if len(_CHECKED) >= _CHECKED_LIMIT:
            _CHECKED.clear()
        _CHECKED[key] = axis
    return axis


def _full_tables(cos, sin, layout):
    """Half-size tables ``(..., R/2)`` widened to one entry per rotated feature ``(..., R)``: both members of a
    pair get their pair's entry (``(c, c)`` for ``"half"``, each entry twice for ``"interleaved"``)."""
    if layout == "half":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return torch.stack((cos, cos), -1).flatten(-2), torch.stack((sin, sin), -1).flatten(-2)


def _half_tables(cos_full, sin_full, layout):
    """The half-size tables ``(..., R/2)`` inside full-width ones (views): the first member of every pair."""
    half = cos_full.shape[-1] // 2
    if layout == "half":
        return cos_full[..., :half], sin_full[..., :half]
    return cos_full[..., ::2], sin_full[..., ::2]


def _route(q, k, cos, sin, layout: str, axis: int, compiled: bool, in_place: bool = False, full=None):
    """The one place that picks how checked arguments are rotated: the Triton kernel (CUDA), ``torch.compile``
    (``compiled=True``), the small-input pass with full-width tables (a decode step on the CPU) or the engine's
    default (blocked kernel or formula). ``k`` is None for one tensor; ``full``: the tables already widened to
    ``(..., R)`` (:func:`_full_tables`), not yet aligned, when the caller has them (then ``cos`` and ``sin`` may be
    None). Returns ``x_rot`` or ``(q_rot, k_rot)``."""
    if not compiled and _use_triton(q):
        triton_rope = _triton()
        if k is None and triton_rope.supports(q, cos, sin):
            return (triton_rope.rope_ if in_place else triton_rope.rope)(q, cos, sin, layout, axis)
        if k is not None and triton_rope.supports_qk(q, k, cos, sin):
            return triton_rope.rope_qk(q, k, cos, sin, layout, axis)
    if full is not None and not compiled:
        cos_full, sin_full = _align_table(full[0], q, axis), _align_table(full[1], q, axis)
        if _ENGINE.small_fits(q, k, cos_full, sin_full):
            if k is None:
                return _ENGINE.rotate_full(q, cos_full, sin_full, layout)
            return _ENGINE.rotate_full(q, cos_full, sin_full, layout), _ENGINE.rotate_full(
                k, cos_full, sin_full, layout
            )
    if cos is None:
        cos, sin = _half_tables(full[0], full[1], layout)
    cos, sin = _align_table(cos, q, axis), _align_table(sin, q, axis)
    if in_place:
        if not tables_fit(q, cos):
            raise ValueError(
                f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x of shape {tuple(q.shape)}; "
                "apply_rope_ cannot grow x in place"
            )
        if compiled and not torch.compiler.is_compiling():
            return _ENGINE.compiled_in_place(q, cos, sin, layout)
        return _ENGINE.rotate_in_place(q, cos, sin, layout)
    rotate: Callable[..., torch.Tensor]
    if compiled and not torch.compiler.is_compiling():
        rotate = _ENGINE.compiled
    else:
        if _ENGINE.small_fits(q, k, cos, sin):
            cos_full, sin_full = _full_tables(cos, sin, layout)
            if k is None:
                return _ENGINE.rotate_full(q, cos_full, sin_full, layout)
            return _ENGINE.rotate_full(q, cos_full, sin_full, layout), _ENGINE.rotate_full(
                k, cos_full, sin_full, layout
            )
        rotate = _ENGINE.rotate_default
    if k is None:
        return rotate(q, cos, sin, layout)
    if k.ndim != q.ndim:
        return rotate(q, cos, sin, layout), rotate(k, _align_table(cos, k, axis), _align_table(sin, k, axis), layout)
    return rotate(q, cos, sin, layout), rotate(k, cos, sin, layout)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    *,
    seq_dim: int | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """Rotate each feature pair of ``x`` by its angle.

    Args:
        x: ``(B, H, T, D)`` with ``seq_dim=-2`` (the default) or ``(B, T, H, D)`` with ``seq_dim=-3`` (any number
            of leading axes); real floating point (TypeError otherwise).
        cos, sin: ``(T, R/2)`` or ``(B, T, R/2)`` with ``R <= D`` (the first ``R`` features rotate, the rest pass
            through), usually float32 from :func:`rope_cos_sin`.
        layout: ``"half"`` (pairs ``(i, i + R/2)``) or ``"interleaved"`` (pairs ``(2i, 2i + 1)``).
        seq_dim: the sequence axis, -2 or -3.
        compiled: run a ``torch.compile``-fused kernel (one pass over memory; its first call in a process compiles
            for seconds, so it pays for large or repeated calls); it falls back to the eager kernel where compiling
            is not possible.

    Returns:
        A tensor shaped and typed like ``x``.

    Left unset, ``seq_dim`` is -2, and a 4-D ``x`` whose axes -3 and -2 both have the tables' length ``T > 1`` is
    refused as ambiguous (ValueError); tables whose length matches another axis than the sequence axis are
    refused with the ``seq_dim`` that would fit.
    """
    axis = _checked_axis(x, cos, sin, seq_dim)
    check_layout(layout)
    return _route(x, None, cos, sin, layout, axis, compiled)


def apply_rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    *,
    seq_dim: int | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`apply_rope` of queries and keys with one set of tables, in one call (one kernel launch on CUDA).

    Args:
        q: ``(B, H, T, D)`` (or ``(B, T, H, D)`` with ``seq_dim=-3``).
        k: ``(B, H_kv, T, D)`` (or ``(B, T, H_kv, D)``), any number of kv heads.
        cos, sin: ``(T, R/2)`` or ``(B, T, R/2)``, as for :func:`apply_rope`; checked against both once.
        layout, seq_dim, compiled: as for :func:`apply_rope`.

    Returns:
        ``(q_rot, k_rot)``, shaped and typed like ``q`` and ``k``.
    """
    axis = _checked_axis(q, cos, sin, seq_dim, "q")
    if _checked_axis(k, cos, sin, seq_dim, "k") != axis:  # pragma: no cover - both come from the same seq_dim
        raise ValueError("q and k must have the same sequence axis")
    check_layout(layout)
    return _route(q, k, cos, sin, layout, axis, compiled)


def apply_rope_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    *,
    seq_dim: int | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """:func:`apply_rope` in place: overwrite ``x`` with its rotation and return ``x``.

    Args:
        x, cos, sin, layout, seq_dim, compiled: as for :func:`apply_rope`; ``cos`` and ``sin`` must broadcast to
            ``x`` (not the other way round).

    Returns:
        ``x`` itself, rotated. Autograd sees an in-place copy.
    """
    axis = _checked_axis(x, cos, sin, seq_dim)
    check_layout(layout)
    return _route(x, None, cos, sin, layout, axis, compiled, in_place=True)


def _check_offset(offset, batch, name: str = "offset", check_sign: bool = True):
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
            _refuse_negative(name, offset)
        return offset[:, None]
    if isinstance(offset, torch.SymInt):  # a traced length (torch.compile with dynamic shapes)
        return offset
    offset = require_int(name, offset)
    if offset < 0:
        raise ValueError(f"{name} must be >= 0 (positions start at 0), got {offset}")
    return offset


def _refuse_negative(name: str, values: torch.Tensor) -> None:
    """Positions are >= 0: a negative one is refused where its value can be read for free (the CPU, eager)."""
    if (
        values.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and values.numel()
        and bool((values < 0).any())
    ):
        raise ValueError(f"{name} must be >= 0 (positions start at 0), got a minimum of {values.min().item()}")


def _varlen_positions(cu_seqlens, total, offset, device):
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
        offset = _check_offset(offset, cu_seqlens.shape[0] - 1)[:, 0].to(device)
        return positions + (offset[sequence] if offset.shape[0] > 1 else offset)
    return positions + _check_offset(offset, None)


def _default_positions(length, offset, device, batch):
    """``offset + arange(length)``: ``(T,)`` for an int offset, ``(B, T)`` for one offset per sequence."""
    offset = _check_offset(offset, batch)
    if isinstance(offset, torch.Tensor):
        return offset.to(device) + torch.arange(length, device=device)
    return torch.arange(length, device=device) + offset


def _batch_size(x, axis):
    return x.shape[0] if x.ndim + axis >= 1 else None


def rotate(
    x,
    positions=None,
    inv_freq=None,
    attention_factor: float = 1.0,
    layout: str = "half",
    offset=0,
    *,
    seq_dim: int | None = None,
    cu_seqlens=None,
) -> torch.Tensor:
    """RoPE in one call: rotate ``x`` at ``positions``.

    Args:
        x: ``(..., T, D)`` (or ``(..., T, H, D)`` with ``seq_dim=-3``), real floating point.
        positions: ``(T,)`` or ``(B, T)``, any finite integer or real numbers (a rotation by a negative angle is
            the inverse rotation; continuous time is allowed); default ``offset + arange(T)``.
        inv_freq: ``(R/2,)``; default the original RoPE frequencies (base 10000) for the whole head dimension.
        attention_factor: scale of the tables (YaRN's).
        layout: ``"half"`` or ``"interleaved"``.
        offset: an int >= 0 added to every position, or an integer tensor ``(B,)``: one offset per sequence
            (each sequence of a batch at its own place in its cache).
        seq_dim: the sequence axis, -2 or -3.
        cu_seqlens: ``(N + 1,)`` integer, for ``N`` sequences packed along the sequence axis (flash-attn's varlen
            form, e.g. ``x`` ``(total, H, D)`` with ``seq_dim=-3``): positions restart at 0 (plus ``offset[n]``)
            where each sequence starts; equal to rotating each sequence alone. Not together with ``positions``.

    Returns:
        A tensor shaped and typed like ``x``.

    A negative ``offset`` (a count of tokens already seen) is refused (ValueError); for a tensor this is checked
    where its values can be read without a device sync (on the CPU, in eager calls). :class:`RotaryEmbedding`,
    whose positions index tokens, refuses negative positions too.
    """
    require_real_floating("x", x)
    axis = -2 if seq_dim is None else check_seq_dim(seq_dim, x.ndim)
    if inv_freq is None:
        inv_freq, _ = rope_frequencies(x.shape[-1], device=x.device)
    if cu_seqlens is not None:
        if positions is not None:
            raise ValueError("pass either positions or cu_seqlens, not both")
        positions = _varlen_positions(cu_seqlens, x.shape[axis], offset, x.device)
    elif positions is None:
        positions = _default_positions(x.shape[axis], offset, x.device, _batch_size(x, axis))
    else:
        positions = as_positions("positions", positions, device=x.device)
        _check_positions(positions, x, axis)
        offset = _check_offset(offset, _batch_size(x, axis))
        if not (isinstance(offset, int) and offset == 0):
            positions = (
                positions + offset.to(positions.device) if isinstance(offset, torch.Tensor) else positions + offset
            )
    cos, sin = rope_cos_sin(positions, inv_freq.to(x.device), attention_factor)
    return apply_rope(x, cos, sin, layout, seq_dim=seq_dim)


def _check_positions(positions, x, axis, name="positions", x_name="x"):
    if positions.shape[-1] != x.shape[axis]:
        raise ValueError(
            _sequence_length_message(f"{name} {tuple(positions.shape)} hold", positions.shape[-1], x_name, x, axis)
        )
    if positions.ndim == 2 and x.ndim + axis >= 1 and positions.shape[0] not in (1, x.shape[0]):
        raise ValueError(
            f"{name} {tuple(positions.shape)} have batch size {positions.shape[0]} but {x_name} "
            f"{tuple(x.shape)} has batch size {x.shape[0]} on axis 0"
        )


def rope_matrix(position: float, inv_freq: torch.Tensor, layout: str = "half", head_dim: int | None = None):
    """The explicit block-diagonal rotation ``R(position)``: for teaching and testing, not for speed.

    Args:
        position: a real number.
        inv_freq: ``(R/2,)``.
        layout: ``"half"`` or ``"interleaved"``.
        head_dim: ``D >= R`` (default ``R``); features past ``R`` are left alone (identity rows).

    Returns:
        ``(D, D)`` float64; ``rotate(x, [p], inv_freq)`` equals ``x @ R(p).T``.
    """
    half = inv_freq.shape[-1]
    head_dim = 2 * half if head_dim is None else head_dim
    angles = float(position) * inv_freq.double()
    matrix = torch.eye(head_dim, dtype=torch.float64, device=inv_freq.device)
    first, second = pair_indices(2 * half, layout, device=inv_freq.device).unbind(-1)
    matrix[first, first] = angles.cos()
    matrix[second, second] = angles.cos()
    matrix[first, second] = -angles.sin()
    matrix[second, first] = angles.sin()
    return matrix


def interleaved_to_half_permutation(head_dim: int, device=None) -> torch.Tensor:
    """The permutation from the interleaved layout to the half layout.

    Args:
        head_dim: ``D``, an even int.
        device: where the result lives.

    Returns:
        ``perm`` ``(D,)`` int64 with ``x_half = x_interleaved[..., perm]``.
    """
    return pair_indices(head_dim, "interleaved", device=device).T.flatten()


def permute_qk_weight(weight: torch.Tensor, n_heads: int, to: str = "half") -> torch.Tensor:
    """Reorder the rows of a q or k projection so it feeds the other RoPE layout.

    Args:
        weight: ``(n_heads * D, d_in)``, or a bias ``(n_heads * D,)``.
        n_heads: the number of heads the rows hold.
        to: ``"half"`` converts interleaved-layout weights (Meta, GPT-J) to half-split (Hugging Face);
            ``"interleaved"`` is the inverse.

    Returns:
        A tensor shaped like ``weight`` with each head's rows permuted.
    """
    require_tensor("weight", weight)
    require_int("n_heads", n_heads, minimum=1)
    check_layout(to, "to")
    if weight.ndim not in (1, 2) or weight.shape[0] % n_heads:
        raise ValueError(
            f"weight must have shape (n_heads * D, d_in) with n_heads={n_heads}, got {tuple(weight.shape)}"
        )
    head_dim = weight.shape[0] // n_heads
    perm = interleaved_to_half_permutation(head_dim, device=weight.device)
    if to == "interleaved":
        perm = torch.argsort(perm)
    per_head = weight.reshape(n_heads, head_dim, *weight.shape[1:])
    return per_head[:, perm].reshape(weight.shape)


#: Positions up to which explicit CPU positions may read :class:`RotaryEmbedding`'s cached tables (or up to
#: ``max_position_embeddings`` when that is larger): the cache never grows past it for them.
CACHE_LIMIT = 1 << 16


class RotaryEmbedding(PositionalEncoding):
    """RoPE for a model, and RoPE's "qk" plug-in for :func:`posenc.attention`.

    ``forward(q, k, positions=None, offset=0, *, seq_dim=None) -> (q_rot, k_rot)`` with ``q``: ``(B, H, T, D)``
    and ``k``: ``(B, H_kv, T, D)``, or ``(B, T, H, D)`` and ``(B, T, H_kv, D)`` with ``seq_dim=-3`` (given here
    or once to the constructor); ``positions``: ``(T,)`` or ``(B, T)``, default ``offset + arange(T)``
    (``offset``: the number of tokens already in a KV cache). ``encode_qk(q, k, q_positions, k_positions)``
    rotates queries and keys at their own positions; it is the plug-in protocol of :mod:`posenc.encodings`,
    whose tensors are always ``(B, H, T, D)``. ``compiled=True`` rotates with the fused kernel of
    :func:`apply_rope`.

    Dtypes: ``inv_freq`` and the cos/sin tables stay float32 whatever ``.to(dtype)``, ``.half()`` or
    ``.bfloat16()`` does to the module; the outputs have the inputs' dtype.

    Tables. For the rope types whose table does not depend on the length, the tables of the default positions
    ``offset + arange(T)`` are cut from a cache of ``cos``/``sin`` rows ``(N, R/2)`` (``N`` a power of two,
    grown when ``offset + T`` passes it), rebuilt when ``inv_freq`` changes (device, dtype, values); integer
    ``positions`` and per-sequence offsets read the cache by index on the CPU in eager calls (a decode step's
    ``(B, 1)`` position ids: one gather of full-width rows), up to ``max(CACHE_LIMIT, max_position_embeddings)``
    positions (``CACHE_LIMIT`` = 65,536); real positions,
    accelerators and traced calls (``torch.compile``, ``torch.export``) compute their tables directly. The cached
    rows are the direct computation's numbers (tests/test_library_use.py, tests/test_rope_api.py).
    Per-sequence offsets (a ``(B,)`` tensor) and packed sequences (``cu_seqlens``) are taken by ``forward``;
    negative positions and offsets are refused (see ``forward``).
    Dynamic NTK and LongRoPE pick their table from ``seq_len``: the declared ``offset + T`` for default positions,
    otherwise ``max(positions) + 1`` as a tensor (no host sync, traceable).

    What is checked where: shapes, dtypes and the sequence axis on every call (free of host syncs; in eager calls
    remembered per shape signature); the finiteness of float positions and the sign of tensor positions and
    offsets only in eager calls on the CPU (reading values back from an accelerator would stall it, and a traced
    graph cannot branch on values); the ambiguity of an unset ``seq_dim`` only in eager calls.
    """

    kind = "qk"
    _fixed_dtype_buffers = ("inv_freq",)
    inv_freq: torch.Tensor  # (R/2,) float32, a non-persistent buffer

    def __init__(
        self,
        head_dim: int,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 2048,
        layout: str = "half",
        compiled: bool = False,
        seq_dim: int | None = None,
    ):
        super().__init__()
        head_dim = check_head_dim(head_dim)
        max_position_embeddings = require_int("max_position_embeddings", max_position_embeddings, minimum=1)
        if seq_dim is not None:
            seq_dim = require_int("seq_dim", seq_dim)
            if seq_dim not in (-2, -3):
                raise ValueError(f"seq_dim must be -2 ((B, H, T, D) inputs) or -3 ((B, T, H, D) inputs), got {seq_dim}")
        self.head_dim, self.layout, self.compiled, self.seq_dim = head_dim, check_layout(layout), compiled, seq_dim
        self.rope_parameters = check_rope_parameters(rope_parameters)  # legacy "type" becomes "rope_type"
        self.max_position_embeddings = max_position_embeddings
        self._rope_type = ROPE_TYPES[self.rope_parameters["rope_type"]]
        self._uses_seq_len = self._rope_type.uses_seq_len
        inv_freq, self.attention_factor = rope_frequencies(head_dim, self.rope_parameters, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # (key, cos (N, R/2), sin (N, R/2), full (N, 2, R)) for the static rope types: cos and sin are views of
        # full, which holds each row widened to one entry per feature (see _full_tables)
        self._table_cache: tuple | None = None
        self._checked: dict = {}  # (q.shape, k.shape, seq_dim) -> sequence axis, for eager calls

    if TYPE_CHECKING:  # what a type checker sees of module(q, k, ...): nn.Module's __call__ returns Any

        def __call__(
            self,
            q: torch.Tensor,
            k: torch.Tensor,
            positions=None,
            offset=0,
            *,
            seq_dim: int | None = None,
            cu_seqlens=None,
        ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def _frequencies_for(self, positions: torch.Tensor, seq_len=None):
        # dynamic NTK and LongRoPE pick their table from the length actually reached; rope_parameters were checked
        # once in __init__, so the rope type's function is called directly
        if self._uses_seq_len:
            if torch.compiler.is_compiling() or not isinstance(seq_len, int):
                # none declared (or a traced length): the longest position, as a tensor on the device
                top = positions.max()
                seq_len = (top.floor() if top.is_floating_point() else top).to(torch.int64) + 1
            parameters = self.rope_parameters
            if "rope_theta" not in parameters:
                parameters = {**parameters, "rope_theta": DEFAULT_THETA}
            return self._rope_type.function(
                self.head_dim, parameters, self.max_position_embeddings, seq_len, self.inv_freq.device
            )
        return self.inv_freq, self.attention_factor

    def cos_sin(self, positions, seq_len=None):
        """Tables for ``positions``.

        Args:
            positions: ``(*P, T)``, integer or real, >= 0.
            seq_len: an int or a 0-d integer tensor; default ``max(positions) + 1``; picks the dynamic NTK and
                LongRoPE tables.

        Returns:
            ``(cos, sin)``, each ``(*P, T, R/2)`` float32.
        """
        positions = as_positions("positions", positions, device=self.inv_freq.device)
        _refuse_negative("positions", positions)
        return self._cos_sin(positions, seq_len)

    def _cos_sin(self, positions, seq_len=None):
        # positions already checked: rope_cos_sin's arithmetic without its checks (a decode step pays them per call)
        inv_freq, attention_factor = self._frequencies_for(positions, seq_len)
        angles = positions[..., None].to(device=inv_freq.device, dtype=torch.float32) * inv_freq.float()
        if attention_factor == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * attention_factor, angles.sin() * attention_factor

    def _cache(self, end: int):
        """The table cache, grown to hold rows ``0 .. end - 1`` and rebuilt when ``inv_freq`` changes."""
        inv_freq = self.inv_freq
        key = (inv_freq.device, inv_freq.dtype, inv_freq.data_ptr(), inv_freq._version, self.attention_factor)
        cache = self._table_cache
        if cache is None or cache[0] != key or cache[1].shape[0] < end:
            size = 1 << max(6, (end - 1).bit_length())  # a power of two >= 64: growth is amortised
            cos, sin = rope_cos_sin(torch.arange(size, device=inv_freq.device), inv_freq, self.attention_factor)
            full = torch.stack(_full_tables(cos, sin, self.layout), dim=1)  # (N, 2, R)
            half = cos.shape[-1]
            first = slice(0, half) if self.layout == "half" else slice(0, 2 * half, 2)
            cache = self._table_cache = (key, full[:, 0, first], full[:, 1, first], full)
        return cache

    def _cached_cos_sin(self, offset: int, length: int):
        """Rows ``offset .. offset + length - 1`` of the cached tables (views): no host sync."""
        cache = self._cache(offset + length)
        return cache[1][offset : offset + length], cache[2][offset : offset + length]

    def _gathered(self, positions):
        """``(None, None, (cos_full, sin_full))``: the full-width tables ``(*P, T, R)`` of integer CPU ``positions``
        ``(*P, T)`` read from the cache by index (one gather for both), or None where the cache does not serve them (a
        position past it or
        negative: the caller then checks and computes). Eager CPU calls only: an index out of range is an error
        there, not a device fault."""
        limit = max(CACHE_LIMIT, self.max_position_embeddings)
        cache = self._table_cache
        if cache is None:
            cache = self._cache(64)
        try:
            rows = cache[3].index_select(0, positions.reshape(-1))
        except IndexError:
            if bool((positions < 0).any()):
                return None
            top = int(positions.max())
            if top >= limit:
                return None
            rows = self._cache(top + 1)[3].index_select(0, positions.reshape(-1))
        return None, None, rows.view(*positions.shape, 2, rows.shape[-1]).unbind(-2)

    def _check_qk(self, q, k, seq_dim) -> int:
        """Check ``q`` and ``k`` (dtypes, head dimension, sequence axis and lengths); return the sequence axis.
        Remembered per shape signature in eager calls."""
        require_real_floating("q", q)
        require_real_floating("k", k)
        seq_dim = self.seq_dim if seq_dim is None else seq_dim
        eager = not torch.compiler.is_compiling() and (seq_dim is None or type(seq_dim) is int)
        key = (q.shape, k.shape, seq_dim) if eager else None
        axis = self._checked.get(key) if eager else None
        if axis is not None:
            return axis
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.head_dim:
                raise ValueError(f"{name} must have head dimension {self.head_dim} (last axis), got {t.shape[-1]}")
        axis = -2 if seq_dim is None else check_seq_dim(seq_dim, q.ndim, "seq_dim")
        if k.ndim == q.ndim and k.shape[axis] != q.shape[axis]:
            message = (
                f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same length on the sequence axis "
                f"seq_dim={axis}"
            )
            other = -3 if axis == -2 else -2
            if q.ndim >= 3 and k.shape[other] == q.shape[other]:
                message += f"; they agree on axis {other}: if that is the sequence axis, pass seq_dim={other}"
            raise ValueError(message)
        if eager:
            if len(self._checked) >= 256:
                self._checked.clear()
            self._checked[key] = axis
        return axis

    def _tables(self, x, axis, positions, offset, cu_seqlens=None):
        """``(cos, sin, full)`` for ``x`` with sequence axis ``axis``: the half-size tables, or None and the
        full-width tables ``(cos_full, sin_full)`` where the cache served them by index (else ``full`` is None)."""
        length = x.shape[axis]
        if cu_seqlens is not None:
            if positions is not None:
                raise ValueError("pass either positions or cu_seqlens, not both")
            positions = _varlen_positions(cu_seqlens, length, offset, self.inv_freq.device)
            return (*self._cos_sin(positions), None)
        if positions is None:
            if not isinstance(offset, torch.Tensor):
                offset = _check_offset(offset, None)
                static = isinstance(length, int) and not self._uses_seq_len and not torch.compiler.is_compiling()
                if static and x.device == self.inv_freq.device:
                    return (*self._cached_cos_sin(offset, length), None)
                positions = torch.arange(length, device=self.inv_freq.device) + offset
                return (*self._cos_sin(positions, offset + length if isinstance(offset, int) else None), None)
            # the sign is checked below, on the positions (a gather refuses them for free)
            offset = _check_offset(offset, _batch_size(x, axis), check_sign=False).to(self.inv_freq.device)
            positions = offset if length == 1 else offset + torch.arange(length, device=offset.device)
            sign_name = "offset"
        else:
            positions = as_positions("positions", positions, device=self.inv_freq.device)
            _check_positions(positions, x, axis, x_name="q")
            offset = _check_offset(offset, _batch_size(x, axis))
            if isinstance(offset, torch.Tensor):
                positions = positions + offset.to(positions.device)
            elif offset:
                positions = positions + offset
            sign_name = "positions"
        if self._serves_by_index(positions, x):
            gathered = self._gathered(positions)
            if gathered is not None:
                return gathered
        _refuse_negative(sign_name, positions)
        return (*self._cos_sin(positions), None)

    def _serves_by_index(self, positions, x) -> bool:
        """Whether integer ``positions`` may be read from the cache by index: static rope types, on the CPU in
        eager calls (where reading the values costs no device sync and a bad index is an error, not a fault)."""
        return not (
            self._uses_seq_len
            or positions.device.type != "cpu"
            or x.device != positions.device
            or positions.is_floating_point()
            or torch.compiler.is_compiling()
            or positions.numel() == 0
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions=None, offset=0, *, seq_dim: int | None = None, cu_seqlens=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys at their positions.

        Args:
            q: ``(B, H, T, D)``, or ``(B, T, H, D)`` with ``seq_dim=-3``; real floating point, ``D = head_dim``.
            k: ``(B, H_kv, T, D)`` or ``(B, T, H_kv, D)``, any number of kv heads.
            positions: ``(T,)`` or ``(B, T)`` (transformers' ``position_ids``), integer or real, >= 0; default
                ``offset + arange(T)``.
            offset: an int >= 0 (the number of tokens already in a KV cache), or an integer tensor ``(B,)``: one
                offset per sequence (batched decoding with sequences at different lengths); added to
                ``positions`` when those are given.
            seq_dim: the sequence axis, -2 or -3 (default: the constructor's, else -2).
            cu_seqlens: ``(N + 1,)`` integer: ``N`` sequences packed along the sequence axis (flash-attn's varlen
                form, ``q`` ``(total, H, D)`` with ``seq_dim=-3``); positions restart at 0 (plus ``offset[n]``)
                at each start, equal to rotating each sequence alone. Not together with ``positions``.

        Returns:
            ``(q_rot, k_rot)``, shaped and typed like ``q`` and ``k``.

        Negative positions or offsets are refused (ValueError) where their values can be read without a device
        sync (ints always; tensors on the CPU in eager calls).
        """
        axis = self._check_qk(q, k, seq_dim)
        cos, sin, full = self._tables(q, axis, positions, offset, cu_seqlens)
        if cos is None:
            cos, sin = _half_tables(full[0], full[1], self.layout)
        # the tables against q (and k): an ambiguous unset seq_dim, batch axes; remembered per shape signature
        _checked_axis(q, cos, sin, axis if seq_dim is None and self.seq_dim is not None else seq_dim, "q")
        if k.ndim != q.ndim:
            _checked_axis(k, cos, sin, axis if seq_dim is None and self.seq_dim is not None else seq_dim, "k")
        return _route(q, k, cos, sin, self.layout, axis, self.compiled, full=full)

    def encode_qk(self, q, k, q_positions, k_positions):
        q_cos, q_sin = self.cos_sin(q_positions)
        k_cos, k_sin = self.cos_sin(k_positions)
        return (
            apply_rope(q, q_cos, q_sin, self.layout, seq_dim=-2, compiled=self.compiled),
            apply_rope(k, k_cos, k_sin, self.layout, seq_dim=-2, compiled=self.compiled),
        )

    def extra_repr(self) -> str:
        seq = "" if self.seq_dim is None else f", seq_dim={self.seq_dim}"
        return f"head_dim={self.head_dim}, layout={self.layout!r}, rope_parameters={self.rope_parameters}{seq}"


__all__ = [
    "LAYOUTS",
    "pair_indices",
    "rope_angles",
    "rope_cos_sin",
    "apply_rope",
    "apply_rope_qk",
    "apply_rope_",
    "rotate",
    "rope_matrix",
    "interleaved_to_half_permutation",
    "permute_qk_weight",
    "RotaryEmbedding",
]
