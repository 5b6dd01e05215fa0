"""The fused Triton RoPE kernel (posenc._triton_rope), checked without a GPU: Triton's own interpreter
(``TRITON_INTERPRET=1``, set by tests/conftest.py where no CUDA device is present) runs the same ``@triton.jit``
kernel on CPU tensors. Against :func:`posenc.rope.rope_reference`:

* float32 and float64: bit for bit. The kernel computes ``x1 cos - x2 sin`` and ``x2 cos + x1 sin`` as separate
  products and sums, as the formula does, and the interpreter evaluates them with numpy, which never fuses a
  multiply-add. On a GPU the launch turns contraction into FMAs off (``enable_fp_fusion=False``), so the same holds
  there (tests/gpu/test_cuda.py, ``make test-gpu``).
* float16: bit for bit (numpy rounds float32 to float16 to nearest, as the formula's ``.to`` does).
* bfloat16: the interpreter has no bfloat16 arithmetic; it stores a float32 value as bfloat16 by dropping the low
  16 bits (rounding toward zero), where a GPU rounds to nearest. So the interpreted kernel's bfloat16 output must
  equal the float32 formula truncated to bfloat16, which checks that the products were taken in float32 and
  rounded once.
"""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import _triton_rope as tr
from posenc import rope_frequencies
from posenc.rope import rope_cos_sin, rope_reference

pytestmark = pytest.mark.skipif(not tr.AVAILABLE, reason="triton is not installed")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not torch.cuda.is_available() and not INTERPRETED:
    pytestmark = pytest.mark.skip(reason="no CUDA device and TRITON_INTERPRET is not 1")
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"


def truncate_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    return (x.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def expected(x, cos, sin, layout):
    """What the kernel must return for ``x`` ``(B, H, T, D)``: the formula (bfloat16: see the module docstring)."""
    if x.dtype == torch.bfloat16 and INTERPRETED:
        return truncate_to_bfloat16(rope_reference(x.float(), cos, sin, layout, seq_dim=-2))
    return rope_reference(x, cos, sin, layout, seq_dim=-2)


def tables(length, rotary_dim, batch=None, offset=0.0):
    inv_freq, _ = rope_frequencies(rotary_dim)
    positions = torch.arange(length) + offset
    if batch is not None:
        positions = positions + 17.0 * torch.arange(batch)[:, None]  # (B, T): each sequence at its own offset
    cos, sin = rope_cos_sin(positions, inv_freq)
    return cos.to(DEVICE), sin.to(DEVICE)


def broadcast(table, x):
    return table[:, None] if table.ndim == 3 else table  # (B, T, R/2) -> (B, 1, T, R/2)


@settings(max_examples=25, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    layout=st.sampled_from(["half", "interleaved"]),
    batch=st.integers(1, 2),
    q_heads=st.integers(1, 4),
    kv_divisor=st.sampled_from([1, 2, 4]),
    length=st.integers(1, 37),
    half=st.integers(1, 9),
    extra=st.sampled_from([0, 2, 6]),
    batched_tables=st.booleans(),
    offset=st.sampled_from([0.0, 1000.5, 70_000.0]),
    seq_dim=st.sampled_from([-2, -3]),
    strided=st.booleans(),
)
def test_kernel_equals_the_formula(
    dtype, layout, batch, q_heads, kv_divisor, length, half, extra, batched_tables, offset, seq_dim, strided
):
    kv_heads = max(1, q_heads // kv_divisor)
    rotary_dim, head_dim = 2 * half, 2 * half + extra  # odd pair counts hit the kernel's masks
    cos, sin = tables(length, rotary_dim, batch if batched_tables else None, offset)

    def make(heads):
        shape = (batch, heads, length, head_dim) if seq_dim == -2 else (batch, length, heads, head_dim)
        if strided:  # a slice of a wider (fused qkv-like) buffer: every stride differs from the contiguous one
            wide = torch.randn(*shape[:-1], 3 * head_dim, device=DEVICE).to(dtype)
            return wide[..., head_dim : 2 * head_dim]
        return torch.randn(shape, device=DEVICE).to(dtype)

    q, k = make(q_heads), make(kv_heads)
    q_out, k_out = tr.rope_qk(q, k, cos, sin, layout, seq_dim=seq_dim)
    heads_first = (lambda t: t) if seq_dim == -2 else (lambda t: t.transpose(1, 2))
    assert q_out.dtype == dtype and q_out.shape == q.shape and k_out.shape == k.shape
    assert torch.equal(heads_first(q_out), expected(heads_first(q), broadcast(cos, q), broadcast(sin, q), layout))
    assert torch.equal(heads_first(k_out), expected(heads_first(k), broadcast(cos, k), broadcast(sin, k), layout))

    q_copy = q.clone()
    for t in (q, k):  # in place, through the same strides
        tr.rope(t, cos, sin, layout, seq_dim=seq_dim, in_place=True)
    assert torch.equal(q, q_out) and torch.equal(k, k_out)
    back_q, _ = tr.rope_qk(q, k, cos, sin, layout, seq_dim=seq_dim, conjugate=True)
    if dtype in (torch.float32, torch.float64):
        # the inverse rotation undoes it up to the float32 tables: cos^2 + sin^2 = 1 within ~2 eps32, plus the
        # rounding of the two rotations' products and sums (a few eps32 at most, also in float64)
        assert torch.allclose(
            back_q, q_copy, rtol=0, atol=8 * torch.finfo(torch.float32).eps * (1 + q_copy.abs().max())
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradients_equal_autograd_of_the_formula(dtype, layout):
    cos, sin = tables(11, 12)
    q = torch.randn(2, 4, 11, 16, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 2, 11, 16, device=DEVICE, dtype=dtype, requires_grad=True)
    weights_q, weights_k = torch.randn_like(q), torch.randn_like(k)
    q_out, k_out = tr.rope_qk(q, k, cos, sin, layout)
    grads = torch.autograd.grad((q_out * weights_q).sum() + (k_out * weights_k).sum(), (q, k))
    reference = torch.autograd.grad(
        (rope_reference(q, cos, sin, layout) * weights_q).sum()
        + (rope_reference(k, cos, sin, layout) * weights_k).sum(),
        (q, k),
    )
    # the backward is the kernel with sin negated: x1 cos + x2 sin where autograd forms x1 cos + (-sin) x2 ...
    # both are the same two products and one sum, so bit for bit
    assert torch.equal(grads[0], reference[0]) and torch.equal(grads[1], reference[1])


def test_opcheck_of_both_ops():
    cos, sin = tables(5, 8)
    q, k = torch.randn(1, 2, 5, 8, device=DEVICE), torch.randn(1, 1, 5, 8, device=DEVICE)
    for op, args in (
        (tr._rope_qk_op, (q, k, cos[None], sin[None], False, False)),
        (tr._rope_qk_inplace_op, (q.clone(), k.clone(), cos[None], sin[None], True, False)),
    ):
        torch.library.opcheck(op, args)


def test_the_op_compiles_and_exports_as_one_node():
    cos, sin = tables(9, 16)

    def block(q, k):
        q_rot, k_rot = tr.rope_qk(q, k, cos, sin)
        return torch.nn.functional.scaled_dot_product_attention(q_rot, k_rot, k_rot, is_causal=True)

    q, k = torch.randn(1, 2, 9, 16, device=DEVICE), torch.randn(1, 2, 9, 16, device=DEVICE)
    eager = block(q, k)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k), eager)

    class Block(torch.nn.Module):
        def forward(self, q, k):
            return block(q, k)

    exported = torch.export.export(Block(), (q, k))
    assert any("posenc.rope_qk" in str(node.target) for node in exported.graph.nodes)
    assert torch.equal(exported.module()(q, k), eager)


def test_meta_and_fake_tensors_never_reach_the_host():
    from torch._subclasses.fake_tensor import FakeTensorMode

    for device in ("meta",):
        q = torch.randn(2, 4, 6, 16, device=device, dtype=torch.bfloat16)
        k = torch.randn(2, 2, 6, 16, device=device, dtype=torch.bfloat16)
        cos, sin = torch.randn(6, 8, device=device), torch.randn(6, 8, device=device)
        q_out, k_out = tr.rope_qk(q, k, cos, sin)
        assert q_out.device.type == "meta" and q_out.dtype == torch.bfloat16 and k_out.shape == k.shape
    with FakeTensorMode():
        q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
        cos, sin = torch.randn(6, 8), torch.randn(6, 8)
        q_out, _ = tr.rope_qk(q, k, cos, sin, seq_dim=-2)
        assert q_out.shape == q.shape


def test_use_triton_decides_from_the_device_and_the_switch(monkeypatch):
    cpu = torch.zeros(1)
    assert not tr.use_triton(cpu)
    meta_cuda_like = torch.empty(1, device="meta")
    assert not tr.use_triton(meta_cuda_like)
    monkeypatch.setenv(tr.KERNEL_ENV, "formula")
    assert not tr.use_triton(cpu)


@pytest.fixture
def triton_path(monkeypatch):
    """posenc.rope's CUDA branch, taken on this device (the interpreter runs the kernel on CPU tensors)."""
    from posenc import _rope_dispatch

    monkeypatch.setattr(_rope_dispatch, "_triton_for", lambda x: tr)


@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rope_dispatches_to_the_kernel_with_the_same_result(triton_path, monkeypatch, seq_dim, layout):
    import posenc
    from posenc import _rope_dispatch

    shape = lambda heads: (2, heads, 6, 16) if seq_dim == -2 else (2, 6, heads, 16)
    q, k = torch.randn(shape(4), device=DEVICE), torch.randn(shape(2), device=DEVICE)
    cos, sin = tables(6, 12)
    kernel = (
        posenc.apply_rope(q, cos, sin, layout, seq_dim=seq_dim),
        posenc.apply_rope_qk(q, k, cos, sin, layout, seq_dim=seq_dim),
        posenc.apply_rope_(q.clone(), cos, sin, layout, seq_dim=seq_dim),
    )
    with monkeypatch.context() as formula_only:
        formula_only.setattr(_rope_dispatch, "_triton_for", lambda x: None)
        formula = (
            posenc.apply_rope(q, cos, sin, layout, seq_dim=seq_dim),
            posenc.apply_rope_qk(q, k, cos, sin, layout, seq_dim=seq_dim),
            posenc.apply_rope_(q.clone(), cos, sin, layout, seq_dim=seq_dim),
        )
    assert torch.equal(kernel[0], formula[0]) and torch.equal(kernel[2], formula[2])
    assert all(torch.equal(a, b) for a, b in zip(kernel[1], formula[1]))
    module = posenc.RotaryEmbedding(16, seq_dim=seq_dim)
    with monkeypatch.context() as formula_only:
        formula_only.setattr(_rope_dispatch, "_triton_for", lambda x: None)
        reference = module(q, k)
    assert all(torch.equal(a, b) for a, b in zip(module(q, k), reference))
    # learned tables (a gradient through cos/sin) take the formula: the kernel differentiates x only
    learned = cos.clone().requires_grad_()
    posenc.apply_rope(q, learned, sin, layout, seq_dim=seq_dim).sum().backward()
    assert learned.grad is not None


def test_the_cuda_branch_reads_no_value_and_makes_no_host_tensor(triton_path):
    """The CUDA branch on the meta device: any read of a value (.item(), bool(), a Python float of a tensor) raises
    there, and the dispatch mode below fails on any tensor the branch would create on the host."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import posenc

    class NoHostTensors(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    raise AssertionError(f"{func} made a host tensor on the device path")
            return out

    for rope_type, extra in [
        ("default", {}),
        ("yarn", {"factor": 4.0, "original_max_position_embeddings": 64}),
        ("dynamic", {"factor": 2.0}),
        ("longrope", {"long_factor": [1.5] * 16, "short_factor": [1.0] * 16, "original_max_position_embeddings": 32}),
    ]:
        module = posenc.RotaryEmbedding(32, {"rope_type": rope_type, **extra}, max_position_embeddings=64).to("meta")
        q = torch.randn(2, 4, 9, 32, device="meta", dtype=torch.bfloat16)
        k = torch.randn(2, 2, 9, 32, device="meta", dtype=torch.bfloat16)
        positions = torch.arange(9, device="meta")[None].expand(2, 9) + 100
        with NoHostTensors():
            q_rot, k_rot = module(q, k, positions)
        assert q_rot.device.type == "meta" and q_rot.dtype == torch.bfloat16 and k_rot.shape == k.shape
