"""The rotation API's contracts: bad input refused before any dispatch, per-sequence offsets and packed (varlen)
sequences equal to rotating each sequence alone, negative offsets/positions refused, the per-device capability
fallback of the Triton path, and the kernel's 64-bit offsets (strides whose products pass 2**31)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import posenc
from posenc import _rope_dispatch, rope

ROOT = Path(__file__).resolve().parents[1]


def tables(length, rotary_dim=16, start=0):
    inv_freq, _ = posenc.rope_frequencies(rotary_dim)
    return posenc.rope_cos_sin(torch.arange(length) + start, inv_freq)


# ------------------------------------------------------------------------------------------ bad input, every path
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


def test_the_cached_check_still_refuses_what_it_refused():
    cos, sin = tables(4, 8)
    x = torch.randn(2, 3, 4, 8)
    posenc.apply_rope(x, cos, sin)  # remembered as checked
    for _ in range(2):
        with pytest.raises(ValueError, match="seq_dim"):
            posenc.apply_rope(torch.randn(2, 4, 3, 8), cos, sin)
        with pytest.raises(TypeError, match="real floating-point"):
            posenc.apply_rope(x.long(), cos, sin)
        with pytest.raises(ValueError, match="layout"):
            posenc.apply_rope(x, cos, sin, "halves")


# ------------------------------------------------------------------------------------------ per-sequence offsets
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_per_sequence_offsets_equal_each_sequence_alone(seq_dim):
    offsets = torch.tensor([0, 5, 123, 7])
    q = torch.randn(4, 3, 6, 16) if seq_dim == -2 else torch.randn(4, 6, 3, 16)
    k = q[:, :1] if seq_dim == -2 else q[:, :, :1]
    module = posenc.RotaryEmbedding(16, seq_dim=seq_dim)
    rotated = posenc.rotate(q, offset=offsets, seq_dim=seq_dim)
    q_rot, k_rot = module(q, k, offset=offsets)
    positions = torch.arange(6)[None] + 2
    with_positions = module(q, k, positions=positions.expand(4, 6), offset=offsets)[0]
    for b, offset in enumerate(offsets.tolist()):
        alone = posenc.rotate(q[b : b + 1], offset=offset, seq_dim=seq_dim)
        assert torch.equal(rotated[b : b + 1], alone)
        assert torch.equal(q_rot[b : b + 1], alone)
        assert torch.equal(k_rot[b : b + 1], module(q[b : b + 1], k[b : b + 1], offset=offset)[1])
        assert torch.equal(with_positions[b : b + 1], module(q[b : b + 1], k[b : b + 1], positions + offset)[0])
    cos, sin = posenc.rope_cos_sin(torch.arange(6) + offsets[:, None], module.inv_freq)
    assert torch.equal(posenc.apply_rope_qk(q, k, cos, sin, seq_dim=seq_dim)[0], q_rot)


def test_a_decode_step_with_its_own_position_per_sequence_reads_the_cache_exactly():
    """(B, 1) position ids, each sequence elsewhere: the cache's rows gathered by index, equal to the direct
    computation bit for bit, in every dtype; positions past the cache grow it, past the limit are computed."""
    module = posenc.RotaryEmbedding(64)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        q, k = torch.randn(8, 4, 1, 64).to(dtype), torch.randn(8, 2, 1, 64).to(dtype)
        for ids in (torch.tensor([3, 900, 17, 4000, 0, 1, 2, 65]), torch.tensor([70_000] * 8)):
            ids = ids[:, None]
            cos, sin = posenc.rope_cos_sin(ids, module.inv_freq)
            q_rot, k_rot = module(q, k, ids)
            assert torch.equal(q_rot, rope.rope_reference(q, cos, sin))
            assert torch.equal(k_rot, rope.rope_reference(k, cos, sin))
    assert module._table_cache.entry[1].shape[0] == 4096  # grown to 4,000, not to 70,000


def test_offsets_are_checked():
    q = torch.randn(2, 3, 4, 8)
    with pytest.raises(ValueError, match="offset must be an int or a tensor of shape"):
        posenc.rotate(q, offset=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="offset must be an int or an integer tensor"):
        posenc.RotaryEmbedding(8)(q, q, offset=torch.tensor([1.0, 2.0]))


# ------------------------------------------------------------------------------------------ varlen
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_packed_sequences_equal_each_sequence_alone(layout):
    lengths = [3, 1, 5, 0, 2]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    total = sum(lengths)
    q, k = torch.randn(total, 4, 16), torch.randn(total, 2, 16)  # flash-attn's (total, H, D)
    module = posenc.RotaryEmbedding(16, layout=layout)
    offsets = torch.tensor([0, 10, 2, 0, 99])
    packed = module(q, k, seq_dim=-3, cu_seqlens=cu_seqlens)
    shifted = module(q, k, offset=offsets, seq_dim=-3, cu_seqlens=cu_seqlens)
    by_rotate = posenc.rotate(q, layout=layout, seq_dim=-3, cu_seqlens=cu_seqlens)
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        alone = module(q[None, start:end], k[None, start:end], seq_dim=-3)
        assert torch.equal(packed[0][start:end], alone[0][0]) and torch.equal(packed[1][start:end], alone[1][0])
        assert torch.equal(by_rotate[start:end], alone[0][0])
        later = module(q[None, start:end], k[None, start:end], offset=int(offsets[n]), seq_dim=-3)
        assert torch.equal(shifted[0][start:end], later[0][0])


def test_cu_seqlens_is_checked():
    q = torch.randn(6, 2, 8)
    for bad in (torch.tensor([0, 2, 5]), torch.tensor([1, 6]), torch.tensor([0, 4, 3, 6])):
        with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
            posenc.rotate(q, seq_dim=-3, cu_seqlens=bad)
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D integer tensor"):
        posenc.rotate(q, seq_dim=-3, cu_seqlens=torch.tensor([0.0, 6.0]))
    with pytest.raises(ValueError, match="either positions or cu_seqlens"):
        posenc.rotate(q, torch.arange(6), seq_dim=-3, cu_seqlens=torch.tensor([0, 6]))


# ------------------------------------------------------------------------------------------ negative positions
def test_negative_offsets_and_token_positions_are_refused_everywhere():
    q = torch.randn(2, 3, 4, 8)
    module = posenc.RotaryEmbedding(8)
    calls = {
        "rotate offset": lambda: posenc.rotate(q, offset=-1),
        "rotate offset tensor": lambda: posenc.rotate(q, offset=torch.tensor([0, -2])),
        "module offset": lambda: module(q, q, offset=-3),
        "module offset tensor": lambda: module(q, q, offset=torch.tensor([-1, 0])),
        "module positions": lambda: module(q, q, positions=torch.tensor([[0, 1, 2, 3], [-1, 0, 1, 2]])),
        "module real positions": lambda: module(q, q, positions=torch.tensor([-0.5, 0.5, 1.5, 2.5])),
        "module cos_sin": lambda: module.cos_sin(torch.tensor([-4, 0])),
        "module encode_qk": lambda: module.encode_qk(q, q, torch.arange(4) - 1, torch.arange(4)),
        "varlen offset": lambda: posenc.rotate(
            q[0].transpose(0, 1), seq_dim=-3, cu_seqlens=torch.tensor([0, 4]), offset=-2
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"(offset|positions) must be >= 0"):
            call()
            pytest.fail(f"{name} accepted a negative value")


def test_rotate_takes_any_real_position_a_negative_one_turns_back():
    """rotate is the rotation R(p) for every real p (continuous time, relative offsets m - n): R(-p) R(p) = 1."""
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    inv_freq = posenc.rope_frequencies(32)[0].double()
    positions = torch.tensor([0.0, 2.5, 17.0, 300.0, 4096.0], dtype=torch.float64)
    back = posenc.rotate(posenc.rotate(x, positions, inv_freq), -positions, inv_freq)
    assert torch.allclose(back, x, atol=1e-12)


# ------------------------------------------------------------------------------------------ device capability
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
    cos, sin = tables(5)
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


# ------------------------------------------------------------------------------------------ 64-bit offsets
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


# ------------------------------------------------------------------------------------------ eager launches
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
    cos, sin = tables(5)
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
