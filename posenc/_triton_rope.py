"""RoPE on the GPU: one fused Triton kernel for q and k, registered as a ``torch.library`` custom op (private).

One launch rotates queries and keys (any number of kv heads) with one set of tables: each program reads a block of
positions of one head, its ``cos``/``sin`` rows, computes ``x1 cos - x2 sin`` and ``x2 cos + x1 sin`` in float32
(float64 for a float64 input) and writes the result rounded once to the input's dtype: the formula of
:func:`posenc.rope.rope_reference`, element for element. Inputs are addressed by their strides, so a
``(B, T, H, D)`` tensor, a transposed view or a slice of a fused qkv projection is rotated where it lies, with no
copy. The backward pass is the same kernel with the sign of ``sin`` flipped (the inverse rotation).

The ops:

* ``posenc::rope_qk(q, k, cos, sin, interleaved, conjugate) -> (q_rot, k_rot)``: out of place;
* ``posenc::rope_qk_(q, k, cos, sin, interleaved, conjugate)``: in place (mutates ``q`` and ``k``).

``q``: ``(B, Hq, T, D)``, ``k``: ``(B, Hk, T, D)`` (any strides; :func:`rope_qk` takes ``seq_dim`` and hands the
kernel a permuted view), ``cos``/``sin``: ``(B or 1, T, R/2)`` float32 with ``R <= D`` (the first ``R`` features
rotate, the rest pass through). Both ops have fake implementations, so ``torch.compile(fullgraph=True)`` and
``torch.export`` see one op and never trace into Triton. Nothing here reads a tensor's values on the host.

Triton is optional: :data:`AVAILABLE` says whether it imports. With ``TRITON_INTERPRET=1`` its interpreter runs the
same kernel on CPU tensors, which is how the tests check it without a GPU.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

AVAILABLE = triton is not None
#: ``POSENC_KERNEL=formula`` turns the Triton path off everywhere (the plain formula runs instead).
KERNEL_ENV = "POSENC_KERNEL"
#: The device types the kernel is launched on (the tests add ``"cpu"`` to run the dispatch under the interpreter).
DEVICE_TYPES = ("cuda",)
#: The oldest Triton the kernel is run with (``enable_fp_fusion`` as a launch option, int64 index arithmetic).
MIN_TRITON = (3, 0)
#: Compute capability the kernel needs: bfloat16 arithmetic from sm_80 (Ampere) on; other dtypes from sm_70.
MIN_CAPABILITY = {torch.bfloat16: (8, 0)}
DEFAULT_MIN_CAPABILITY = (7, 0)


def _triton_version() -> tuple[int, ...]:
    numbers = []
    for part in (triton.__version__ if AVAILABLE else "0").split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers)


#: Compute capability per CUDA device index, read once (all devices when this module is first imported, so that a
#: call traced by ``torch.compile`` only reads this dict).
_CAPABILITIES: dict = {}
if AVAILABLE and torch.cuda.is_available():
    for _index in range(torch.cuda.device_count()):
        _CAPABILITIES[_index] = torch.cuda.get_device_capability(_index)


def _capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability; a device that is not CUDA (the interpreter's CPU) counts as capable."""
    if device.type != "cuda":
        return (99, 0)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPABILITIES:
        _CAPABILITIES[index] = torch.cuda.get_device_capability(index)
    return _CAPABILITIES[index]


#: (device type, index, dtype) -> whether the kernel runs there: the decision, made once per device and dtype.
_CAPABLE: dict = {}


def capable(device_type: str, device_index: int | None, dtype: torch.dtype) -> bool:
    """Whether the kernel runs ``dtype`` on this device: Triton new enough and the compute capability it needs
    (bfloat16 before sm_80, e.g. a T4, takes the formula instead). Decided once per device and dtype (a plain
    dict, which ``torch.compile`` reads without a graph break)."""
    key = (device_type, device_index, dtype)
    decision = _CAPABLE.get(key)
    if decision is None:
        if not AVAILABLE or _triton_version() < MIN_TRITON:
            decision = False
        else:
            device = torch.device(device_type) if device_index is None else torch.device(device_type, device_index)
            decision = _capability(device) >= MIN_CAPABILITY.get(dtype, DEFAULT_MIN_CAPABILITY)
        _CAPABLE[key] = decision
    return decision


def use_triton(x: Tensor) -> bool:
    """Whether :func:`posenc.rope.apply_rope` sends ``x`` to the Triton kernel: a CUDA tensor, Triton importable
    and recent enough, a device that runs ``x``'s dtype (:func:`capable`, cached), and ``POSENC_KERNEL`` not set
    to ``formula``. Decided from the device and dtype alone, never from values."""
    device = x.device
    return (
        AVAILABLE
        and device.type in DEVICE_TYPES
        and os.environ.get(KERNEL_ENV, "") != "formula"
        and capable(device.type, device.index, x.dtype)
    )


if AVAILABLE:

    @triton.jit
    def _rotate_rows(X, OUT, row, out_row, first, second, s_d, so_d, cos, sin, mask, WIDE: tl.constexpr):
        """Rotate the pairs ``(first, second)`` of a block of rows: ``row``/``out_row`` address each row's start in
        ``X`` and ``OUT``, ``s_d``/``so_d`` step one feature. The formula's products and sums, each rounded once: the
        launch turns contraction into FMAs off (``enable_fp_fusion=False``), which the GPU compiler would otherwise
        do (1 ulp off the formula)."""
        x1 = tl.load(X + row + first[None, :] * s_d, mask=mask, other=0.0)
        x2 = tl.load(X + row + second[None, :] * s_d, mask=mask, other=0.0)
        out_dtype = x1.dtype
        if WIDE:
            x1, x2 = x1.to(tl.float64), x2.to(tl.float64)
        else:
            x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(OUT + out_row + first[None, :] * so_d, (x1 * cos - x2 * sin).to(out_dtype), mask=mask)
        tl.store(OUT + out_row + second[None, :] * so_d, (x2 * cos + x1 * sin).to(out_dtype), mask=mask)

    # fmt: off
    @triton.jit
    def _rope_kernel(
        Q, K, COS, SIN, Q_OUT, K_OUT, n_q_heads, n_heads, seq_len,
        sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,  # q, k: (B, H, T, D) strides
        soq_b, soq_h, soq_t, soq_d, sok_b, sok_h, sok_t, sok_d,  # their outputs'
        sc_b, sc_t, sc_p,  # the tables' (B or 1, T, R/2)
        HALF: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, WIDE: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        # fmt: on
        # program (b * n_heads + head, t block): heads 0 .. n_q_heads-1 are q's, the rest k's. Every index is
        # int64 before it meets a stride, so no offset b * stride_b + head * stride_h + t * stride_t + ... wraps at
        # 2**31 (a (66, 32, 8192, 128) tensor has 2.2e9 elements; each stride alone fits in 32 bits)
        pid_bh = tl.program_id(0).to(tl.int64)
        b = pid_bh // n_heads
        head = pid_bh % n_heads
        t = tl.program_id(1).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
        p = tl.arange(0, BLOCK_P).to(tl.int64)
        mask = (t[:, None] < seq_len) & (p[None, :] < HALF)
        table = b * sc_b + t[:, None] * sc_t + p[None, :] * sc_p
        cos = tl.load(COS + table, mask=mask, other=0.0)
        sin = tl.load(SIN + table, mask=mask, other=0.0)
        if WIDE:
            cos = cos.to(tl.float64)
            sin = sin.to(tl.float64)
        if CONJUGATE:
            sin = -sin
        if INTERLEAVED:
            first, second = 2 * p, 2 * p + 1
        else:
            first, second = p, p + HALF
        if head < n_q_heads:
            row, out_row = b * sq_b + head * sq_h + t[:, None] * sq_t, b * soq_b + head * soq_h + t[:, None] * soq_t
            _rotate_rows(Q, Q_OUT, row, out_row, first, second, sq_d, soq_d, cos, sin, mask, WIDE)
        else:
            kh = head - n_q_heads
            row, out_row = b * sk_b + kh * sk_h + t[:, None] * sk_t, b * sok_b + kh * sok_h + t[:, None] * sok_t
            _rotate_rows(K, K_OUT, row, out_row, first, second, sk_d, sok_d, cos, sin, mask, WIDE)


def _block_sizes(seq_len: int, half: int) -> tuple[int, int]:
    block_p = triton.next_power_of_2(max(half, 1))
    block_t = max(1, min(triton.next_power_of_2(max(seq_len, 1)), max(1, 4096 // block_p)))
    return block_t, block_p


def _launch(q, k, cos, sin, q_out, k_out, interleaved: bool, conjugate: bool) -> None:
    batch, n_q, seq_len, _ = q.shape
    n_k = k.shape[1]
    half = cos.shape[-1]
    block_t, block_p = _block_sizes(seq_len, half)
    # batch x heads on axis 0 (up to 2**31 - 1 programs), blocks of positions on axis 1 (up to 65,535)
    grid = (batch * (n_q + n_k), triton.cdiv(seq_len, block_t))
    if grid[0] == 0 or grid[1] == 0:
        return
    table_batch_stride = cos.stride(0) if cos.shape[0] > 1 else 0
    _rope_kernel[grid](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        n_q,
        n_q + n_k,
        seq_len,
        *q.stride(),
        *k.stride(),
        *q_out.stride(),
        *k_out.stride(),
        table_batch_stride,
        cos.stride(1),
        cos.stride(2),
        HALF=half,
        INTERLEAVED=interleaved,
        CONJUGATE=conjugate,
        WIDE=q.dtype == torch.float64,
        BLOCK_T=block_t,
        BLOCK_P=block_p,
        enable_fp_fusion=False,
    )


def _pass_through(source: Tensor, target: Tensor, rotary_dim: int) -> None:
    if source.shape[-1] > rotary_dim:
        target[..., rotary_dim:].copy_(source[..., rotary_dim:])


def _rope_qk_impl(q, k, cos, sin, interleaved: bool, conjugate: bool):
    """The body of ``posenc::rope_qk``: new outputs, one launch, the features past ``R`` copied."""
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _launch(q, k, cos, sin, q_out, k_out, interleaved, conjugate)
    rotary_dim = 2 * cos.shape[-1]
    _pass_through(q, q_out, rotary_dim)
    _pass_through(k, k_out, rotary_dim)
    return q_out, k_out


@torch.library.custom_op("posenc::rope_qk", mutates_args=())
def _rope_qk_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, conjugate: bool
) -> tuple[Tensor, Tensor]:
    return _rope_qk_impl(q, k, cos, sin, interleaved, conjugate)


_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)


def _eager_direct(*tensors: Tensor) -> bool:
    """Whether a call may launch the kernel directly instead of through the custom op (whose dispatch costs about
    25 us of host time per eager call): plain tensors on a kernel device, nothing for autograd to record, and no
    tracing (``torch.compile``, ``torch.export``), functorch transform or dispatch mode (FakeTensorMode, ...),
    all of which see the custom op."""
    if torch.compiler.is_compiling() or _functorch_active() or _dispatch_modes():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or t.device.type not in DEVICE_TYPES or (grad and t.requires_grad):
            return False
    return True


@_rope_qk_op.register_fake
def _(q, k, cos, sin, interleaved, conjugate):
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output):
    _, _, cos, sin, interleaved, conjugate = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.conjugate = interleaved, conjugate


def _backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    # the adjoint of a rotation is the rotation by the opposite angle; the tables get no gradient here
    # the kernel reads the gradients through their strides: no copy, whatever their layout
    grad_q, grad_k = _rope_qk_op(grad_q, grad_k, cos, sin, ctx.interleaved, not ctx.conjugate)
    return grad_q, grad_k, None, None, None, None


_rope_qk_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("posenc::rope_qk_", mutates_args=("q", "k"))
def _rope_qk_inplace_op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, conjugate: bool) -> None:
    # each program reads its two features before it writes them, and no two programs share a feature
    _launch(q, k, cos, sin, q, k, interleaved, conjugate)


@_rope_qk_inplace_op.register_fake
def _(q, k, cos, sin, interleaved, conjugate):
    return None


def _as_heads_first(x: Tensor, seq_dim: int) -> Tensor:
    """A ``(B, H, T, D)`` view of ``x`` (``(B, H, T, D)`` for ``seq_dim=-2``, ``(B, T, H, D)`` for ``-3``; missing
    leading axes are added as views)."""
    while x.ndim < 4:
        x = x.unsqueeze(0)
    return x.transpose(-2, -3) if seq_dim == -3 else x


def _tables(cos: Tensor, sin: Tensor):
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    return cos.float(), sin.float()


def rope_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", seq_dim: int = -2, conjugate: bool = False
) -> tuple[Tensor, Tensor]:
    """Rotate ``q`` and ``k`` in one launch: ``(..., H, T, D)`` (``seq_dim=-2``) or ``(..., T, H, D)``
    (``seq_dim=-3``), up to 4-D, with ``cos``/``sin`` ``(T, R/2)`` or ``(B, T, R/2)``. Returns new tensors shaped
    and typed like ``q`` and ``k``; ``conjugate=True`` rotates by the opposite angles. Validation is the caller's
    (:mod:`posenc.rope` checks shapes before it dispatches here)."""
    cos, sin = _tables(cos, sin)
    q4, k4 = _as_heads_first(q, seq_dim), _as_heads_first(k, seq_dim)
    rotate = _rope_qk_impl if _eager_direct(q, k, cos) else _rope_qk_op
    q_out, k_out = rotate(q4, k4, cos, sin, layout == "interleaved", conjugate)
    if seq_dim == -3:
        q_out, k_out = q_out.transpose(-2, -3), k_out.transpose(-2, -3)
    return q_out.reshape(q.shape), k_out.reshape(k.shape)


def _no_heads(x4: Tensor) -> Tensor:
    return x4[:, :0]


def rope(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", seq_dim: int = -2, in_place: bool = False
) -> Tensor:
    """One tensor: :func:`rope_qk` with no keys (the launch covers ``x``'s heads only). ``in_place=True``
    overwrites ``x`` (through a view, whatever its strides) and returns it."""
    cos, sin = _tables(cos, sin)
    x4 = _as_heads_first(x, seq_dim)
    if in_place:
        _rope_qk_inplace_op(x4, _no_heads(x4), cos, sin, layout == "interleaved", False)
        return x
    rotate = _rope_qk_impl if _eager_direct(x, cos) else _rope_qk_op
    out, _ = rotate(x4, _no_heads(x4), cos, sin, layout == "interleaved", False)
    return (out.transpose(-2, -3) if seq_dim == -3 else out).reshape(x.shape)


def supports(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Shapes the kernel takes: ``x`` at most 4-D, tables ``(T, R/2)`` or ``(B or 1, T, R/2)`` matching ``x``'s batch,
    and tables that need no gradient (the kernel differentiates ``x`` only; learned frequencies take the formula)."""
    if x.ndim > 4 or cos.ndim not in (2, 3) or cos.requires_grad or sin.requires_grad:
        return False
    return cos.ndim == 2 or (x.ndim == 4 and cos.shape[0] in (1, x.shape[0]))


def supports_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """:func:`supports` for a pair rotated in one launch: ``k`` on ``q``'s device, in its dtype, with its rank."""
    return k.device == q.device and k.dtype == q.dtype and k.ndim == q.ndim and supports(q, cos, sin)
