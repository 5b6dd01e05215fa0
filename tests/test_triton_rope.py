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

Also here: the dispatcher's CUDA branch (bad input refused before it, the same result as the formula, no value
read on the host), the per-device capability fallback, 64-bit offsets (strides whose products pass 2**31) and
eager launches that skip the custom op's dispatch.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import _rope_dispatch, rope, rope_frequencies
from posenc import _triton_rope as tr
from posenc.rope import rope_cos_sin, rope_reference

pytestmark = pytest.mark.skipif(not tr.AVAILABLE, reason="triton is not installed")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not torch.cuda.is_available() and not INTERPRETED:
    pytestmark = pytest.mark.skip(reason="no CUDA device and TRITON_INTERPRET is not 1")
ROOT = Path(__file__).resolve().parents[1]
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


def test_a_device_without_what_the_kernel_needs_takes_the_formula(monkeypatch):
    """The per-device decision (bf16 needs sm_80; Triton >= MIN_TRITON), cached, forced both ways: the kernel runs
    where the device can, the formula where it cannot, with the formula's result."""
    tr = pytest.importorskip("posenc._triton_rope")
    if not tr.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py without CUDA)")
    monkeypatch.setattr(tr, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(
        _rope_dispatch, "_triton_for", lambda x: tr if tr.use_triton(x) else None
    )  # the real decision, on CPU tensors
    launches = []
    launch = tr._launch
    monkeypatch.setattr(tr, "_launch", lambda *args: (launches.append(1), launch(*args))[1])
    q, k = torch.randn(2, 4, 5, 16).bfloat16(), torch.randn(2, 2, 5, 16).bfloat16()
    cos, sin = tables(5, 16)
    formula = (rope.rope_reference(q, cos, sin), rope.rope_reference(k, cos, sin))
    for capability, kernel in (((7, 5), False), ((8, 0), True)):
        monkeypatch.setattr(tr, "_capability", lambda device, c=capability: c)
        tr._CAPABLE.clear()
        launches.clear()
        q_rot, k_rot = posenc.apply_rope_qk(q, k, cos, sin)
        assert bool(launches) == kernel
        if not kernel:  # a T4: the formula, bit for bit
            assert torch.equal(q_rot, formula[0]) and torch.equal(k_rot, formula[1])
        assert len(tr._CAPABLE) == 1  # decided once for this device and dtype
    monkeypatch.setattr(tr, "_triton_version", lambda: (2, 3))
    tr._CAPABLE.clear()
    assert not tr.use_triton(q.float())
    tr._CAPABLE.clear()


OVERFLOW_SCRIPT = textwrap.dedent("""
    import torch
    from posenc import _triton_rope as tr
    from posenc.rope import rope_cos_sin, rope_reference
    from posenc import rope_frequencies

    S = 2 ** 30            # every stride fits in 32 bits; b * S and the sums of offsets pass 2**31
    T, D, HALF = 3, 8, 4
    base = torch.empty(2 * S + S // 2, dtype=torch.float32)   # virtual memory: only a few pages are touched
    def view(shape, strides, offset):
        return base.as_strided(shape, strides, offset)
    q = view((3, 2, T, D), (S, S // 4 + 7 * T * D, D, 1), 0)           # b * S + h * (S/4 + ...) >= 2**31
    k = view((3, 1, T, D), (S, T * D, D, 1), 2 * T * D)
    cos = view((3, T, HALF), (S, HALF, 1), 4 * T * D)                  # batched tables, batch stride S
    sin = view((3, T, HALF), (S, HALF, 1), 5 * T * D)
    inv_freq, _ = rope_frequencies(D)
    angles = (torch.arange(T)[None] + 1000.0 * torch.arange(3)[:, None])[..., None] * inv_freq
    for t in (q, k):
        t.copy_(torch.randn(t.shape))
    cos.copy_(angles.cos())
    sin.copy_(angles.sin())
    expected_q = rope_reference(q, cos, sin)
    expected_k = rope_reference(k, cos, sin)
    q_rot, k_rot = tr.rope_qk(q, k, cos, sin)
    assert torch.equal(q_rot, expected_q) and torch.equal(k_rot, expected_k), "inputs and tables"
    for t in (q, k):                                                   # outputs written through the same strides
        tr.rope(t, cos, sin, in_place=True)
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k), "outputs"
    print("ok")
""")


def test_offsets_past_two_to_the_31_under_the_interpreter():
    """Strides that each fit in 32 bits but whose offsets pass 2**31 (as in a (66, 32, 8192, 128) tensor), over a
    large virtual allocation of which only a few rows are touched: the kernel equals the formula for q, k, the
    batched tables and the in-place outputs. Run in a child process: an int32 offset there reads wild memory."""
    tr = pytest.importorskip("posenc._triton_rope")
    if not tr.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1); on a GPU tests/gpu/ covers a real tensor")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", OVERFLOW_SCRIPT], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_eager_calls_launch_directly_and_everything_else_sees_the_custom_op(monkeypatch):
    """An eager call with nothing for autograd skips the custom op's dispatch (host time) and gives the op's result;
    gradients, fake tensors and tracing go through the op."""
    tr = pytest.importorskip("posenc._triton_rope")
    if not tr.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py without CUDA)")
    monkeypatch.setattr(tr, "DEVICE_TYPES", ("cuda", "cpu"))
    through_op = []
    op = tr._rope_qk_op
    monkeypatch.setattr(tr, "_rope_qk_op", lambda *args: (through_op.append(1), op(*args))[1])
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = tables(5, 16)
    direct = tr.rope_qk(q, k, cos, sin)
    assert not through_op
    assert all(torch.equal(a, b) for a, b in zip(direct, op(q, k, cos[None], sin[None], False, False)))
    assert torch.equal(tr.rope(q, cos, sin), direct[0]) and not through_op
    q_grad = q.clone().requires_grad_()
    out, _ = tr.rope_qk(q_grad, k, cos, sin)
    assert through_op and torch.equal(out, direct[0])
    out.sum().backward()
    assert q_grad.grad is not None
    from torch._subclasses.fake_tensor import FakeTensorMode

    through_op.clear()
    with FakeTensorMode():
        fake_q, fake_k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
        fake_cos, fake_sin = torch.randn(5, 8), torch.randn(5, 8)
        assert tr.rope_qk(fake_q, fake_k, fake_cos, fake_sin)[0].shape == fake_q.shape
    assert through_op


@pytest.mark.parametrize("path", ["cpu", "triton"])
def test_a_list_gets_the_same_type_error_on_every_path(monkeypatch, path):
    if path == "triton":  # the CUDA branch, as the dispatcher would take it
        monkeypatch.setattr(_rope_dispatch, "_triton_for", lambda x: pytest.importorskip("posenc._triton_rope"))
    cos, sin = tables(3, 8)
    x = [[0.0] * 8] * 3
    for call in (
        lambda: posenc.apply_rope(x, cos, sin),
        lambda: posenc.apply_rope_(x, cos, sin),
        lambda: posenc.apply_rope_qk(x, torch.zeros(3, 8), cos, sin),
    ):
        with pytest.raises(TypeError, match=r"^(x|q) must be a torch.Tensor, got list"):
            call()
    with pytest.raises(TypeError, match="^k must be a torch.Tensor, got list"):
        posenc.apply_rope_qk(torch.zeros(3, 8), x, cos, sin)
    with pytest.raises(TypeError, match="^x must be a torch.Tensor"):
        posenc.rotate(x)
    with pytest.raises(TypeError, match="^q must be a torch.Tensor"):
        posenc.RotaryEmbedding(8)(x, torch.zeros(1, 1, 3, 8))
    with pytest.raises(TypeError, match="^cos must be a torch.Tensor"):
        posenc.apply_rope(torch.zeros(3, 8), cos.tolist(), sin)
