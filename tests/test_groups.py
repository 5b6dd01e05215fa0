"""posenc.groups: one-parameter groups exp(tX) as encodings, the generator of every family, the classification."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import groups
from posenc.group_encodings import _exp_each, _exp_on_grid

D = 8
times = st.floats(min_value=-30, max_value=30, allow_nan=False)


def random_generator(dim=D, scale=0.3, seed=0):
    return scale * torch.randn(dim, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def family_generators(dim=D):
    """One float64 generator per family (and the known encodings)."""
    return {
        "none": torch.zeros(dim, dim, dtype=torch.float64),
        "decay": groups.decay_generator(dim, torch.linspace(0.05, 0.5, dim), dtype=torch.float64),
        "growth": groups.decay_generator(dim, -0.1, dtype=torch.float64),
        "rotation": groups.rope_generator(dim, dtype=torch.float64),
        "xpos": groups.xpos_generator(dim, dtype=torch.float64),
        "retnet": groups.damped_rope_generator(dim, 0.9, dtype=torch.float64),
        "jordan": groups.jordan_generator(dim, -0.05, dtype=torch.float64),
        "jordan real": groups.jordan_generator(dim, 0.0, 0.0, block=4, dtype=torch.float64),
        "dense": random_generator(dim),
    }


def logits(encoding, q, k, q_positions, k_positions):
    q_out, k_out = encoding.encode_qk(q, k, q_positions, k_positions)
    return q_out @ k_out.transpose(-1, -2)


# the group ------------------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(a=times, b=times, seed=st.integers(0, 2**16))
def test_group_law(a, b, seed):
    x = random_generator(seed=seed)
    first, second = groups.one_parameter_group(x, a), groups.one_parameter_group(x, b)
    together = groups.one_parameter_group(x, a + b)
    scale = torch.linalg.matrix_norm(first) * torch.linalg.matrix_norm(second)  # round-off of the product
    assert (first @ second - together).abs().max() <= 1e-11 * scale


def test_identity_at_zero_and_shapes_and_dtype():
    x = random_generator()
    # exact by construction: 0 * X is exactly the zero matrix, and every operation of exp (polynomial terms, scaling
    # and squaring) on 0 and I is exact
    assert torch.equal(groups.one_parameter_group(x, 0.0), torch.eye(D, dtype=torch.float64))
    assert groups.one_parameter_group(x, torch.zeros(3, 4)).shape == (3, 4, D, D)
    assert groups.one_parameter_group(x.to(torch.bfloat16), 2).dtype == torch.float32  # float32 or better
    assert groups.one_parameter_group(x.float(), torch.tensor(2.0, dtype=torch.float64)).dtype == torch.float64


def test_grid_evaluation_equals_one_exponential_per_time():
    x = random_generator(scale=0.05)
    t = torch.arange(-40, 300, dtype=torch.float64)
    assert torch.allclose(_exp_on_grid(x, t), _exp_each(x, t), rtol=1e-10, atol=1e-10)
    assert torch.allclose(groups.one_parameter_group(x, torch.arange(-40, 300)), _exp_each(x, t), rtol=1e-10,
                          atol=1e-10)


def test_key_map_is_inverse_transpose():
    encoding = groups.GroupEncoding(random_generator())
    s = torch.tensor([-2.5, 0.0, 3.0, 17.0])
    query, key = encoding.query_maps(s), encoding.key_maps(s)
    scale = (torch.linalg.matrix_norm(query) * torch.linalg.matrix_norm(key))[:, None, None]
    assert ((query.transpose(-1, -2) @ key - torch.eye(D, dtype=torch.float64)).abs() <= 1e-12 * scale).all()


# translation invariance -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(family_generators()))
@settings(max_examples=10, deadline=None)
@given(shift=st.floats(min_value=-50, max_value=50, allow_nan=False))
def test_group_encoding_logits_depend_only_on_the_offset(family, shift):
    encoding = groups.GroupEncoding(family_generators()[family])
    q, k = torch.randn(2, 3, 5, D, dtype=torch.float64), torch.randn(2, 3, 6, D, dtype=torch.float64)
    q_pos, k_pos = torch.tensor([0.0, 1.5, 2.0, 7.0, 9.25], dtype=torch.float64), torch.arange(6.0).double()
    before = logits(encoding, q, k, q_pos, k_pos)
    after = logits(encoding, q, k, q_pos + shift, k_pos + shift)
    # round-off grows with the size of the maps themselves (large for growth at large times)
    norms = [torch.linalg.matrix_norm(m).max() for m in (encoding.query_maps(q_pos + shift),
                                                         encoding.key_maps(k_pos + shift))]
    assert (before - after).abs().max() <= 1e-11 * norms[0] * norms[1] * q.norm(dim=-1).max() * k.norm(dim=-1).max()
    kernel = groups.relative_kernel(encoding.generator, q_pos[:, None] - k_pos[None, :])  # (Lq, Lk, D, D)
    direct = torch.einsum("bhid,ijde,bhje->bhij", q, kernel, k)
    assert torch.allclose(before, direct, rtol=1e-7, atol=1e-7 * before.abs().max().item())


def test_a_map_that_is_not_a_group_is_not_translation_invariant():
    x = random_generator()

    class Linearised(groups.GroupEncoding):  # F(t) = I + tX: the first-order truncation, not a group
        def query_maps(self, positions, sign=1.0):
            t = sign * torch.as_tensor(positions, dtype=torch.float64)
            return torch.eye(D, dtype=torch.float64) + t[..., None, None] * self.generator

    encoding = Linearised(x)
    q, k = torch.randn(1, 1, 4, D, dtype=torch.float64), torch.randn(1, 1, 4, D, dtype=torch.float64)
    positions = torch.arange(4.0)
    change = (logits(encoding, q, k, positions, positions) - logits(encoding, q, k, positions + 5, positions + 5))
    assert change.abs().max() > 0.1


def test_batched_positions_and_one_generator_per_head():
    heads = torch.stack([groups.damped_rope_generator(D, g, dtype=torch.float64) for g in groups.retnet_decays(3)])
    encoding = groups.GroupEncoding(heads)
    q, k = (torch.randn(1, 3, 5, D, dtype=torch.float64).expand(2, 3, 5, D) for _ in range(2))
    positions = torch.stack((torch.arange(5), torch.arange(5) + 11))
    batched = logits(encoding, q, k, positions, positions)
    for b in range(2):
        for h in range(3):
            single = groups.GroupEncoding(heads[h])
            expected = logits(single, q[b, h], k[b, h], positions[b], positions[b])
            # same maps, products grouped differently by einsum: a few ulp of |q| |k| ||F|| ||G|| per logit
            bound = 64 * torch.finfo(torch.float64).eps * (q[b, h].norm(dim=-1).max() * k[b, h].norm(dim=-1).max()
                                                           * size_of_maps(single, positions[b]))
            assert (batched[b, h] - expected).abs().max() <= bound
    # shifted rows, same offsets: equal in exact arithmetic; round-off of the maps at positions up to 15 (norms of
    # F and G at most gamma^-15 < 1.7), relative to the largest logit
    assert torch.allclose(batched[0], batched[1], rtol=0, atol=1e-12 * batched.abs().max().item())


def size_of_maps(encoding, positions):
    """max ||F(t)|| * max ||G(t)|| over ``positions`` (spectral norms): the scale of the round-off in a logit."""
    return (torch.linalg.matrix_norm(encoding.query_maps(positions), ord=2).max()
            * torch.linalg.matrix_norm(encoding.key_maps(positions), ord=2).max())


def test_learnable_generator_gets_gradients_and_low_precision_inputs_keep_their_dtype():
    encoding = groups.GroupEncoding(groups.rope_generator(D), learnable=True)
    q = torch.randn(1, 2, 4, D, requires_grad=True)
    logits(encoding, q, q, torch.arange(4), torch.arange(4)).sum().backward()
    assert isinstance(encoding.generator, torch.nn.Parameter)
    assert encoding.generator.grad is not None and encoding.generator.grad.abs().sum() > 0
    q_half, k_half = groups.GroupEncoding(groups.rope_generator(D)).encode_qk(
        q.detach().bfloat16(), q.detach().bfloat16(), torch.arange(4), torch.arange(4))
    assert q_half.dtype == k_half.dtype == torch.bfloat16


# known encodings as generators ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_generator_equals_posenc_rope(layout):
    inv_freq, _ = posenc.rope_frequencies(D)
    x = groups.rope_generator(D, layout=layout, dtype=torch.float64)
    for t in (0.0, 1.0, 2.5, 37.0, 1000.0):
        # float64 angles up to 1000: both sides round t * theta to ~1e-13 absolute
        assert torch.allclose(groups.one_parameter_group(x, t), posenc.rope_matrix(t, inv_freq, layout), atol=1e-12)
    q, k = torch.randn(2, 4, 6, D), torch.randn(2, 4, 6, D)
    positions = torch.arange(6) + 100
    ours = groups.GroupEncoding(groups.rope_generator(D, layout=layout)).encode_qk(q, k, positions, positions)
    theirs = posenc.RoPE(D, layout=layout).encode_qk(q, k, positions, positions)
    # float32 at positions ~105: the angles differ by ~eps * 105 ~ 1e-5, times |q| entries of a few units
    assert torch.allclose(ours[0], theirs[0], atol=1e-4) and torch.allclose(ours[1], theirs[1], atol=1e-4)
    assert torch.allclose(ours[0], posenc.rotate(q, positions, inv_freq, layout=layout), atol=1e-4)


def test_rope_generator_takes_any_frequency_table():
    inv_freq, _ = posenc.rope_frequencies(D, {"rope_type": "linear", "factor": 4.0})
    x = groups.rope_generator(D, inv_freq=inv_freq, dtype=torch.float64)
    assert torch.allclose(groups.one_parameter_group(x, 9.0), posenc.rope_matrix(9.0, inv_freq), atol=1e-12)


def test_alibi_block_equals_alibi_bias_under_a_causal_mask():
    n_heads, length = 4, 7
    slopes = posenc.alibi_slopes(n_heads).double()
    q_bar, k_bar = groups.alibi_vectors(slopes)
    encoding = groups.GroupEncoding(groups.alibi_generator(dtype=torch.float64))
    positions = torch.arange(length)
    q = q_bar.expand(1, n_heads, length, 2)
    k = k_bar[None, :, None, :].expand(1, n_heads, length, 2)
    bias = logits(encoding, q, k, positions, positions)[0]
    # float32 reference: biases up to 0.25 * 6 carry ~1e-7 round-off
    assert torch.allclose(bias.float(), posenc.alibi_bias(length, slopes=slopes.float()), atol=1e-5)
    n = groups.alibi_generator(dtype=torch.float64)
    for m, a in ((0.5, 3.0), (0.125, 11.0)):  # the post's form: (1, 0)^T exp(aN) (0, -m) = -m a
        value = torch.tensor([1.0, 0.0], dtype=torch.float64) @ groups.one_parameter_group(n, a) @ torch.tensor(
            [0.0, -m], dtype=torch.float64)
        assert value.item() == pytest.approx(-m * a)
    assert groups.classify_generator(n)[0].family == "real jordan"  # unipotent, not the exotic complex class


def test_alibi_through_attention_with_augmented_heads():
    """ALiBi as two extra feature dimensions per head with the generator 0 (+) N: same attention output."""
    n_heads, length, dim = 4, 9, 6
    q, k, v = (torch.randn(1, n_heads, length, dim, dtype=torch.float64) for _ in range(3))
    slopes = posenc.alibi_slopes(n_heads).double()
    q_bar, k_bar = groups.alibi_vectors(slopes)
    wide = dim + 2
    q_aug = torch.cat((q * math.sqrt(wide / dim), q_bar.expand(1, n_heads, length, 2) * math.sqrt(wide)), dim=-1)
    k_aug = torch.cat((k, k_bar[None, :, None, :].expand(1, n_heads, length, 2)), dim=-1)
    generator = torch.block_diag(torch.zeros(dim, dim, dtype=torch.float64), groups.alibi_generator(torch.float64))
    v_aug = torch.cat((v, torch.zeros(1, n_heads, length, 2, dtype=torch.float64)), dim=-1)
    ours = posenc.attention(q_aug, k_aug, v_aug, encoding=groups.GroupEncoding(generator), causal=True)[..., :dim]
    theirs = posenc.attention(q, k, v, encoding=posenc.ALiBi(n_heads), causal=True)
    assert torch.allclose(ours, theirs.double(), atol=1e-6)  # posenc.ALiBi uses float32 slopes: ~1e-7 off


def test_xpos_generator_equals_direct_xpos():
    q, k = torch.randn(1, 2, 5, D, dtype=torch.float64), torch.randn(1, 2, 6, D, dtype=torch.float64)
    n, m = torch.arange(5.0) + 20, torch.arange(6.0) + 3
    inv_freq, _ = posenc.rope_frequencies(D)
    zeta = torch.cat([groups.xpos_scales(D)] * 2)  # half layout: pair j is features (j, j + D/2)
    q_direct = posenc.rotate(q, n, inv_freq).double() * zeta ** (n[:, None] / 512)
    k_direct = posenc.rotate(k, m, inv_freq).double() * zeta ** (-m[:, None] / 512)
    q_ours, k_ours = groups.GroupEncoding(groups.xpos_generator(D, dtype=torch.float64)).encode_qk(q, k, n, m)
    # posenc.rotate works in float32 (angles up to 25 -> ~3e-6 absolute); the group side is float64
    assert torch.allclose(q_ours, q_direct, atol=1e-5) and torch.allclose(k_ours, k_direct, atol=1e-5)


def test_damped_rope_equals_retnet_decay_times_rope():
    gamma = 0.85
    q, k = torch.randn(1, 1, 7, D, dtype=torch.float64), torch.randn(1, 1, 7, D, dtype=torch.float64)
    positions = torch.arange(7.0)
    rope = logits(groups.GroupEncoding(groups.rope_generator(D, dtype=torch.float64)), q, k, positions, positions)
    offsets = positions[:, None] - positions[None, :]
    retnet = logits(groups.GroupEncoding(groups.damped_rope_generator(D, gamma, dtype=torch.float64)), q, k,
                    positions, positions)
    assert torch.allclose(retnet, rope * gamma**offsets, atol=1e-10)


def test_jordan_generator_closed_forms():
    a, b, t = -0.2, 0.7, 2.5
    x = groups.jordan_generator(4, a, b, block=2, dtype=torch.float64)
    c, s = math.cos(b * t), math.sin(b * t)
    rotation = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    expected = math.exp(a * t) * torch.cat((torch.cat((rotation, t * rotation), 1),
                                            torch.cat((torch.zeros(2, 2, dtype=torch.float64), rotation), 1)))
    assert torch.allclose(groups.one_parameter_group(x, t), expected, atol=1e-12)
    real = groups.one_parameter_group(groups.jordan_generator(3, a, 0.0, block=3, dtype=torch.float64), t)
    assert real[0, 2].item() == pytest.approx(math.exp(a * t) * t**2 / 2)
    assert real[0, 1].item() == pytest.approx(math.exp(a * t) * t)


# N-D ------------------------------------------------------------------------------------------------------------
def axial_generators(dim=D):
    half = groups.rope_generator(dim // 2, dtype=torch.float64)
    zero = torch.zeros_like(half)
    return torch.stack((torch.block_diag(half, zero), torch.block_diag(zero, half)))


def random_skew_generators(n=2, dim=D):
    w = torch.randn(n, dim, dim, dtype=torch.float64)
    return 0.3 * (w - w.transpose(-1, -2))


def test_commuting_generators_give_relative_encodings_and_others_do_not():
    q, k = torch.randn(1, 1, 5, D, dtype=torch.float64), torch.randn(1, 1, 5, D, dtype=torch.float64)
    p = torch.randn(5, 2, dtype=torch.float64) * 3
    shift = torch.tensor([4.0, -7.0], dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))
    string = basis.T @ axial_generators() @ basis  # STRING: RoPE in a learned orthogonal basis, still commuting
    for generators in (axial_generators(), string):
        encoding = groups.MultiGroupEncoding(generators)
        before, after = logits(encoding, q, k, p, p), logits(encoding, q, k, p + shift, p + shift)
        assert torch.allclose(before, after, atol=1e-9)
    liere = groups.MultiGroupEncoding(random_skew_generators(), check=False)
    before, after = logits(liere, q, k, p, p), logits(liere, q, k, p + shift, p + shift)
    assert (before - after).abs().max() > 0.1


def test_commuting_check():
    groups.check_commuting(axial_generators())
    x = random_generator()
    groups.check_commuting(torch.stack((x, x @ x, 2 * x)))  # polynomials in one matrix commute
    with pytest.raises(ValueError, match="generators 0 and 1 do not commute"):
        groups.check_commuting(random_skew_generators())
    with pytest.raises(ValueError, match="do not commute"):
        groups.multi_parameter_group(random_skew_generators(), torch.zeros(2))
    with pytest.raises(ValueError, match="do not commute"):
        groups.MultiGroupEncoding(random_skew_generators())


def test_multi_parameter_group_reduces_to_one_parameter():
    x = random_generator()
    assert torch.allclose(groups.multi_parameter_group(x[None], torch.tensor([2.5])),
                          groups.one_parameter_group(x, 2.5), atol=1e-12)
    assert groups.multi_parameter_group(axial_generators(), torch.zeros(3, 4, 2)).shape == (3, 4, D, D)


# classification -------------------------------------------------------------------------------------------------
def block_signature(blocks):
    return [(b.family, b.size, b.multiplicity) for b in blocks]


KNOWN_STRUCTURES = {
    "none": (torch.zeros(3, 3), [("none", 1, 3)]),
    "decay": (groups.decay_generator(3, torch.tensor([0.5, 1.0, 2.0])), [("decay", 1, 1)] * 3),
    "growth": (groups.decay_generator(2, -0.3), [("growth", 1, 2)]),
    "rotation": (groups.rope_generator(6), [("rotation", 1, 1)] * 3),
    "damped rotation (xPos)": (groups.xpos_generator(6), [("damped rotation", 1, 1)] * 3),
    "damped rotation (RetNet)": (groups.damped_rope_generator(4, 0.9), [("damped rotation", 1, 1)] * 2),
    "alibi": (groups.alibi_generator(), [("real jordan", 2, 1)]),
    "jordan real 3": (groups.jordan_generator(3, -0.2, 0.0, block=3), [("real jordan", 3, 1)]),
    "jordan unipotent 4": (groups.jordan_generator(4, 0.0, 0.0, block=4), [("real jordan", 4, 1)]),
    "jordan real growth": (groups.jordan_generator(4, 0.3, 0.0, block=2), [("growth", 2, 2)]),
    "jordan complex growth": (groups.jordan_generator(4, 0.2, 0.8, block=2), [("growth", 2, 1)]),
    "jordan complex 2": (groups.jordan_generator(8, -0.05, 1.3, block=2), [("jordan", 2, 2)]),
    "jordan complex 3": (groups.jordan_generator(6, 0.0, 0.7, block=3), [("jordan", 3, 1)]),
    "mixed": (torch.block_diag(groups.jordan_generator(4, -0.1, 0.9), groups.alibi_generator(),
                               groups.decay_generator(2, 0.3), groups.rope_generator(4), torch.zeros(1, 1)),
              [("none", 1, 1), ("decay", 1, 2), ("rotation", 1, 1), ("rotation", 1, 1), ("real jordan", 2, 1),
               ("jordan", 2, 1)]),
}


@pytest.mark.parametrize("name", sorted(KNOWN_STRUCTURES))
@pytest.mark.parametrize("seed", range(3))
def test_classification_of_known_jordan_structures_in_a_random_basis(name, seed):
    block, expected = KNOWN_STRUCTURES[name]
    assert block_signature(groups.classify_generator(block)) == expected  # natural basis, float32
    generator = torch.Generator().manual_seed(seed)
    basis = torch.randn(block.shape[0], block.shape[0], dtype=torch.float64, generator=generator)
    disguised = basis @ block.double() @ torch.linalg.inv(basis)
    blocks = groups.classify_generator(disguised)
    assert block_signature(blocks) == expected
    assert sum(b.real_size * b.multiplicity for b in blocks) == block.shape[0]
    assert block_signature(groups.classify_generator(1e3 * disguised)) == expected  # rescaling time
    assert block_signature(groups.classify_generator(1e-3 * disguised)) == expected


def test_classification_eigenvalues_and_summary():
    blocks = groups.classify_generator(groups.jordan_generator(4, -0.25, 1.5, block=2, dtype=torch.float64))
    assert len(blocks) == 1 and blocks[0].eigenvalue == pytest.approx(complex(-0.25, 1.5), abs=1e-9)
    assert blocks[0].bounded  # t e^{-t/4}: the decay wins over the polynomial
    alibi = groups.classify_generator(groups.alibi_generator())
    assert not alibi[0].bounded  # polynomial growth: e^{0 t} t
    text = groups.summarize(groups.classify_generator(torch.block_diag(groups.rope_generator(4),
                                                                       groups.decay_generator(1, -1.0))))
    assert "rotation" in text and "growth" in text and "bounded for t -> +inf: no (growth)" in text
    xpos = groups.classify_generator(groups.xpos_generator(64))
    assert {b.family for b in xpos} == {"damped rotation"} and len(xpos) == 32


def test_classification_tolerance_separates_a_tiny_frequency_from_alibi():
    generator = torch.block_diag(groups.rope_generator(128, dtype=torch.float64), groups.alibi_generator(torch.float64))
    found = groups.families(groups.classify_generator(generator))
    assert found == {"rotation": 128, "real jordan": 2}


@pytest.mark.parametrize("dtype, speed", [(torch.float32, 1e3), (torch.float64, 1e6)])
def test_a_jordan_block_beside_a_much_faster_rotation_is_not_read_as_normal(dtype, speed):
    # ||[X, X^T]|| is quadratic in a Jordan coupling e: next to a rotation `speed` times faster, ALiBi's e = 1 passes
    # the commutator test (e^2 <= tol * speed^2), but the ranks resolve it (e / speed >> tol), and so must the
    # classification (the departure from normality, linear in e, sends it to the general path)
    alibi = torch.block_diag(speed * groups.rope_generator(8, dtype=dtype), groups.alibi_generator(dtype))
    assert groups.families(groups.classify_generator(alibi)) == {"rotation": 8, "real jordan": 2}
    complex_block = groups.jordan_generator(4, 0.0, 1.0, block=2, dtype=torch.float64)
    complex_block[:2, 2:] /= 10.0  # coupling 0.1: still far above the ranks' resolution at this speed
    generator = torch.block_diag(speed / 10 * groups.rope_generator(4, dtype=torch.float64), complex_block)
    assert groups.families(groups.classify_generator(generator.to(dtype))) == {"rotation": 4, "jordan": 4}


def test_real_and_complex_jordan_blocks_are_different_families():
    assert groups.family_of(0j, 2) == "real jordan" and groups.family_of(complex(-0.1, 0.0), 3) == "real jordan"
    assert groups.family_of(complex(0.0, 0.5), 2) == "jordan" and groups.family_of(complex(-0.1, 0.5), 2) == "jordan"
    assert groups.family_of(complex(0.1, 0.0), 2) == groups.family_of(complex(0.1, 0.5), 3) == "growth"
    assert {"real jordan", "jordan"} <= set(groups.FAMILIES)
    mixed = torch.block_diag(groups.alibi_generator(torch.float64),
                             groups.jordan_generator(4, -0.1, 0.7, block=2, dtype=torch.float64))
    assert groups.families(groups.classify_generator(mixed)) == {"real jordan": 2, "jordan": 4}


def test_xpos_damping_is_log_zeta_over_scale_base():
    damping = groups.xpos_generator(64, dtype=torch.float64).diagonal()[:32]  # half layout: pair j on feature j
    reference = torch.tensor([math.log(z) for z in groups.xpos_scales(64).tolist()], dtype=torch.float64) / 512
    # log1p vs log of the rounded zeta: they differ by the rounding of zeta amplified by 1 / |ln zeta| <= 90
    assert torch.allclose(damping, reference, rtol=1e-13, atol=0)
    assert groups.families(groups.classify_generator(groups.xpos_generator(256, dtype=torch.float64))) == {
        "damped rotation": 256}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_generators_resolve_small_rates_and_gaps_in_any_dtype(dtype):
    # xPos at D = 256: the slowest pair's damping is -1.1e-5; RoPE at D = 512: the slowest frequencies are 3.7e-6
    # apart. Both are far above the round-off of the stored entries (~1e-7 in float32), though below 100 eps.
    assert groups.families(groups.classify_generator(groups.xpos_generator(256, dtype=dtype))) == {
        "damped rotation": 256}
    rope = groups.classify_generator(groups.rope_generator(512, dtype=dtype))
    assert len(rope) == 256 and all(b.multiplicity == 1 for b in rope)
    # an explicit tol still reads parts below tol * ||X|| as zero
    slow = groups.damped_rope_generator(8, 1 - 2.0**-20, dtype=dtype)  # u = ln(1 - 2^-20) ~ -9.5e-7
    assert groups.families(groups.classify_generator(slow)) == {"damped rotation": 8}
    assert groups.families(groups.classify_generator(slow, tol=1e-4)) == {"rotation": 8}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(3))
def test_rotated_normal_generator_keeps_repeated_frequencies_together(dtype, seed):
    """Q (RoPE + RoPE + 0) Q^T computed in dtype: the same 2 x 8 frequencies twice and a 3-D kernel."""
    n = 35
    basis, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    rope = groups.rope_generator(16, dtype=torch.float64)
    block = torch.block_diag(rope, rope, torch.zeros(3, 3, dtype=torch.float64))
    x = basis.to(dtype) @ block.to(dtype) @ basis.to(dtype).T
    blocks = groups.classify_generator(x)
    assert groups.families(blocks) == {"none": 3, "rotation": 32}
    assert sorted(b.multiplicity for b in blocks) == [2] * 8 + [3]


# the common torus of commuting skew generators ------------------------------------------------------------------
def torus_generators(frequencies, seed=0, extra=0):
    """Commuting skew generators Q (plus_j w_ij J) Q^T (+ an ``extra``-dimensional common kernel), Q random."""
    n, planes = frequencies.shape
    dim = 2 * planes + extra
    basis, _ = torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(seed)))
    j = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    blocks = [torch.block_diag(*[w * j for w in frequencies[i]], torch.zeros(extra, extra, dtype=torch.float64))
              for i in range(n)]
    return torch.stack([basis @ b @ basis.T for b in blocks])


@pytest.mark.parametrize("extra", [0, 1, 3])
def test_common_torus_gives_one_linear_functional_per_plane(extra):
    true = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(extra))
    generators = torus_generators(true, seed=extra, extra=extra)
    basis, found = groups.common_torus(generators)
    dim = generators.shape[-1]
    assert found.shape == (2, 5)
    assert torch.allclose(basis.T @ basis, torch.eye(dim, dtype=torch.float64), atol=1e-12)
    # the same planes up to order and orientation: each found column is +- one true column
    for column in found.T:
        gaps = torch.minimum((true.T - column).abs().amax(1), (true.T + column).abs().amax(1))
        assert gaps.min() < 1e-10
    p = torch.tensor([2.0, -3.0], dtype=torch.float64)
    turned = basis.T @ groups.multi_parameter_group(generators, p) @ basis
    angle = torch.atan2(turned[1:10:2, 0:10:2].diagonal(), turned[0:10:2, 0:10:2].diagonal())
    wrapped = torch.remainder(angle - p @ found + math.pi, 2 * math.pi) - math.pi  # angles are defined mod 2 pi
    assert wrapped.abs().max() < 1e-10
    assert torch.allclose(turned[10:, 10:], torch.eye(extra, dtype=torch.float64), atol=1e-12)


def test_common_torus_bad_input():
    with pytest.raises(ValueError, match="must be skew-symmetric"):
        groups.common_torus(torch.stack([random_generator(), random_generator(seed=1)]))
    with pytest.raises(ValueError, match="do not commute"):
        groups.common_torus(random_skew_generators())
    with pytest.raises(ValueError, match=r"generators must have shape \(n, D, D\)"):
        groups.common_torus(torch.zeros(4, 4))


# bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, error, match", [
    (torch.zeros(3, 4), ValueError, "generator must be a square matrix"),
    (torch.zeros(2, 3, 3), ValueError, "generator must be a square matrix"),
    (torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), ValueError, "generator must be finite"),
    (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), ValueError, "generator must be finite"),
    (torch.zeros(2, 2, dtype=torch.complex64), TypeError, "generator must be a real matrix"),
    ([[0.0, 1.0], [0.0, 0.0]], TypeError, "generator must be a torch.Tensor"),
])
def test_bad_generators(bad, error, match):
    with pytest.raises(error, match=match):
        groups.one_parameter_group(bad, 1.0)
    with pytest.raises(error, match=match):
        groups.classify_generator(bad)


def test_bad_times_and_positions():
    x = groups.rope_generator(D)
    with pytest.raises(ValueError, match="t must be finite"):
        groups.one_parameter_group(x, torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="t must hold integer or real numbers"):
        groups.one_parameter_group(x, torch.tensor([True]))
    with pytest.raises(ValueError, match=r"positions must have shape \(\.\.\., n\) with n = 2"):
        groups.multi_parameter_group(axial_generators(), torch.zeros(5, 3))
    encoding = groups.GroupEncoding(x)
    q = torch.randn(1, 2, 5, D)
    with pytest.raises(ValueError, match="q_positions must have length 5"):
        encoding.encode_qk(q, q, torch.arange(4), torch.arange(5))
    with pytest.raises(ValueError, match=r"q_positions must have shape \(L,\) or \(B, L\)"):
        encoding.encode_qk(q, q, torch.zeros(1, 1, 5), torch.arange(5))
    with pytest.raises(ValueError, match=f"k must have shape \\(\\.\\.\\., L, {D}\\)"):
        encoding.encode_qk(q, torch.randn(1, 2, 5, D + 2), torch.arange(5), torch.arange(5))
    heads = groups.GroupEncoding(torch.stack([x] * 3))
    with pytest.raises(ValueError, match="H = 3"):
        heads.encode_qk(q, q, torch.arange(5), torch.arange(5))
    nd = groups.MultiGroupEncoding(axial_generators())
    with pytest.raises(ValueError, match=r"q_positions must have shape \(L, 2\) or \(B, L, 2\)"):
        nd.encode_qk(q, q, torch.zeros(5), torch.zeros(5, 2))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="decay must lie in"):
        groups.damped_rope_generator(D, 1.5)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        groups.jordan_generator(6, block=2)
    with pytest.raises(ValueError, match="head_dim must be even"):
        groups.rope_generator(5)
    with pytest.raises(ValueError, match="rates must be a number or a tensor of shape"):
        groups.decay_generator(3, torch.ones(4))
    with pytest.raises(ValueError, match="tol must lie in"):
        groups.classify_generator(groups.rope_generator(4), tol=2.0)


def test_everything_runs_on_the_meta_device():
    """No hidden CPU tensors: constructors, maps and encodings stay on the device they are given."""
    meta = torch.device("meta")
    for generator in (groups.rope_generator(D, device=meta), groups.xpos_generator(D, device=meta),
                      groups.damped_rope_generator(D, 0.9, device=meta), groups.decay_generator(D, 0.1, device=meta),
                      groups.jordan_generator(D, device=meta), groups.alibi_generator(device=meta)):
        assert generator.device == meta
    x = groups.rope_generator(D, device=meta)
    assert groups.one_parameter_group(x, torch.arange(5.0, device=meta)).device == meta
    q = torch.randn(2, 3, 5, D, device=meta)
    for encoding in (groups.GroupEncoding(x), groups.GroupEncoding(torch.stack([x] * 3))):
        q_out, k_out = encoding.encode_qk(q, q, torch.arange(5, device=meta), torch.arange(10, device=meta)[None, :5])
        assert q_out.device == k_out.device == meta and q_out.shape == q.shape
    nd = groups.MultiGroupEncoding(axial_generators().to(meta))
    assert nd.encode_qk(q, q, torch.zeros(5, 2, device=meta), torch.zeros(5, 2, device=meta))[0].device == meta
