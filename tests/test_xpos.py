"""posenc.xpos: xPos as RoPE's elementwise pass, against the damped-rotation group it is (GroupEncoding)."""

import pytest
import torch

import posenc
from posenc import generators as gens
from posenc.xpos import XPos, apply_xpos_qk, xpos_cos_sin, xpos_log_scales

EPS32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32


def error_bound(x, positions, head_dim, layout, key=False, base=10_000.0, scale_base=512.0):
    """What float32 may cost, per element: every pair is its exact value ``s R(t theta) x`` with the angle off by
    ``2 u |t theta|`` (theta and t theta each rounded once), the scale's exponent ``t ln(zeta)/B`` off by ``u |t ln
    zeta/B|`` and a few roundings (exp, cos, sin, the table products, the rotation's two products and sum: 8 u at
    most), each relative to the exact pair's length ``s |x_pair|``."""
    pairs = posenc.pair_indices(head_dim, layout)  # (D/2, 2)
    theta = base ** (-2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
    log_scales = xpos_log_scales(head_dim, scale_base).double()
    t = positions.double()[:, None]
    scale = torch.exp((-t if key else t) * log_scales)
    relative = EPS32 * (2 * t.abs() * theta + t.abs() * log_scales.abs() + 8)  # (T, D/2)
    pair_norm = x.double()[..., pairs].norm(dim=-1)  # (..., T, D/2)
    per_pair = relative * scale * pair_norm
    bound = torch.empty_like(x, dtype=torch.float64)
    bound[..., pairs[:, 0]] = per_pair
    bound[..., pairs[:, 1]] = per_pair
    return bound


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_equals_the_group_encoding_of_xpos_generator(layout):
    torch.manual_seed(0)
    head_dim, length = 64, 1024
    q, k = torch.randn(2, 2, length, head_dim), torch.randn(2, 2, length, head_dim)
    positions = torch.arange(length)
    reference = posenc.GroupEncoding(gens.xpos_generator(head_dim, layout=layout, dtype=torch.float64))
    q_ref, k_ref = reference.encode_qk(q.double(), k.double(), positions, positions)
    q_x, k_x = XPos(head_dim, layout=layout).encode_qk(q, k, positions, positions)
    assert q_x.dtype == k_x.dtype == torch.float32
    for fast, exact, x, key in ((q_x, q_ref, q, False), (k_x, k_ref, k, True)):
        share = ((fast.double() - exact).abs() / error_bound(x, positions, head_dim, layout, key=key)).max()
        # at most the bound, and not a vacuous one: the largest error reaches a fair part of it (0.47 measured)
        assert 0.05 < share <= 1, f"key={key}: the largest error is {share:.3g} of the float32 bound"


def test_the_function_and_the_module_agree_and_logits_depend_on_the_offset_only():
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 16, 32), torch.randn(1, 2, 16, 32)
    positions = torch.arange(16)
    module = XPos(32, scale_base=64.0)
    assert all(
        torch.equal(a, b)
        for a, b in zip(apply_xpos_qk(q, k, positions, scale_base=64.0), module.encode_qk(q, k, positions, positions))
    )
    # positions shifted by 100 (the authors' centring is such a shift): the same logits up to float32 rounding of
    # the larger angles and scales (relative 1e-4 is 40 times the roundoff of an angle of about 100 rad)
    logits = lambda shift: torch.einsum(
        "bhid,bhjd->bhij", *module.encode_qk(q, k, positions + shift, positions + shift)
    )
    assert torch.allclose(logits(100), logits(0), rtol=1e-4, atol=1e-4)


def test_attention_with_xpos_equals_attention_with_the_group_encoding():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 12, 16, dtype=torch.float64) for _ in range(3))
    fast = posenc.attention(q, k, v, encoding=XPos(16), causal=True)
    dense = posenc.attention(
        q, k, v, encoding=posenc.GroupEncoding(gens.xpos_generator(16, dtype=torch.float64)), causal=True
    )
    # float32 angles (posenc's RoPE tables are float32 whatever the input): relative error ~1e-6 on logits of size ~4
    assert torch.allclose(fast, dense, atol=1e-5)


def test_seq_dim_minus_three_equals_the_transposed_call():
    torch.manual_seed(3)
    q, k = torch.randn(2, 9, 3, 16), torch.randn(2, 9, 3, 16)  # (B, T, H, D)
    positions = torch.arange(5, 14)
    q_x, k_x = apply_xpos_qk(q, k, positions, seq_dim=-3)
    q_t, k_t = apply_xpos_qk(q.transpose(1, 2), k.transpose(1, 2), positions)
    assert torch.equal(q_x, q_t.transpose(1, 2)) and torch.equal(k_x, k_t.transpose(1, 2))
    module_q, module_k = XPos(16, seq_dim=-3).encode_qk(q, k, positions, positions)
    assert torch.equal(module_q, q_x) and torch.equal(module_k, k_x)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="head_dim"):
        XPos(15)
    with pytest.raises(ValueError, match="seq_dim"):
        XPos(16, seq_dim=-1)
    with pytest.raises(ValueError, match="scale_base"):
        xpos_log_scales(16, scale_base=0.0)
    with pytest.raises(ValueError, match="log_scales"):
        xpos_cos_sin(torch.arange(4), torch.ones(8), torch.ones(4))
    with pytest.raises(TypeError, match="q"):
        apply_xpos_qk(torch.ones(1, 4, 8, dtype=torch.long), torch.ones(1, 4, 8))
