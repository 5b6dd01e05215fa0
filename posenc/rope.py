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

Speed. The rotation is written once, as the formula :func:`_rotation_formula` (bit for bit transformers'
``q * cos + rotate_half(q) * sin``). On a large input :func:`apply_rope` computes that same formula with the
blocked out= kernels of :mod:`posenc._rope_kernels` (all passes of the rotation over one cache-sized block at
a time; same values and gradients, bit for bit). ``compiled=True`` fuses the formula into one ``torch.compile``
kernel that reads ``x`` once and writes once, at a cost of seconds on its first call in a process.
:func:`apply_rope_` rotates in place. ``benchmarks/run.py`` (``make bench``) measures them against
transformers, rotary-embedding-torch and torchtune.
"""
from __future__ import annotations

import torch

from ._checks import LAYOUTS, as_positions, check_head_dim, check_inv_freq, check_layout, require_int, require_tensor
from ._rope_kernels import RotationEngine, tables_fit
from .encodings import PositionalEncoding
from .rope_frequencies import ROPE_TYPES, check_rope_parameters, rope_frequencies


def _pair_slices(rotary_dim: int, layout: str) -> tuple[slice, slice]:
    """Where the two members of every pair sit among the first ``rotary_dim`` features: the layout rule, once."""
    half = rotary_dim // 2
    if layout == "half":
        return slice(0, half), slice(half, 2 * half)
    return slice(0, 2 * half, 2), slice(1, 2 * half, 2)


def pair_indices(head_dim: int, layout: str = "half", device=None) -> torch.Tensor:
    """The two feature indices of every rotated pair, ``(head_dim / 2, 2)`` int64: row ``i`` is ``(i, i + D/2)``
    for ``"half"`` and ``(2i, 2i + 1)`` for ``"interleaved"``."""
    check_head_dim(head_dim)
    check_layout(layout)
    features = torch.arange(head_dim, device=device)
    first, second = _pair_slices(head_dim, layout)
    return torch.stack((features[first], features[second]), dim=-1)


def rope_angles(positions, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angle ``positions * inv_freq`` in float32: ``(*P, L)`` x ``(R/2,)`` -> ``(*P, L, R/2)``."""
    require_tensor("inv_freq", inv_freq)
    positions = as_positions("positions", positions, device=inv_freq.device)
    check_inv_freq("inv_freq", inv_freq)
    return positions[..., None].to(device=inv_freq.device, dtype=torch.float32) * inv_freq.float()


def rope_cos_sin(positions, inv_freq: torch.Tensor, attention_factor: float = 1.0):
    """Half-size float32 tables ``(cos, sin)``, each ``(*P, L, R/2)``, scaled by ``attention_factor``."""
    angles = rope_angles(positions, inv_freq)
    if attention_factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def _align_table(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # (B, L, R/2) tables meet (B, H, L, D) inputs: insert the head axes after the batch axis.
    while table.ndim < x.ndim and table.ndim >= 3:
        table = table.unsqueeze(1)
    return table


def _check_apply(x, cos, sin):
    require_tensor("x", x)
    require_tensor("cos", cos)
    require_tensor("sin", sin)
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., L, D), got shape {tuple(x.shape)}")
    if cos.ndim < 2 or cos.ndim > x.ndim:
        raise ValueError(f"cos must have shape (L, R/2) or (B, L, R/2), got {tuple(cos.shape)} for x {tuple(x.shape)}")
    rotary_dim, head_dim = 2 * cos.shape[-1], x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"the head dimension of x (last axis) must be even, got {head_dim}")
    if rotary_dim > head_dim:
        raise ValueError(
            f"cos/sin cover {rotary_dim} features but x has head dimension {head_dim}; expected 2 * cos.shape[-1] <= D"
        )
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin have {cos.shape[-2]} positions but x has sequence length {x.shape[-2]}")


def _pairs(t: torch.Tensor, half: int, layout: str):
    """The two members of every rotated pair, as views ``(..., R/2)`` of ``t``."""
    first, second = _pair_slices(2 * half, layout)
    return t[..., first], t[..., second]


def _rotation_formula(x, cos, sin, layout):
    """The reference rotation: differentiable, traceable, and what ``compiled=True`` fuses into one pass."""
    half = cos.shape[-1]
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    x1, x2 = _pairs(work, half, layout)
    # each half is rounded to x.dtype before it is joined: inductor then writes both halves in one loop
    first = (x1 * cos - x2 * sin).to(x.dtype)
    second = (x2 * cos + x1 * sin).to(x.dtype)
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


def _prepare(x, cos, sin, layout):
    check_layout(layout)
    _check_apply(x, cos, sin)
    return _align_table(cos, x), _align_table(sin, x)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half", *,
               compiled: bool = False) -> torch.Tensor:
    """Rotate each feature pair of ``x`` by its angle.

    ``x``: ``(..., L, D)``; ``cos``, ``sin``: ``(L, R/2)`` or ``(B, L, R/2)`` with ``R <= D``.
    Returns a tensor shaped and typed like ``x``. ``compiled=True`` runs a ``torch.compile``-fused kernel (one
    pass over memory; its first call in a process compiles for seconds, so it pays for large or repeated
    calls); it falls back to the eager kernel where compiling is not possible.
    """
    cos, sin = _prepare(x, cos, sin, layout)
    if compiled and not torch.compiler.is_compiling():
        return _ENGINE.compiled(x, cos, sin, layout)
    return _ENGINE.rotate_default(x, cos, sin, layout)


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half", *,
                compiled: bool = False) -> torch.Tensor:
    """:func:`apply_rope` in place: overwrite ``x`` with its rotation and return ``x``.

    ``cos`` and ``sin`` must broadcast to ``x`` (not the other way round). Autograd sees an in-place copy.
    """
    cos, sin = _prepare(x, cos, sin, layout)
    if not tables_fit(x, cos):
        raise ValueError(f"cos/sin of shape {tuple(cos.shape)} do not broadcast to x of shape {tuple(x.shape)}; "
                         "apply_rope_ cannot grow x in place")
    if compiled and not torch.compiler.is_compiling():
        return _ENGINE.compiled_in_place(x, cos, sin, layout)
    return _ENGINE.rotate_in_place(x, cos, sin, layout)


def rotate(x, positions=None, inv_freq=None, attention_factor: float = 1.0, layout: str = "half", offset=0):
    """RoPE in one call: ``x`` ``(..., L, D)`` rotated at ``positions`` (default ``offset + arange(L)``).

    ``inv_freq`` defaults to the original RoPE frequencies (base 10000) for the whole head dimension.
    """
    require_tensor("x", x)
    if inv_freq is None:
        inv_freq, _ = rope_frequencies(x.shape[-1], device=x.device)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device) + offset
    elif offset != 0:
        positions = as_positions("positions", positions, device=x.device) + offset
    cos, sin = rope_cos_sin(positions, inv_freq.to(x.device), attention_factor)
    return apply_rope(x, cos, sin, layout)


def rope_matrix(position: float, inv_freq: torch.Tensor, layout: str = "half", head_dim: int | None = None):
    """The explicit block-diagonal rotation ``R(position)``, shape ``(D, D)``, float64.

    ``rotate(x, [p], inv_freq)`` equals ``x @ R(p).T``; for teaching and testing, not for speed.
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
    """Index vector ``perm`` of shape ``(D,)``: ``x_half = x_interleaved[..., perm]``."""
    return pair_indices(head_dim, "interleaved", device=device).T.flatten()


def permute_qk_weight(weight: torch.Tensor, n_heads: int, to: str = "half") -> torch.Tensor:
    """Reorder the rows of a q or k projection ``(n_heads * D, d_in)`` so it feeds the other RoPE layout.

    ``to="half"`` converts interleaved-layout weights (Meta, GPT-J) to half-split (Hugging Face);
    ``to="interleaved"`` is the inverse. A bias of shape ``(n_heads * D,)`` is accepted too.
    """
    require_tensor("weight", weight)
    require_int("n_heads", n_heads, minimum=1)
    check_layout(to, "to")
    if weight.ndim not in (1, 2) or weight.shape[0] % n_heads:
        raise ValueError(f"weight must have shape (n_heads * D, d_in) with n_heads={n_heads}, got {tuple(weight.shape)}")
    head_dim = weight.shape[0] // n_heads
    perm = interleaved_to_half_permutation(head_dim, device=weight.device)
    if to == "interleaved":
        perm = torch.argsort(perm)
    per_head = weight.reshape(n_heads, head_dim, *weight.shape[1:])
    return per_head[:, perm].reshape(weight.shape)


class RotaryEmbedding(PositionalEncoding):
    """RoPE for a model, and RoPE's "qk" plug-in for :func:`posenc.attention`.

    ``forward(q, k, positions=None, offset=0) -> (q_rot, k_rot)`` with ``q``: ``(B, H, L, D)``, ``k``:
    ``(B, H_kv, L, D)``; ``positions``: ``(L,)`` or ``(B, L)``, default ``offset + arange(L)`` (``offset`` is the
    number of tokens already in a KV cache). ``encode_qk(q, k, q_positions, k_positions)`` rotates queries and keys
    at their own positions (the plug-in protocol of :mod:`posenc.encodings`). ``compiled=True`` rotates with the
    fused kernel of :func:`apply_rope`.
    """

    kind = "qk"
    _fixed_dtype_buffers = ("inv_freq",)

    def __init__(self, head_dim: int, rope_parameters: dict | None = None, max_position_embeddings: int = 2048,
                 layout: str = "half", compiled: bool = False):
        super().__init__()
        self.head_dim, self.layout, self.compiled = head_dim, check_layout(layout), compiled
        self.rope_parameters = check_rope_parameters(rope_parameters)  # legacy "type" becomes "rope_type"
        self.max_position_embeddings = max_position_embeddings
        inv_freq, self.attention_factor = rope_frequencies(head_dim, self.rope_parameters, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _frequencies_for(self, positions: torch.Tensor, seq_len: int | None = None):
        # dynamic NTK and LongRoPE pick their table from the length actually reached
        if ROPE_TYPES[self.rope_parameters["rope_type"]].uses_seq_len:
            if seq_len is None:  # read back from the positions: a device sync, impossible on meta tensors
                seq_len = int(positions.max()) + 1
            return rope_frequencies(self.head_dim, self.rope_parameters, self.max_position_embeddings,
                                    seq_len=seq_len, device=self.inv_freq.device)
        return self.inv_freq, self.attention_factor

    def cos_sin(self, positions, seq_len: int | None = None):
        """Tables for ``positions``; ``seq_len`` (default ``max(positions) + 1``) picks dynamic/LongRoPE frequencies."""
        positions = as_positions("positions", positions, device=self.inv_freq.device)
        inv_freq, attention_factor = self._frequencies_for(positions, seq_len)
        return rope_cos_sin(positions, inv_freq, attention_factor)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions=None, offset: int = 0):
        require_tensor("q", q)
        require_tensor("k", k)
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.head_dim:
                raise ValueError(f"{name} must have head dimension {self.head_dim} (last axis), got {t.shape[-1]}")
        seq_len = None
        if positions is None:
            positions = torch.arange(q.shape[-2], device=q.device) + offset
            seq_len = offset + q.shape[-2]
        elif offset:
            positions = as_positions("positions", positions, device=q.device) + offset
        cos, sin = self.cos_sin(positions, seq_len)
        return (apply_rope(q, cos, sin, self.layout, compiled=self.compiled),
                apply_rope(k, cos, sin, self.layout, compiled=self.compiled))

    def encode_qk(self, q, k, q_positions, k_positions):
        q_cos, q_sin = self.cos_sin(q_positions)
        k_cos, k_sin = self.cos_sin(k_positions)
        return (apply_rope(q, q_cos, q_sin, self.layout, compiled=self.compiled),
                apply_rope(k, k_cos, k_sin, self.layout, compiled=self.compiled))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, layout={self.layout!r}, rope_parameters={self.rope_parameters}"


__all__ = ["LAYOUTS", "pair_indices", "rope_angles", "rope_cos_sin", "apply_rope", "apply_rope_", "rotate", "rope_matrix",
           "interleaved_to_half_permutation", "permute_qk_weight", "RotaryEmbedding"]
