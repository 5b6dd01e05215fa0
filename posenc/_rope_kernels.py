"""The speed behind :func:`posenc.rope.apply_rope`: the same rotation, computed faster (private).

:mod:`posenc.rope` holds the mathematics (the rotation formula); this module holds three faster ways of
computing exactly that formula, chosen per call by :class:`RotationEngine`:

* **blocked out= kernels** (the default for large inputs). An eager rotation makes six elementwise passes over
  half-size data (``x1 * cos``, ``x2 * sin``, a difference, and the same for the second half). On a large input
  each pass streams from main memory. Here the input is cut into blocks of about :data:`BLOCK_ELEMENTS`
  elements, and all passes run on one block while it is in cache, writing straight into the output (no
  ``cat``, half-size tables broadcast over heads, scratch buffers allocated once per call). The elementwise
  operations and their order are those of the formula, so the result is the same bit for bit, in every
  dtype (a bf16 or fp16 input is widened to float32 per block, and rounded once at the end).
* a custom autograd function around the blocked kernel: the gradient of a rotation is the rotation by the
  opposite angle, so the backward pass is the same fast kernel;
* ``torch.compile`` of the formula (``compiled=True``): one fused loop that reads ``x`` once and writes once.
  In place, large inputs take the blocked kernel instead (see :meth:`RotationEngine.compiled_in_place`).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from ._compile import CompiledFunction

# Below this many elements the plain formula is faster than the kernel (fewer Python-level calls).
KERNEL_MIN_NUMEL = 1 << 16
# Elements of x per block: a block, its output, the tables' rows and the scratch stay in a core's cache, and each
# operation on a block's half-size views (< 32768 elements, torch's grain size) runs serially in its worker thread,
# so that no operation opens a parallel region of its own (costly, and very slow on a loaded machine). Measured
# against 16k, 32k (with fewer, full-width operations), 128k and 256k elements.
BLOCK_ELEMENTS = 60_000

_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def tables_fit(x, table) -> bool:
    """Whether ``x * table`` has the shape of ``x`` (the table broadcasts to ``x``, not the other way)."""
    return all(t in (1, n) for t, n in zip(reversed(table.shape[:-1]), reversed(x.shape[:-1])))


def _blocks(shape, target: int):
    """Index tuples (slices over the leading axes and the sequence axis) that cut a tensor of ``shape``
    ``(..., L, D)`` into blocks of at most ``max(target, D)`` elements, in memory order of a contiguous tensor."""
    def split(prefix, dim):
        inner = math.prod(shape[dim + 1:])  # elements per index of this axis
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



def _rotate_pairs_into(x1, x2, cos, sin, out1, out2, tmp):
    """``out1 = x1 cos - x2 sin``, ``out2 = x2 cos + x1 sin`` in transformers' order of operations (``tmp``: scratch)."""
    torch.mul(x1, cos, out=out1)
    torch.mul(x2, sin, out=tmp)
    out1.sub_(tmp)
    torch.mul(x2, cos, out=out2)
    torch.mul(x1, sin, out=tmp)
    out2.add_(tmp)

class RotationEngine:
    """Fast paths for ``formula(x, cos, sin, layout)`` (tables already aligned to ``x``); ``pairs(t, half,
    layout)`` returns the two members of every rotated pair as views of ``t``."""

    def __init__(self, formula: Callable, pairs: Callable):
        self.formula, self.pairs = formula, pairs
        self.compiled = CompiledFunction(formula, self.rotate_default, dynamic=True, fullgraph=True)
        self._compiled_in_place = CompiledFunction(self.formula_in_place, self.rotate_in_place, dynamic=True,
                                                   fullgraph=True)

    # ------------------------------------------------------------------------------------------ dispatch
    def kernel_fits(self, x, cos, sin) -> bool:
        """Whether the blocked kernel computes what the formula does: a large real x that keeps its shape, no
        traced or functorch-wrapped tensors, no gradient wanted for the tables."""
        return (x.numel() >= KERNEL_MIN_NUMEL and x.is_floating_point() and tables_fit(x, cos)
                and not torch.compiler.is_compiling() and not _functorch_active()
                and not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)))

    def rotate_default(self, x, cos, sin, layout):
        if not self.kernel_fits(x, cos, sin):
            return self.formula(x, cos, sin, layout)
        if torch.is_grad_enabled() and x.requires_grad:
            return _Rotation.apply(x, cos, sin, layout, self)
        return self.rotate_into(torch.empty_like(x), x, cos, sin, layout)

    def compiled_in_place(self, x, cos, sin, layout):
        """``compiled=True`` in place: inputs large enough for the blocked kernel take it (it reads and writes each
        block once, in cache, and measured faster than inductor's in-place kernel in ``make bench``), smaller ones
        the fused kernel."""
        if self.kernel_fits(x, cos, sin) and not (torch.is_grad_enabled() and x.requires_grad):
            return self.rotate_into(x, x, cos, sin, layout)
        return self._compiled_in_place(x, cos, sin, layout)

    def formula_in_place(self, x, cos, sin, layout):
        return x.copy_(self.formula(x, cos, sin, layout))

    def rotate_in_place(self, x, cos, sin, layout):
        if self.kernel_fits(x, cos, sin) and not (torch.is_grad_enabled() and x.requires_grad):
            return self.rotate_into(x, x, cos, sin, layout)
        return self.formula_in_place(x, cos, sin, layout)

    # ------------------------------------------------------------------------------------------ the kernel
    def rotate_into(self, out, x, cos, sin, layout, block_elements: int | None = None,
                    threads: int | None = None):
        """Write the rotation of ``x`` into ``out`` (``x`` itself for in place), block by block; no autograd.

        ``cos``/``sin`` must broadcast to ``x``. Bit for bit the arithmetic of the formula. On the CPU the blocks
        are shared among ``threads`` workers (default ``torch.get_num_threads()``), each running its operations
        serially; other devices take the whole tensor as one block.
        """
        half = cos.shape[-1]
        cos = cos.reshape((1,) * (x.ndim - cos.ndim) + cos.shape)
        sin = sin.reshape(cos.shape)
        wide = x.dtype not in (torch.float32, torch.float64)  # bf16, fp16: float32 arithmetic, rounded once
        scratch_dtype = torch.promote_types(torch.promote_types(torch.float32 if wide else x.dtype, cos.dtype),
                                            sin.dtype)
        same_dtype = scratch_dtype == x.dtype
        target = max(block_elements or BLOCK_ELEMENTS, x.shape[-1])
        if x.device.type != "cpu":  # an accelerator runs each operation over the whole tensor, on its own stream
            target, threads = max(x.numel(), 1), 1
        block_pairs = min(math.prod(x.shape[:-1]), target // x.shape[-1]) * half
        blocks = list(_blocks(tuple(x.shape), target))
        threads = max(1, min(threads or torch.get_num_threads(), len(blocks)))
        grad_enabled, inference = False, torch.is_inference_mode_enabled()

        def work(share):
            scratch = [torch.empty(block_pairs, dtype=scratch_dtype, device=x.device)
                       for _ in range(2 if same_dtype else 3)]
            with torch.inference_mode(inference) if inference else torch.set_grad_enabled(grad_enabled):
                for index in share:
                    self._rotate_block(out, x, cos, sin, layout, half, index, scratch, same_dtype)

        if threads == 1:
            work(blocks)
        else:  # contiguous shares: each worker streams through its own part of memory
            shares = [blocks[i * len(blocks) // threads:(i + 1) * len(blocks) // threads] for i in range(threads)]
            futures = [_pool(threads - 1).submit(work, share) for share in shares[1:]]
            work(shares[0])
            for future in futures:
                future.result()
        return out

    def _rotate_block(self, out, x, cos, sin, layout, half, index, scratch, same_dtype):
        xb, ob = x[index], out[index]
        cb, sb = _take(cos, index), _take(sin, index)
        x1, x2 = self.pairs(xb, half, layout)
        o1, o2 = self.pairs(ob, half, layout)
        shape = x1.shape
        count = math.prod(shape)
        a, b = (s[:count].view(shape) for s in scratch[:2])
        in_place = out is x
        if same_dtype and not in_place:
            _rotate_pairs_into(x1, x2, cb, sb, o1, o2, a)
        elif same_dtype:  # in place: the first half waits in scratch until x1 has been used
            torch.mul(x1, cb, out=a)
            torch.mul(x2, sb, out=b)
            a.sub_(b)
            torch.mul(x1, sb, out=b)
            x2.mul_(cb).add_(b)
            x1.copy_(a)
        else:  # widened to float32 (or the tables' dtype), rounded once into out
            c = scratch[2][:count].view(shape)
            _rotate_pairs_into(x1, x2, cb, sb, a, c, b)
            o1.copy_(a)
            o2.copy_(c)
        if not in_place and xb.shape[-1] > 2 * half:
            ob[..., 2 * half:].copy_(xb[..., 2 * half:])


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    if workers not in _pools:
        _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="posenc-rope")
    return _pools[workers]


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
