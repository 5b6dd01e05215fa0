"""RoPE application: equal to transformers and to Meta's reference, its properties, precision and errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, llama_rotary, meta_interleaved_rope, rope_parameters

import posenc
from posenc.multihead import split_heads

positions_strategy = st.floats(min_value=-2000, max_value=2000, allow_nan=False)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_application_equals_transformers_llama_in_fp32(case):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(2, 4, 40, HEAD_DIM), torch.randn(2, 4, 40, HEAD_DIM)
    position_ids = torch.stack((torch.arange(40), torch.arange(40) + 1500))  # second row past the trained length
    reference = llama_rotary(case)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, *reference(q, position_ids))
    module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS)
    q_out, k_out = module(q, k, positions=position_ids)
    if case in ("dynamic", "longrope"):  # these pick their table from the longest position of the batch
        assert torch.allclose(q_out, q_ref, atol=1e-5) and torch.allclose(k_out, k_ref, atol=1e-5)
    else:
        assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


def test_partial_rotary_equals_transformers_gpt_neox():
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    config = GPTNeoXConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    q, k = torch.randn(1, 4, 12, HEAD_DIM), torch.randn(1, 4, 12, HEAD_DIM)
    position_ids = torch.arange(12)[None]
    q_ref, k_ref = apply_rotary_pos_emb(q, k, *GPTNeoXRotaryEmbedding(config)(q, position_ids))
    q_out, k_out = posenc.RotaryEmbedding(HEAD_DIM, {"partial_rotary_factor": 0.25})(q, k)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    assert torch.equal(q_out[..., 16:], q[..., 16:])  # the unrotated part passes through


def test_interleaved_layout_equals_meta_reference():
    x = torch.randn(3, 2, 17, 32)
    positions = torch.arange(17) + 5
    inv_freq, _ = posenc.rope_frequencies(32)
    expected = meta_interleaved_rope(x, positions)
    assert torch.allclose(posenc.rotate(x, positions, inv_freq, layout="interleaved"), expected, atol=1e-5)


def test_rope_matrix_is_the_same_map():
    inv_freq, _ = posenc.rope_frequencies(16)
    x = torch.randn(16, dtype=torch.float64)
    for layout in posenc.rope.LAYOUTS:
        by_matrix = posenc.rope_matrix(7.5, inv_freq, layout) @ x
        by_elements = posenc.rotate(x[None], torch.tensor([7.5]), inv_freq, layout=layout)[0]
        assert torch.allclose(by_matrix, by_elements, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    m=positions_strategy, n=positions_strategy, shift=positions_strategy, layout=st.sampled_from(posenc.rope.LAYOUTS)
)
def test_logits_depend_only_on_relative_position(m, n, shift, layout):
    q, k = torch.randn(2, 32, dtype=torch.float64).unbind(0)
    inv_freq = posenc.rope_frequencies(32)[0].double()

    def logit(a, b):
        qa = posenc.rotate(q[None], torch.tensor([a], dtype=torch.float64), inv_freq, layout=layout)[0]
        kb = posenc.rotate(k[None], torch.tensor([b], dtype=torch.float64), inv_freq, layout=layout)[0]
        return (qa @ kb).item()

    # the float32 angles carry a round-off of about |position| * 6e-8 radians
    assert logit(m, n) == pytest.approx(logit(m + shift, n + shift), abs=5e-3 * (q.norm() * k.norm()).item())


@settings(max_examples=30, deadline=None)
@given(position=positions_strategy, layout=st.sampled_from(posenc.rope.LAYOUTS))
def test_rotation_preserves_norm(position, layout):
    x = torch.randn(5, 64)
    rotated = posenc.rotate(x, torch.full((5,), position), layout=layout)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(a=positions_strategy, b=positions_strategy)
def test_rotations_compose_like_positions_add(a, b):
    inv_freq = posenc.rope_frequencies(32)[0]
    matrix_a, matrix_b, matrix_ab = (posenc.rope_matrix(t, inv_freq) for t in (a, b, a + b))
    assert torch.allclose(matrix_a @ matrix_b, matrix_ab, atol=1e-9)
    x = torch.randn(1, 32, dtype=torch.float64)
    twice = posenc.rotate(posenc.rotate(x, [a], inv_freq.double()), [b], inv_freq.double())
    once = posenc.rotate(x, [a + b], inv_freq.double())
    assert torch.allclose(twice, once, atol=1e-3)


@settings(max_examples=25, deadline=None)
@given(n_heads=st.integers(1, 4), half=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_layouts_agree_after_weight_permutation(n_heads, half, seed):
    generator = torch.Generator().manual_seed(seed)
    head_dim, d_model, length = 2 * half, 12, 6
    w_q = torch.randn(n_heads * head_dim, d_model, generator=generator, dtype=torch.float64)
    w_k = torch.randn(n_heads * head_dim, d_model, generator=generator, dtype=torch.float64)
    x = torch.randn(1, length, d_model, generator=generator, dtype=torch.float64)

    def logits(wq, wk, layout):
        q, k = split_heads(x @ wq.T, n_heads), split_heads(x @ wk.T, n_heads)
        inv_freq = posenc.rope_frequencies(head_dim)[0].double()
        return posenc.rotate(q, inv_freq=inv_freq, layout=layout) @ posenc.rotate(
            k, inv_freq=inv_freq, layout=layout
        ).transpose(-1, -2)

    interleaved = logits(w_q, w_k, "interleaved")
    half_split = logits(
        posenc.permute_qk_weight(w_q, n_heads, to="half"), posenc.permute_qk_weight(w_k, n_heads, to="half"), "half"
    )
    assert torch.allclose(interleaved, half_split, atol=1e-9)
    back = posenc.permute_qk_weight(posenc.permute_qk_weight(w_q, n_heads, to="half"), n_heads, to="interleaved")
    assert torch.equal(back, w_q)


def test_bf16_at_large_positions_stays_close_to_float64():
    positions = torch.arange(0, 100_001, 97)
    x_bf16 = torch.randn(2, len(positions), 128).to(torch.bfloat16)
    x64 = x_bf16.double()  # the reference rotates the very same (bf16-rounded) input in float64
    inv_freq = posenc.rope_frequencies(128)[0]
    angles = positions[:, None].double() * inv_freq.double()
    x1, x2 = x64[..., :64], x64[..., 64:]
    reference = torch.cat((x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()), -1)
    out = posenc.rotate(x_bf16, positions, inv_freq)
    assert out.dtype == torch.bfloat16
    assert (out.double() - reference).abs().max() < 2e-2
    # what goes wrong when positions themselves are held in bf16 (as some libraries do)
    coarse = posenc.rotate(x64, positions.to(torch.bfloat16).double(), inv_freq.double())
    assert (coarse - reference).abs().max() > 1.0


def test_real_valued_positions_and_cache_offset():
    module = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 2, 5, 16)
    full_q, _ = module(torch.cat((torch.randn(1, 2, 3, 16), q), dim=2), torch.zeros(1, 2, 8, 16))
    cached_q, _ = module(q, q, offset=3)
    assert torch.allclose(full_q[:, :, 3:], cached_q, atol=1e-6)
    continuous, _ = module(q, q, positions=torch.tensor([0.0, 0.5, 1.25, 2.0, 3.5]))
    assert torch.allclose(continuous[:, :, 0], q[:, :, 0]) and not torch.allclose(continuous, q)


class TestBadInput:
    def test_odd_head_dimension(self):
        with pytest.raises(ValueError, match="even"):
            posenc.apply_rope(torch.randn(4, 7), torch.randn(4, 3), torch.randn(4, 3))
        with pytest.raises(ValueError, match="head_dim"):
            posenc.RotaryEmbedding(15)

    @pytest.mark.parametrize("positions", [torch.zeros(2, 3, 4), torch.tensor(3.0)])
    def test_positions_of_the_wrong_shape(self, positions):
        with pytest.raises(ValueError, match="positions"):
            posenc.rope_cos_sin(positions, posenc.rope_frequencies(8)[0])

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_non_finite_positions(self, bad):
        with pytest.raises(ValueError, match="positions must be finite"):
            posenc.rope_cos_sin(torch.tensor([0.0, bad]), posenc.rope_frequencies(8)[0])

    def test_positions_of_the_wrong_type(self):
        with pytest.raises(TypeError, match="positions"):
            posenc.rope_cos_sin(torch.tensor([True, False]), posenc.rope_frequencies(8)[0])
        with pytest.raises(TypeError, match="positions"):
            posenc.rope_cos_sin("0123", posenc.rope_frequencies(8)[0])

    def test_mismatched_dimensions(self):
        cos, sin = posenc.rope_cos_sin(torch.arange(5), posenc.rope_frequencies(8)[0])
        with pytest.raises(ValueError, match="sequence length"):
            posenc.apply_rope(torch.randn(2, 6, 8), cos, sin)
        with pytest.raises(ValueError, match="head dimension"):
            posenc.apply_rope(torch.randn(2, 5, 4), cos, sin)
        with pytest.raises(ValueError, match="head dimension"):
            posenc.RotaryEmbedding(8)(torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16))
        with pytest.raises(ValueError, match="same shape"):
            posenc.apply_rope(torch.randn(5, 8), cos, sin[:, :2])

    def test_unknown_layout(self):
        with pytest.raises(ValueError, match="layout"):
            posenc.rotate(torch.randn(3, 8), layout="pairs")

    def test_permutation_needs_whole_heads(self):
        with pytest.raises(ValueError, match="n_heads"):
            posenc.permute_qk_weight(torch.randn(10, 4), n_heads=3)


def test_rotary_embedding_reads_the_legacy_type_key_like_rope_type():
    # {"type": "dynamic"} is the legacy spelling of rope_type (transformers accepts it); the module must rescale
    # per length with it exactly as with rope_type (same function, same numbers: exact)
    legacy = posenc.RotaryEmbedding(64, {"type": "dynamic", "factor": 2.0}, max_position_embeddings=256)
    current = posenc.RotaryEmbedding(64, {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=256)
    positions = torch.arange(1000)
    for a, b in zip(legacy.cos_sin(positions), current.cos_sin(positions)):
        assert torch.equal(a, b)
    plain = posenc.RotaryEmbedding(64, max_position_embeddings=256)
    assert not torch.equal(legacy.cos_sin(positions)[0], plain.cos_sin(positions)[0])
