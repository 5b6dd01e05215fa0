"""posenc.mla: why RoPE on the whole key blocks MLA's absorption, decoupled RoPE restores it, and transformers'
DeepseekV3Attention computes the same numbers."""

import pytest
import torch

import posenc
from posenc import mla

tf = pytest.importorskip("transformers")
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

U64, U32 = 2.0**-53, 2.0**-24  # unit roundoffs


def _inputs(dtype=torch.float64, batch=2, length=12, d_model=16, heads=2, head_dim=8, latent=6):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, d_model, generator=g, dtype=dtype)
    c = torch.randn(batch, length, latent, generator=g, dtype=dtype)
    w_q = torch.randn(heads * head_dim, d_model, generator=g, dtype=dtype) / d_model**0.5
    w_uk = torch.randn(heads * head_dim, latent, generator=g, dtype=dtype) / latent**0.5
    return x, c, w_q, w_uk, heads, head_dim


def test_absorption_is_exact_without_rope_and_wrong_with_rope_on_the_whole_key():
    x, c, w_q, w_uk, heads, head_dim = _inputs()
    absorbed = mla.absorbed_logits(x, c, w_q, w_uk, heads)
    # the same sums grouped two ways: each logit is a sum of products of |x|, |W_q|, |W_UK|, |c| entries, and
    # regrouping a sum of n terms moves it by at most n u times the sum of their absolute values (n < 64 here)
    magnitude = mla.absorbed_logits(x.abs(), c.abs(), w_q.abs(), w_uk.abs(), heads)
    plain = mla.full_key_rope_logits(x, c, w_q, w_uk, heads)
    assert ((absorbed - plain).abs() <= 64 * U64 * magnitude).all()
    inv_freq, _ = posenc.rope_frequencies(head_dim)
    rotated = mla.full_key_rope_logits(x, c, w_q, w_uk, heads, inv_freq)
    gap = absorbed - rotated
    # off the diagonal R(m)^T R(n) is not the identity: the absorbed product misses by a sizeable part of a logit
    off = ~torch.eye(x.shape[1], dtype=torch.bool)
    assert gap[..., off].abs().max() > 0.3 * absorbed.abs().max()
    # on it (m = n) R(m)^T R(m) = I up to the float32 cos^2 + sin^2 - 1 of the tables (a few u32 per pair)
    diagonal = torch.diagonal(gap, dim1=-2, dim2=-1).abs()
    assert (diagonal <= 8 * U32 * torch.diagonal(magnitude, dim1=-2, dim2=-1)).all()


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_with_rope_on_the_whole_key_absorption_needs_one_matrix_per_offset(layout):
    x, c, w_q, w_uk, heads, head_dim = _inputs(length=7)
    inv_freq, _ = posenc.rope_frequencies(head_dim)
    rotated = mla.full_key_rope_logits(x, c, w_q, w_uk, heads, inv_freq, layout=layout)
    magnitude = mla.absorbed_logits(x.abs(), c.abs(), w_q.abs(), w_uk.abs(), heads)
    # the float32 tables of full_key_rope_logits against rope_matrix's float64 ones: each cos or sin entry is off by
    # at most u32 (|angle| + 1) (the angle's rounding, then the function's), angles reach 6 rad here, and a rotated
    # feature mixes two, so 4 (6 + 1) u32 per factor, twice in the bilinear logit
    tolerance = 2 * 4 * 7 * U32 * magnitude
    matrices = {
        offset: mla.absorb_key_up_projection(w_q, w_uk, heads, inv_freq, offset, layout) for offset in range(-6, 7)
    }
    for m in range(7):
        for n in range(7):
            absorbed = torch.einsum("hcd,bd,bc->bh", matrices[m - n], x[:, m], c[:, n]) / head_dim**0.5
            assert ((absorbed - rotated[..., m, n]).abs() <= tolerance[..., m, n]).all()
    assert not torch.allclose(matrices[1], matrices[0])  # another offset, another matrix
    assert torch.allclose(matrices[0], mla.absorb_key_up_projection(w_q, w_uk, heads), rtol=0, atol=1e-14)


def test_the_absorbed_matrix_is_wuk_transposed_times_wq_per_head():
    _, _, w_q, w_uk, heads, head_dim = _inputs()
    absorbed = mla.absorb_key_up_projection(w_q, w_uk, heads)
    for h in range(heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        assert torch.allclose(absorbed[h], w_uk[rows].T @ w_q[rows], rtol=0, atol=1e-14)


def _layer(dtype=torch.float64, **sizes):
    torch.manual_seed(0)
    sizes = {
        "d_model": 16,
        "n_heads": 2,
        "kv_lora_rank": 6,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 4,
        "v_head_dim": 3,
        **sizes,
    }
    return mla.LatentAttention(**sizes).to(dtype)


@pytest.mark.parametrize("q_lora_rank", [None, 5])
def test_decoupled_rope_restores_the_absorption(q_lora_rank):
    layer = _layer(q_lora_rank=q_lora_rank)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    positions = torch.arange(9) + 100
    explicit, absorbed = layer.logits(x, positions), layer.absorbed_logits(x, positions)
    # the nope part is regrouped (n = d_n + d_c terms), the rope part is the same product: n u of the absolute sums
    q_nope, q_rope = layer.queries(x, positions)
    c, k_rope = layer.latents(x, positions)
    magnitude = (
        q_nope.abs() @ layer.w_uk.abs() @ c.abs()[:, None].transpose(-1, -2)
        + q_rope.abs() @ k_rope.abs()[:, None].transpose(-1, -2)
    ) * layer.scaling
    assert ((explicit - absorbed).abs() <= 16 * U64 * magnitude).all()
    assert explicit.abs().max() > 0.1  # not a trivially small comparison


def test_decoupled_logits_depend_on_the_offset_only():
    layer = _layer()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    shift = 40
    before, after = layer.logits(x), layer.logits(x, torch.arange(9) + shift)
    _, q_rope = layer.queries(x)
    _, k_rope = layer.latents(x)
    rope_magnitude = q_rope.abs() @ k_rope.abs()[:, None].transpose(-1, -2) * layer.scaling
    # only the rope slice sees positions, through float32 tables: each cos or sin entry is off by at most
    # u32 (|angle| + 1) at angles up to 48 rad, a rotated feature mixes two, twice in the bilinear logit; 1e-12
    # covers the float64 rounding of the whole 8-term sum (8 u64 times logits of a few units: ~1e-14)
    tolerance = 2 * 4 * 49 * U32 * rope_magnitude + 1e-12
    assert ((before - after).abs() <= tolerance).all()


def test_the_cache_holds_d_c_plus_d_r_numbers_per_token_and_the_rope_part_is_shared():
    layer = _layer()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    c, k_rope = layer.latents(x)
    assert c.shape == (1, 5, 6) and k_rope.shape == (1, 5, 4)
    keys, values = layer.keys_values(c, k_rope)
    assert keys.shape == (1, 2, 5, 8) and values.shape == (1, 2, 5, 3)
    assert torch.equal(keys[:, 0, :, 4:], keys[:, 1, :, 4:])  # one rotated key part for every head


def test_interleaved_slice_is_posenc_interleaved_rope_then_deinterleaved():
    layer = _layer(dtype=torch.float32)
    x = torch.randn(2, 3, 7, 4)
    positions = torch.arange(7)[None]
    cos, sin = posenc.rope_cos_sin(positions, layer.inv_freq)
    expected = posenc.apply_rope(x, cos[:, None], sin[:, None], "interleaved")
    permutation = posenc.interleaved_to_half_permutation(4)
    assert torch.allclose(layer.rotate(x, positions), expected[..., permutation], rtol=0, atol=1e-6)


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10_000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}


@pytest.mark.parametrize(
    "q_lora_rank,interleave,rope_parameters",
    [(None, True, None), (12, True, None), (12, False, None), (None, True, YARN)],
    ids=["q-proj", "q-lora", "half-layout", "yarn"],
)
def test_equals_transformers_deepseek_v3_attention_bit_for_bit(q_lora_rank, interleave, rope_parameters):
    model = dict(hidden_size=32, num_hidden_layers=1, vocab_size=16, max_position_embeddings=64)
    heads = dict(num_attention_heads=4, num_key_value_heads=4, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5)
    sizes = dict(**model, **heads, q_lora_rank=q_lora_rank, kv_lora_rank=8, rope_interleave=interleave)
    if rope_parameters is not None:
        sizes["rope_parameters"] = dict(rope_parameters)
    config = tf.DeepseekV3Config(**sizes)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = DeepseekV3Attention(config, 0).eval()
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.normal_(0, 0.3)
    ours = mla.LatentAttention.from_transformers(theirs)
    x = torch.randn(2, 10, 32)
    position_ids = torch.arange(10)[None].expand(2, -1) + 3
    mask = torch.full((10, 10), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out, weights = theirs(x, DeepseekV3RotaryEmbedding(config)(x, position_ids), mask)
        our_out, our_weights = ours(x, position_ids, return_weights=True)
    # the same operations in the same order on the same float32 numbers
    assert ours.scaling == theirs.scaling
    assert torch.equal(our_weights, weights) and torch.equal(our_out, out)


def test_bad_input():
    x, c, w_q, w_uk, heads, _ = _inputs()
    with pytest.raises(ValueError, match="w_uk"):
        mla.absorbed_logits(x, c, w_q, w_uk[:, :3], heads)
    with pytest.raises(ValueError, match="n_heads"):
        mla.absorb_key_up_projection(w_q, w_uk, 3)
    with pytest.raises(ValueError, match="inv_freq"):
        mla.absorb_key_up_projection(w_q, w_uk, heads, torch.ones(5), offset=1)
    with pytest.raises(TypeError, match="x"):
        mla.absorbed_logits(x.long(), c, w_q, w_uk, heads)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        mla.LatentAttention(16, 2, 6, 4, 3, 3)
    with pytest.raises(ValueError, match="x must have shape"):
        _layer()(torch.randn(1, 4, 15, dtype=torch.float64))
    with pytest.raises(TypeError, match="DeepseekV3Attention"):
        mla.LatentAttention.from_transformers(torch.nn.Linear(2, 2))
