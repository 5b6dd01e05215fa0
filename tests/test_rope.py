"""posenc.rope: equal to transformers and to Meta's reference, its properties and precision; the API's contracts
(bad input refused, per-sequence offsets and packed sequences equal to each sequence alone, negative positions);
float32 tables whatever the module's dtype; the sequence axis; compile and export. The oracle is the public
formula, :func:`posenc.rope.rope_reference`. The private engines have their own files: test_rope_kernels.py,
test_rope_cache.py, test_triton_rope.py."""

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


# ------------------------------------------------------------------------------------------ the API's contracts


def tables(length, rotary_dim=16, start=0):
    inv_freq, _ = posenc.rope_frequencies(rotary_dim)
    return posenc.rope_cos_sin(torch.arange(length) + start, inv_freq)


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


def test_offsets_are_checked():
    q = torch.randn(2, 3, 4, 8)
    with pytest.raises(ValueError, match="offset must be an int or a tensor of shape"):
        posenc.rotate(q, offset=torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="offset must be an int or an integer tensor"):
        posenc.RotaryEmbedding(8)(q, q, offset=torch.tensor([1.0, 2.0]))


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


# ------------------------------------------------------------------------------------------ float32 tables
@pytest.mark.parametrize("cast", ["to_bf16", "half", "bfloat16", "double"])
@pytest.mark.parametrize("rope_type", ["default", "linear", "yarn"])
def test_cast_module_keeps_float32_frequencies(cast, rope_type):
    params = None if rope_type == "default" else {"rope_type": rope_type, "factor": 4.0}
    reference = posenc.RotaryEmbedding(64, params)
    module = posenc.RotaryEmbedding(64, params)
    module = {
        "to_bf16": lambda m: m.to(torch.bfloat16),
        "half": lambda m: m.half(),
        "bfloat16": lambda m: m.bfloat16(),
        "double": lambda m: m.double(),
    }[cast](module)
    assert module.inv_freq.dtype == torch.float32
    assert torch.equal(module.inv_freq, reference.inv_freq)
    positions = torch.tensor([0, 1, 7, 8_000, 65_535, 100_000])
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        q = torch.randn(2, 3, len(positions), 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        out, _ = module(q, q, positions)
        expected, _ = reference(q, q, positions)
        assert out.dtype == dtype
        # same float32 tables, same arithmetic: equal bit for bit, at every position up to 100,000
        assert torch.equal(out, expected)


def test_cast_bf16_frequencies_would_be_wrong():
    """The control: a bf16-rounded inv_freq moves the rotated queries at position 8,000 by more than 1."""
    module = posenc.RotaryEmbedding(64)
    q = torch.randn(1, 1, 1, 64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([8_000])
    good = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq))
    bad = posenc.apply_rope(q, *posenc.rope_cos_sin(positions, module.inv_freq.bfloat16().float()))
    assert (good - bad).abs().max() > 1


def test_cast_module_moves_device_and_loads_state():
    module = posenc.RotaryEmbedding(32).to("meta", torch.bfloat16)
    assert module.inv_freq.device.type == "meta" and module.inv_freq.dtype == torch.float32


# ------------------------------------------------------------------------------------------ shapes: seq_dim
def _sequence_first(t):
    return t.transpose(1, 2).contiguous()  # (B, H, T, D) -> (B, T, H, D)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
@pytest.mark.parametrize("batched", [False, True])
def test_seq_dim_minus_3_is_the_transposed_rotation(layout, rotary_fraction, batched):
    """(B, T, H, D) with seq_dim=-3 equals the (B, H, T, D) rotation transposed, bit for bit: the same
    elementwise arithmetic on the same numbers, only the memory order differs."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 7, 32, generator=generator)
    inv_freq, _ = posenc.rope_frequencies(32, {"partial_rotary_factor": rotary_fraction})
    positions = torch.stack((torch.arange(7), torch.arange(7) + 40)) if batched else torch.arange(7) + 5
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    expected = posenc.apply_rope(q, cos, sin, layout)
    sequence_first = _sequence_first(q)
    assert torch.equal(posenc.apply_rope(sequence_first, cos, sin, layout, seq_dim=-3), _sequence_first(expected))
    assert torch.equal(posenc.apply_rope(sequence_first, cos, sin, layout, seq_dim=1), _sequence_first(expected))
    assert torch.equal(
        posenc.rotate(sequence_first, positions, inv_freq, layout=layout, seq_dim=-3),
        _sequence_first(posenc.rotate(q, positions, inv_freq, layout=layout)),
    )
    in_place = sequence_first.clone()
    assert posenc.apply_rope_(in_place, cos, sin, layout, seq_dim=-3) is in_place
    assert torch.equal(in_place, _sequence_first(expected))


@pytest.mark.parametrize("shape", [(2, 3, 7, 32), (1, 4, 600, 64)])  # the formula and the blocked kernel
def test_seq_dim_minus_3_gradients_and_module(shape):
    q = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    k = torch.randn(shape[0], 1, *shape[2:], generator=torch.Generator().manual_seed(3))  # one KV head (GQA)
    module = posenc.RotaryEmbedding(shape[-1])
    sequence_first = posenc.RotaryEmbedding(shape[-1], seq_dim=-3)
    expected = module(q, k, offset=4)
    leaves = [_sequence_first(t).requires_grad_() for t in (q, k)]
    out = sequence_first(*leaves, offset=4)
    for o, e in zip(out, expected):
        assert torch.equal(o, _sequence_first(e))
    assert torch.equal(module(_sequence_first(q), _sequence_first(k), offset=4, seq_dim=-3)[0], out[0])
    grads = torch.autograd.grad(sum((o * o.detach()).sum() for o in out), leaves)
    # the gradient of a rotation applied to the rotated output is the input back (to float32 rounding)
    for grad, leaf in zip(grads, leaves):
        assert torch.allclose(grad, leaf.detach(), atol=1e-5)


def test_the_issue_example_is_refused_or_right():
    """RotaryEmbedding(16) on (1, 8, 2, 16) meant as (B, T, H, D): with seq_dim=-3 every head rotates at every
    token; given 8 positions without seq_dim, the error names both axes."""
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 8, 2, 16, generator=torch.Generator().manual_seed(4))
    qr, _ = r(q, q, seq_dim=-3)
    expected, _ = r(q.transpose(1, 2), q.transpose(1, 2))
    assert torch.equal(qr, expected.transpose(1, 2))
    assert not torch.equal(qr[:, 1:, 0], q[:, 1:, 0])  # head 0 rotates at tokens 1..7
    with pytest.raises(
        ValueError,
        match=r"sequence length 2 on axis seq_dim=-2.*axis -3 of q has length 8.*"
        r"seq_dim=-3",
    ):
        r(q, q, positions=torch.arange(8))
    with pytest.raises(ValueError, match=r"axis -3 of x has length 8.*seq_dim=-3"):
        posenc.apply_rope(q, *posenc.rope_cos_sin(torch.arange(8), r.inv_freq))


def test_ambiguous_axes_are_refused_until_seq_dim_is_given():
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 8, 8, 16)
    with pytest.raises(ValueError, match=r"ambiguous.*axis -2 and axis -3.*seq_dim=-2.*seq_dim=-3"):
        r(q, q)
    cos, sin = posenc.rope_cos_sin(torch.arange(8), r.inv_freq)
    with pytest.raises(ValueError, match="ambiguous"):
        posenc.apply_rope(q, cos, sin)
    heads_first = posenc.apply_rope(q, cos, sin, seq_dim=-2)
    assert torch.equal(r(q, q, seq_dim=-2)[0], heads_first)
    assert torch.equal(posenc.RotaryEmbedding(16, seq_dim=-2)(q, q)[0], heads_first)
    assert torch.equal(posenc.apply_rope(q, cos[None, None], sin[None, None]), heads_first)  # aligned: explicit
    # a single position is never ambiguous (both readings rotate by the same angle)
    assert r(torch.randn(2, 1, 1, 16), torch.randn(2, 1, 1, 16), offset=9)[0].shape == (2, 1, 1, 16)


def test_gqa_in_the_wrong_layout_names_the_axis():
    r = posenc.RotaryEmbedding(16)
    q, k = torch.randn(1, 5, 4, 16), torch.randn(1, 5, 2, 16)  # (B, T, H, D) with 4 query and 2 key heads
    with pytest.raises(ValueError, match=r"same length on the sequence axis seq_dim=-2.*agree on axis -3.*seq_dim=-3"):
        r(q, k)
    assert r(q, k, seq_dim=-3)[1].shape == k.shape


def test_batched_positions_must_match_the_batch():
    r = posenc.RotaryEmbedding(16)
    q = torch.randn(2, 3, 5, 16)
    with pytest.raises(ValueError, match="batch size 3 .* batch size 2"):
        r(q, q, positions=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="seq_dim must be -2"):
        posenc.apply_rope(q, *posenc.rope_cos_sin(torch.arange(5), r.inv_freq), seq_dim=-1)
    with pytest.raises(ValueError, match="seq_dim must be -2"):
        posenc.RotaryEmbedding(16, seq_dim=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_integer_and_complex_x_are_refused(dtype):
    r = posenc.RotaryEmbedding(16)
    x = torch.ones(1, 2, 3, 16).to(dtype)
    cos, sin = posenc.rope_cos_sin(torch.arange(3), r.inv_freq)
    for call, name in (
        (lambda: posenc.apply_rope(x, cos, sin), "x"),
        (lambda: posenc.apply_rope_(x, cos, sin), "x"),
        (lambda: posenc.rotate(x), "x"),
        (lambda: r(x, torch.ones(1, 2, 3, 16)), "q"),
        (lambda: r(torch.ones(1, 2, 3, 16), x), "k"),
        (lambda: posenc.apply_rope_qk(torch.ones(1, 2, 3, 16), x, cos, sin), "k"),
    ):
        with pytest.raises(TypeError, match=rf"^{name} must be a real floating-point tensor"):
            call()


def test_numpy_integers_are_ints():
    np = pytest.importorskip("numpy")
    module = posenc.RotaryEmbedding(np.int64(64), max_position_embeddings=np.int32(512))
    assert module.head_dim == 64 and type(module.head_dim) is int
    assert torch.equal(posenc.rope_frequencies(np.int64(64))[0], posenc.rope_frequencies(64)[0])
    assert torch.equal(posenc.alibi_slopes(np.int16(8)), posenc.alibi_slopes(8))
    assert (
        posenc.rope_frequencies(
            64, {"rope_type": "yarn", "factor": np.float64(4.0), "original_max_position_embeddings": np.int64(256)}
        )[1]
        > 1
    )
    with pytest.raises(TypeError, match="head_dim must be an int, got float"):
        posenc.RotaryEmbedding(64.0)


# ------------------------------------------------------------------------------------------ one call
def test_apply_rope_qk_is_two_apply_rope_calls():
    q, k = torch.randn(2, 4, 9, 32), torch.randn(2, 2, 9, 32)
    cos, sin = posenc.rope_cos_sin(torch.arange(9) + 3, posenc.rope_frequencies(32)[0])
    q_rot, k_rot = posenc.apply_rope_qk(q, k, cos, sin)
    assert torch.equal(q_rot, posenc.apply_rope(q, cos, sin)) and torch.equal(k_rot, posenc.apply_rope(k, cos, sin))


# ------------------------------------------------------------------------------------------ compile and export
def test_length_tables_from_a_tensor_equal_those_from_an_int():
    """Dynamic NTK and LongRoPE computed from a 0-d tensor length (no host sync) equal the int path bit for bit."""
    from reference_rope import HEAD_DIM, MAX_POSITIONS, rope_parameters

    for case in ("dynamic", "longrope"):
        for seq_len in (1, 255, 256, 257, 1023, 1024, 1025, 1500, 4096, 100_000):
            by_int = posenc.rope_frequencies(HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_len=seq_len)
            by_tensor = posenc.rope_frequencies(
                HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_len=torch.tensor(seq_len)
            )
            assert torch.equal(by_int[0], by_tensor[0]) and by_int[1] == by_tensor[1]
    with pytest.raises(TypeError, match="seq_len must be an int or a 0-d integer tensor"):
        posenc.rope_frequencies(64, {"rope_type": "dynamic", "factor": 2.0}, seq_len=torch.tensor([3.0]))


def test_length_dependent_types_run_on_meta_with_explicit_positions():
    from reference_rope import HEAD_DIM, MAX_POSITIONS, rope_parameters

    for case in ("dynamic", "longrope"):
        module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS).to("meta")
        q = torch.empty(2, 4, 6, HEAD_DIM, device="meta")
        out, _ = module(q, q, positions=torch.zeros(2, 6, dtype=torch.long, device="meta"))
        assert out.shape == q.shape and out.device.type == "meta"


def test_compiled_fullgraph_dynamic_no_recompile_for_every_rope_type():
    """torch.compile(fullgraph=True, dynamic=True): one graph per rope type, reused at every length (explicit
    (B, T) positions and default positions after a KV-cache offset, (B, T, H, D) tensors), equal to eager. The
    "eager" backend runs dynamo's tracing and guards, which is what breaks or recompiles, without a C++ build."""
    import torch._dynamo
    from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, rope_parameters

    for case in sorted(ROPE_CASES):
        module = posenc.RotaryEmbedding(HEAD_DIM, rope_parameters(case), MAX_POSITIONS, seq_dim=-3)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        counts = []
        with torch._dynamo.config.patch(error_on_recompile=True):
            explicit = torch.compile(lambda q, k, p: module(q, k, p), fullgraph=True, dynamic=True, backend="eager")  # noqa: B023
            cached = torch.compile(lambda q, k: module(q, k, offset=3), fullgraph=True, dynamic=True, backend="eager")  # noqa: B023
            for length in (5, 17, 1500):  # past the trained length 256 / 1024 at 1500, and past the kernel's size
                q, k = torch.randn(2, length, 4, HEAD_DIM), torch.randn(2, length, 2, HEAD_DIM)
                positions = torch.arange(length)[None] + torch.tensor([[0], [7]])
                for got, want in (
                    (explicit(q, k, positions), module(q, k, positions)),
                    (cached(q, k), module(q, k, offset=3)),
                ):
                    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (case, length)
                counts.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        assert counts == [2, 2, 2], (case, counts)  # one graph for each of the two calls, at every length
        assert not torch._dynamo.utils.counters["graph_break"], case


def test_compiled_true_with_sequence_first_tensors():
    x = torch.randn(2, 9, 3, 32, requires_grad=True)
    cos, sin = posenc.rope_cos_sin(torch.arange(9), posenc.rope_frequencies(32)[0])
    expected = posenc.apply_rope(x, cos, sin, seq_dim=-3)
    out = posenc.apply_rope(x, cos, sin, seq_dim=-3, compiled=True)
    # inductor may fuse the multiply and add (one rounding instead of two): a float32 rounding or two per entry
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.allclose(grad, torch.autograd.grad(expected.sum(), x)[0], atol=1e-5, rtol=1e-5)


class _Block(torch.nn.Module):
    """qkv projection -> RoPE on (B, T, H, D) -> causal SDPA."""

    def __init__(self, width=32, heads=2):
        super().__init__()
        self.heads, self.qkv = heads, torch.nn.Linear(width, 3 * width)
        self.rope = posenc.RotaryEmbedding(width // heads, seq_dim=-3)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)  # each (B, T, H, D)
        q, k = self.rope(q, k)
        out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        return out.transpose(1, 2).flatten(2)


def test_export_with_a_dynamic_length_matches_eager():
    from torch.export import Dim, export

    torch.manual_seed(0)
    block = _Block().eval()
    exported = export(block, (torch.randn(1, 16, 32),), dynamic_shapes={"x": {1: Dim("T", min=2, max=8192)}})
    for length in (3, 511, 512, 5000):  # 512 and 5000: eager takes the blocked kernel, the graph the formula
        x = torch.randn(1, length, 32)
        with torch.no_grad():
            assert torch.equal(exported.module()(x), block(x)), length


def test_finiteness_is_checked_in_eager_cpu_calls_only():
    module = posenc.RotaryEmbedding(16)
    q = torch.randn(1, 2, 3, 16)
    bad = torch.tensor([0.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="positions must be finite"):
        module(q, q, positions=bad)
    compiled = torch.compile(lambda q, p: module(q, q, p), fullgraph=True, backend="eager")
    assert compiled(q, bad)[0].isnan().any()  # traced: no value is read back, the NaN goes through
