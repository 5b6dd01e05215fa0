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
(``posenc._rope_dispatch.route``) picks the path after one check of the arguments (remembered per shape signature
in eager calls).

Speed (CPU). The rotation is written once, as a formula (bit for bit transformers'
``q * cos + rotate_half(q) * sin``); :func:`rope_reference` is that formula alone, the oracle of the tests. On a
large input :func:`apply_rope` computes that same formula with the
blocked out= kernels of :mod:`posenc._rope_kernels` (all passes of the rotation over one cache-sized block at
a time; same values and gradients, bit for bit). ``compiled=True`` fuses the formula into one ``torch.compile``
kernel that reads ``x`` once and writes once, at a cost of seconds on its first call in a process.
:func:`apply_rope_` rotates in place. ``benchmarks/run.py`` (``make bench``) measures them against
transformers, rotary-embedding-torch and torchtune.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

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
from ._rope_cache import CACHE_LIMIT, TableCache, serves_by_index
from ._rope_dispatch import (
    align_table,
    checked_axis,
    cos_sin_tables,
    half_tables,
    pair_slices,
    rotation_formula,
    route,
)
from ._rope_positions import (
    batch_size,
    check_offset,
    check_positions,
    default_positions,
    refuse_negative,
    varlen_positions,
)
from ._rope_steps import DecodeSteps
from .encodings import PositionalEncoding
from .rope_types import DEFAULT_THETA, ROPE_TYPES, check_rope_parameters, rope_frequencies


def pair_indices(head_dim: int, layout: str = "half", device=None) -> Tensor:
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
    first, second = pair_slices(head_dim, layout)
    return torch.stack((features[first], features[second]), dim=-1)


def rope_angles(positions, inv_freq: Tensor) -> Tensor:
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


def rope_cos_sin(positions, inv_freq: Tensor, attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """Half-size float32 tables of :func:`rope_angles`.

    Args:
        positions: ``(L,)`` or ``(B, L)``, as for :func:`rope_angles`.
        inv_freq: ``(R/2,)``.
        attention_factor: a scale applied to both tables (YaRN's attention factor; 1 leaves them unscaled).

    Returns:
        ``(cos, sin)``, each ``(*P, L, R/2)`` float32, ready for :func:`apply_rope`.
    """
    require_tensor("inv_freq", inv_freq)
    positions = as_positions("positions", positions, device=inv_freq.device)
    check_inv_freq("inv_freq", inv_freq)
    return cos_sin_tables(positions, inv_freq, attention_factor)


def rope_reference(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", *, seq_dim: int | None = None) -> Tensor:
    """The rotation written plainly in torch: the formula every path of :func:`apply_rope` equals bit for bit.

    For each pair ``(x1, x2)`` of the first ``R`` features (pairs as in :func:`pair_indices`) it returns
    ``(x1 cos - x2 sin, x2 cos + x1 sin)``, computed in float32 for narrower dtypes and rounded once; features past
    ``R`` pass through. No kernel, no cache, no ``torch.compile``: an oracle for tests and a definition to read.

    Args:
        x, cos, sin, layout, seq_dim: as for :func:`apply_rope` (``x`` ``(B, H, T, D)`` or ``(B, T, H, D)``,
            tables ``(T, R/2)`` or ``(B, T, R/2)``).

    Returns:
        A tensor shaped and typed like ``x``; differentiable in ``x``, ``cos`` and ``sin``.
    """
    axis = checked_axis(x, cos, sin, seq_dim)
    check_layout(layout)
    return rotation_formula(x, align_table(cos, x, axis), align_table(sin, x, axis), layout)


def apply_rope(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", *, seq_dim: int | None = None, compiled: bool = False
) -> Tensor:
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
    axis = checked_axis(x, cos, sin, seq_dim)
    check_layout(layout)
    return route(x, None, cos, sin, layout, axis, compiled)


def apply_rope_qk(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str = "half",
    *,
    seq_dim: int | None = None,
    compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """:func:`apply_rope` of queries and keys with one set of tables, in one call (one kernel launch on CUDA).

    Args:
        q: ``(B, H, T, D)`` (or ``(B, T, H, D)`` with ``seq_dim=-3``).
        k: ``(B, H_kv, T, D)`` (or ``(B, T, H_kv, D)``), any number of kv heads.
        cos, sin: ``(T, R/2)`` or ``(B, T, R/2)``, as for :func:`apply_rope`; checked against both once.
        layout, seq_dim, compiled: as for :func:`apply_rope`.

    Returns:
        ``(q_rot, k_rot)``, shaped and typed like ``q`` and ``k``.
    """
    axis = checked_axis(q, cos, sin, seq_dim, "q")
    if checked_axis(k, cos, sin, seq_dim, "k") != axis:  # pragma: no cover - both come from the same seq_dim
        raise ValueError("q and k must have the same sequence axis")
    check_layout(layout)
    return route(q, k, cos, sin, layout, axis, compiled)


def apply_rope_(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", *, seq_dim: int | None = None, compiled: bool = False
) -> Tensor:
    """:func:`apply_rope` in place: overwrite ``x`` with its rotation and return ``x``.

    Args:
        x, cos, sin, layout, seq_dim, compiled: as for :func:`apply_rope`; ``cos`` and ``sin`` must broadcast to
            ``x`` (not the other way round).

    Returns:
        ``x`` itself, rotated. Autograd sees an in-place copy.
    """
    axis = checked_axis(x, cos, sin, seq_dim)
    check_layout(layout)
    return route(x, None, cos, sin, layout, axis, compiled, in_place=True)


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
) -> Tensor:
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
        positions = varlen_positions(cu_seqlens, x.shape[axis], offset, x.device)
    elif positions is None:
        positions = default_positions(x.shape[axis], offset, x.device, batch_size(x, axis))
    else:
        positions = as_positions("positions", positions, device=x.device)
        check_positions(positions, x, axis)
        offset = check_offset(offset, batch_size(x, axis))
        if not (isinstance(offset, int) and offset == 0):
            positions = (
                positions + offset.to(positions.device) if isinstance(offset, torch.Tensor) else positions + offset
            )
    cos, sin = rope_cos_sin(positions, inv_freq.to(x.device), attention_factor)
    return apply_rope(x, cos, sin, layout, seq_dim=seq_dim)


def rope_matrix(position: float, inv_freq: Tensor, layout: str = "half", head_dim: int | None = None):
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


def interleaved_to_half_permutation(head_dim: int, device=None) -> Tensor:
    """The permutation from the interleaved layout to the half layout.

    Args:
        head_dim: ``D``, an even int.
        device: where the result lives.

    Returns:
        ``perm`` ``(D,)`` int64 with ``x_half = x_interleaved[..., perm]``.
    """
    return pair_indices(head_dim, "interleaved", device=device).T.flatten()


def permute_qk_weight(weight: Tensor, n_heads: int, to: str = "half") -> Tensor:
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
    rows are the direct computation's numbers (tests/test_rope_cache.py).
    Per-sequence offsets (a ``(B,)`` tensor) and packed sequences (``cu_seqlens``) are taken by ``forward``;
    negative positions and offsets are refused (see ``forward``).
    Dynamic NTK and LongRoPE pick their table from ``seq_len``: the declared ``offset + T`` for default positions,
    otherwise ``max(positions) + 1`` as a tensor (no host sync, traceable).

    What is checked where: shapes, dtypes and the sequence axis on every call (free of host syncs; in eager calls
    remembered per shape signature); the finiteness of float positions and the sign of tensor positions and
    offsets only in eager calls on the CPU (reading values back from an accelerator would stall it, and a traced
    graph cannot branch on values); the ambiguity of an unset ``seq_dim`` only in eager calls. A decode step whose
    signature (shapes, dtypes, axes, tensor positions or offsets) an earlier eager CPU call passed through these
    checks and served from the cache goes straight to the gather and the rotation (``posenc._rope_steps``); its
    values are still checked there: the gather fails on a negative position or one past the cache, and the call
    then takes the general path (which refuses the first and grows the cache or computes for the second).
    """

    kind = "qk"
    _fixed_dtype_buffers = ("inv_freq",)
    inv_freq: Tensor  # (R/2,) float32, a non-persistent buffer

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
        # rows of the static rope types' tables (posenc._rope_cache)
        self._table_cache = TableCache(self.layout, max(CACHE_LIMIT, max_position_embeddings))
        self._checked: dict = {}  # (q.shape, k.shape, seq_dim) -> sequence axis, for eager calls
        self._steps = DecodeSteps()  # checked decode-step signatures (posenc._rope_steps)

    if TYPE_CHECKING:  # what a type checker sees of module(q, k, ...): nn.Module's __call__ returns Any

        def __call__(
            self,
            q: Tensor,
            k: Tensor,
            positions=None,
            offset=0,
            *,
            seq_dim: int | None = None,
            cu_seqlens=None,
        ) -> tuple[Tensor, Tensor]: ...

    def _frequencies_for(self, positions: Tensor, seq_len=None):
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
        refuse_negative("positions", positions)
        return self._cos_sin(positions, seq_len)

    def _cos_sin(self, positions, seq_len=None):
        # positions already checked: rope_cos_sin's arithmetic without its checks (a decode step pays them per call)
        return cos_sin_tables(positions, *self._frequencies_for(positions, seq_len))

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
            positions = varlen_positions(cu_seqlens, length, offset, self.inv_freq.device)
            return (*self._cos_sin(positions), None)
        if positions is None:
            if not isinstance(offset, torch.Tensor):
                offset = check_offset(offset, None)
                static = isinstance(length, int) and not self._uses_seq_len and not torch.compiler.is_compiling()
                if static and x.device == self.inv_freq.device:
                    return (*self._table_cache.rows(self.inv_freq, self.attention_factor, offset, length), None)
                positions = torch.arange(length, device=self.inv_freq.device) + offset
                return (*self._cos_sin(positions, offset + length if isinstance(offset, int) else None), None)
            # the sign is checked below, on the positions (a gather refuses them for free)
            offset = check_offset(offset, batch_size(x, axis), check_sign=False).to(self.inv_freq.device)
            positions = offset if length == 1 else offset + torch.arange(length, device=offset.device)
            sign_name = "offset"
        else:
            positions = as_positions("positions", positions, device=self.inv_freq.device)
            check_positions(positions, x, axis, x_name="q")
            offset = check_offset(offset, batch_size(x, axis))
            if isinstance(offset, torch.Tensor):
                positions = positions + offset.to(positions.device)
            elif offset:
                positions = positions + offset
            sign_name = "positions"
        if not self._uses_seq_len and serves_by_index(positions, x):
            gathered = self._table_cache.gathered(self.inv_freq, self.attention_factor, positions)
            if gathered is not None:
                return None, None, gathered
        refuse_negative(sign_name, positions)
        return (*self._cos_sin(positions), None)

    def forward(
        self, q: Tensor, k: Tensor, positions=None, offset=0, *, seq_dim: int | None = None, cu_seqlens=None
    ) -> tuple[Tensor, Tensor]:
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
        if cu_seqlens is None and not self._uses_seq_len:
            repeated = self._steps.repeat(self, q, k, positions, offset, seq_dim)
            if repeated is not None:
                return repeated
        axis = self._check_qk(q, k, seq_dim)
        cos, sin, full = self._tables(q, axis, positions, offset, cu_seqlens)
        if cos is None:
            cos, sin = half_tables(full[0], full[1], self.layout)
        # the tables against q (and k): an ambiguous unset seq_dim, batch axes; remembered per shape signature
        checked_axis(q, cos, sin, axis if seq_dim is None and self.seq_dim is not None else seq_dim, "q")
        if k.ndim != q.ndim:
            checked_axis(k, cos, sin, axis if seq_dim is None and self.seq_dim is not None else seq_dim, "k")
        if full is not None:
            self._steps.remember(self, q, k, positions, offset, seq_dim, axis, full)
        return route(q, k, cos, sin, self.layout, axis, self.compiled, full=full)

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


__all__ = [  # sorted; posenc/__init__.py groups the package's names by chapter
    "LAYOUTS",
    "RotaryEmbedding",
    "apply_rope",
    "apply_rope_",
    "apply_rope_qk",
    "interleaved_to_half_permutation",
    "pair_indices",
    "permute_qk_weight",
    "rope_angles",
    "rope_cos_sin",
    "rope_matrix",
    "rope_reference",
    "rotate",
]
