"""The speed behind :func:`posenc.rope.apply_rope`: the same rotation, computed faster (private).

:mod:`posenc.rope` holds the mathematics (the rotation formula); this module holds three faster ways of
computing exactly that formula, chosen per call by :class:`RotationEngine`:

* **blocked out= kernels** (the default for large inputs). Written as transformers writes it, a rotation makes
  six elementwise passes over half-size data plus a ``cat``, each streaming from main memory on a large input.
  Here the tables are first widened to full rows, ``cos_full = (cos, cos)`` and ``sin_full = (sin, sin)``
  (interleaved layout: each entry twice), and the input is cut into blocks of about :data:`BLOCK_ELEMENTS`
  elements (on a long sequence, the same stretch of positions in several heads, so that the tables' rows are read
  once per block). Each block takes four passes while it is in cache: ``t = x * sin_full`` and
  ``out = x * cos_full`` over whole rows (long contiguous loops), then ``out1 -= t2`` and ``out2 += t1`` on the
  two halves. That is ``x1 cos - x2 sin`` and ``x2 cos + x1 sin`` with the formula's products, each rounded once,
  so the result is the same bit for bit, in every dtype (a bf16 or fp16 block is widened to float32 first and
  rounded once at the end). In place, ``t`` is taken before ``x`` is overwritten, so ``x`` is read and written
  once per block.
  Each pass runs over a whole block, so torch spreads it over its intra-op threads.
* below :data:`KERNEL_MIN_NUMEL` elements, with no gradient to record (a decode step), the same four passes over
  the whole tensor with full-width tables built once for q and k (:meth:`RotationEngine.rotate_full`; a
  :class:`posenc.RotaryEmbedding` gathers them from its cache): the formula's arithmetic in four operations per
  tensor, for inputs where the number of operations, not memory, is the cost;
* a custom autograd function around the blocked kernel: the gradient of a rotation is the rotation by the
  opposite angle, so the backward pass is the same fast kernel;
* ``torch.compile`` of the formula (``compiled=True``): one fused loop that reads ``x`` once and writes once.
  In place, large inputs take the blocked kernel instead (see :meth:`RotationEngine.compiled_in_place`).

There is no ``addcmul`` here: torch's CPU kernel fuses its multiply and add (one rounding instead of two), which
would change the result in the last bit.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import torch

from ._compile import CompiledFunction

# Below this many elements the plain formula is faster than the kernel (fewer Python-level calls).
KERNEL_MIN_NUMEL = 1 << 16
# Elements of x per block: large enough that the per-call overhead of the four passes is small and each pass is
# shared among torch's threads, small enough that a block, its output, the scratch and the tables' rows (about
# five blocks' worth) stay in the last-level cache. Measured against 2**16 ... 2**20 (make bench).
BLOCK_ELEMENTS = 1 << 19
# Elements of one head's run of a long sequence within a block (see _blocks): long enough for fast inner loops.
RUN_ELEMENTS = 1 << 15

_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def tables_fit(x, table) -> bool:
    """Whether ``x * table`` has the shape of ``x`` (the table broadcasts to ``x``, not the other way)."""
    return all(t in (1, n) for t, n in zip(reversed(table.shape[:-1]), reversed(x.shape[:-1])))


def _blocks(shape, target: int, run: int | None = None):
    """Index tuples (slices over the leading axes and the sequence axis) that cut a tensor of ``shape``
    ``(..., H, L, D)`` into blocks of at most ``max(target, D)`` elements.

    A long sequence is cut into runs of about ``run`` (default :data:`RUN_ELEMENTS`) elements per head, and a
    block takes the same run of as many heads as fit: tables that broadcast over heads then contribute one run to
    a block, not one per head. Short sequences are taken whole, several heads (and batch entries) per block, in
    memory order."""
    rows = max(1, min(shape[-2], (run or RUN_ELEMENTS) // shape[-1], target // shape[-1]))
    if rows == shape[-2] or len(shape) < 3:
        return _whole_blocks(shape, target)
    heads = max(1, min(shape[-3], target // (rows * shape[-1])))
    return (
        tuple(slice(i, i + 1) for i in outer) + (slice(h, h + heads), slice(r, r + rows))
        for outer in itertools.product(*map(range, shape[:-3]))
        for h in range(0, shape[-3], heads)
        for r in range(0, shape[-2], rows)
    )


def _whole_blocks(shape, target: int):
    """Blocks of whole rows of the leading axes, at most ``max(target, D)`` elements, in memory order."""

    def split(prefix, dim):
        inner = math.prod(shape[dim + 1 :])  # elements per index of this axis
        size = shape[dim]
        if dim == len(shape) - 1 or inner * size <= target:
            yield prefix
        elif inner > target and dim < len(shape) - 2:
            for i in range(size):
                yield from split(prefix + (slice(i, i + 1),), dim + 1)
        else:
            step = max(1, target // inner)
            for start in range(0, size, step):
                yield prefix + (slice(start, min(start + step, size)),)

    return split((), 0)


def _take(table, index):
    """The part of a (broadcasting) table that meets block ``index`` of x: broadcast axes stay whole."""
    return table[tuple(s if table.shape[d] != 1 else slice(None) for d, s in enumerate(index))]


class RotationEngine:
    """Fast paths for ``formula(x, cos, sin, layout)`` (tables already aligned to ``x``); ``pairs(t, half,
    layout)`` returns the two members of every rotated pair as views of ``t``."""

    def __init__(self, formula: Callable, pairs: Callable):
        self.formula, self.pairs = formula, pairs
        self.compiled = CompiledFunction(formula, self.rotate_default, dynamic=True, fullgraph=True)
        self._compiled_in_place = CompiledFunction(
            self.formula_in_place, self.rotate_in_place, dynamic=True, fullgraph=True
        )

    # ------------------------------------------------------------------------------------------ dispatch
    def kernel_fits(self, x, cos, sin) -> bool:
        """Whether the blocked kernel computes what the formula does: a large real x that keeps its shape, no
        traced or functorch-wrapped tensors, no gradient wanted for the tables."""
        return self._eager_fits(x, cos, sin) and x.numel() >= KERNEL_MIN_NUMEL

    def _eager_fits(self, x, cos, sin) -> bool:
        # traced first: under torch.compile/export the sizes are symbolic, and testing them would add guards (an
        # export constraint "T <= 511", a recompile when T crosses 512)
        return (
            not torch.compiler.is_compiling()
            and not _functorch_active()
            and x.is_floating_point()
            and tables_fit(x, cos)
            and not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))
        )

    def rotate_default(self, x, cos, sin, layout):
        if not self._eager_fits(x, cos, sin):
            return self.formula(x, cos, sin, layout)
        grad = torch.is_grad_enabled() and x.requires_grad
        if x.numel() >= KERNEL_MIN_NUMEL:
            if grad:
                return _Rotation.apply(x, cos, sin, layout, self)
            return self.rotate_into(torch.empty_like(x), x, cos, sin, layout)
        return self.formula(x, cos, sin, layout)

    def small_fits(self, q, k, cos, sin) -> bool:
        """Whether :meth:`rotate_full` serves ``q`` (and ``k``, or None): small eager inputs with no gradient to
        record and float32 tables (float64 for a float64 input), where the number of operations is the cost."""
        wide = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
        if cos.dtype != wide or sin.dtype != wide or not self._eager_fits(q, cos, sin):
            return False
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            return False
        if k is None:
            return q.numel() < KERNEL_MIN_NUMEL
        return (
            k.dtype == q.dtype and k.ndim == q.ndim and tables_fit(k, cos) and q.numel() + k.numel() < KERNEL_MIN_NUMEL
        )

    def records_nothing(self, q, k) -> bool:
        """The per-call half of :meth:`small_fits` for tables that need no gradient (a cache's rows): an eager
        call, no functorch transform, no gradient to record for ``q`` or ``k``."""
        return (
            not torch.compiler.is_compiling()
            and not _functorch_active()
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        )

    def rotate_full(self, x, cos_full, sin_full, layout):
        """The formula with full-width tables ``(..., R)`` (both members of a pair hold their pair's entry; built
        once for q and k): ``c = x cos`` and ``t = x sin`` over whole rows, then ``c1 -= t2`` and ``c2 += t1``:
        the formula's products and sums, each rounded once, so equal bit for bit. A bf16 or fp16 ``x`` is widened
        to float32 first and rounded once at the end (measured faster than mixed-dtype products or ``out=`` casts).
        Four operations per float32 tensor; no autograd."""
        rotary = cos_full.shape[-1]
        half = rotary // 2
        widen = x.dtype not in (torch.float32, torch.float64)
        work = x.float() if widen else x
        whole = x.shape[-1] == rotary
        head = work if whole else work.narrow(-1, 0, rotary)
        t = head * sin_full
        if widen and whole:  # the widened copy is ours: x cos is written over it (one allocation less)
            c = head.mul_(cos_full)
        else:
            c = head * cos_full
        c1, c2 = self.pairs(c, half, layout)
        t1, t2 = self.pairs(t, half, layout)
        c1.sub_(t2)
        c2.add_(t1)
        if not whole:  # the features that do not rotate pass through
            c = torch.cat((c, work[..., rotary:]), dim=-1)
        return c.to(x.dtype) if widen else c

    def kernel_fits_in_place(self, x, cos, sin) -> bool:
        """:meth:`kernel_fits`, and autograd has nothing to record for ``x`` (the kernel writes it directly)."""
        return self.kernel_fits(x, cos, sin) and not (torch.is_grad_enabled() and x.requires_grad)

    def compiled_in_place(self, x, cos, sin, layout):
        """``compiled=True`` in place: inputs large enough for the blocked kernel take it (it reads and writes each
        block once, in cache, and measured faster than inductor's in-place kernel in ``make bench``), smaller ones
        the fused kernel."""
        if self.kernel_fits_in_place(x, cos, sin):
            return self.rotate_into(x, x, cos, sin, layout)
        return self._compiled_in_place(x, cos, sin, layout)

    def formula_in_place(self, x, cos, sin, layout):
        return x.copy_(self.formula(x, cos, sin, layout))

    def rotate_in_place(self, x, cos, sin, layout):
        if self.kernel_fits_in_place(x, cos, sin):
            return self.rotate_into(x, x, cos, sin, layout)
        return self.formula_in_place(x, cos, sin, layout)

    # ------------------------------------------------------------------------------------------ the kernel
    def rotate_into(self, out, x, cos, sin, layout, block_elements: int | None = None):
        """Write the rotation of ``x`` into ``out`` (``x`` itself for in place), block by block; no autograd.

        ``cos``/``sin``: ``(..., L, R/2)``, broadcasting to ``x`` ``(..., L, D)``. Bit for bit the arithmetic of
        the formula. Off the CPU the whole tensor is one block.
        """
        half = cos.shape[-1]
        rotary = 2 * half
        cos_full, sin_full = (self.full_table(t, layout, x.ndim) for t in (cos, sin))
        work_dtype = torch.promote_types(
            torch.promote_types(x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32, cos.dtype),
            sin.dtype,
        )
        widen = work_dtype != x.dtype  # bf16, fp16 (or tables wider than x): wider arithmetic, rounded once
        target = max(block_elements or BLOCK_ELEMENTS, x.shape[-1])
        if x.device.type != "cpu":  # an accelerator runs each operation over the whole tensor
            target = max(x.numel(), 1)
        size = min(math.prod(x.shape[:-1]), target // x.shape[-1]) * rotary
        scratch = [torch.empty(size, dtype=work_dtype, device=x.device) for _ in range(2 if widen else 1)]
        with torch.no_grad():
            for index in _blocks(tuple(x.shape), target):
                xb, ob = x[index], out[index]
                if out is not x and x.shape[-1] > rotary:  # the features that do not rotate pass through
                    ob[..., rotary:].copy_(xb[..., rotary:])
                xb, ob = xb[..., :rotary], ob[..., :rotary]
                cb, sb = _take(cos_full, index), _take(sin_full, index)
                t = scratch[0][: xb.numel()].view(xb.shape)
                if widen:
                    w = scratch[1][: xb.numel()].view(xb.shape)
                    w.copy_(xb)
                    self._rotate_block(w, w, cb, sb, t, half, layout)
                    ob.copy_(w)
                else:
                    self._rotate_block(ob, xb, cb, sb, t, half, layout)
        return out

    def full_table(self, table, layout, ndim: int):
        """A half-size table ``(..., R/2)`` widened to one entry per rotated feature (both members of a pair get
        their pair's entry), with ``ndim`` axes: ``(1, ..., L, R)``, so that x's block indices index it too."""
        full = table.new_empty((1,) * (ndim - table.ndim) + table.shape[:-1] + (2 * table.shape[-1],))
        for member in self.pairs(full, table.shape[-1], layout):
            member.copy_(table)
        return full

    def _rotate_block(self, out, x, cos_full, sin_full, t, half, layout):
        """``out1 = x1 cos - x2 sin``, ``out2 = x2 cos + x1 sin`` in four passes (``out`` may be ``x``)."""
        torch.mul(x, sin_full, out=t)  # (x1 sin, x2 sin)
        torch.mul(x, cos_full, out=out)  # (x1 cos, x2 cos)
        out1, out2 = self.pairs(out, half, layout)
        t1, t2 = self.pairs(t, half, layout)
        out1.sub_(t2)
        out2.add_(t1)


class _Rotation(torch.autograd.Function):
    """The blocked kernel with its gradient: a rotation's transpose is the rotation by minus the angle."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout, engine):
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.engine = layout, engine
        return engine.rotate_into(torch.empty_like(x), x, cos, sin, layout)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _Rotation.apply(grad, cos, -sin, ctx.layout, ctx.engine), None, None, None, None
