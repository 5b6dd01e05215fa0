"""posenc.generators: the generator of every family against the encoding it stands for, and the common torus."""

import math

import pytest
import torch
from group_helpers import D, logits, random_generator, random_skew_generators, torus_generators

import posenc
from posenc import generators, group_encodings, jordan
from posenc.generators import common_torus


# known encodings as generators ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_generator_equals_posenc_rope(layout):
    inv_freq, _ = posenc.rope_frequencies(D)
    x = generators.rope_generator(D, layout=layout, dtype=torch.float64)
    for t in (0.0, 1.0, 2.5, 37.0, 1000.0):
        # float64 angles up to 1000: both sides round t * theta to ~1e-13 absolute
        assert torch.allclose(
            group_encodings.one_parameter_group(x, t), posenc.rope_matrix(t, inv_freq, layout), atol=1e-12
        )
    q, k = torch.randn(2, 4, 6, D), torch.randn(2, 4, 6, D)
    positions = torch.arange(6) + 100
    ours = posenc.GroupEncoding(generators.rope_generator(D, layout=layout)).encode_qk(q, k, positions, positions)
    theirs = posenc.RotaryEmbedding(D, layout=layout).encode_qk(q, k, positions, positions)
    # float32 at positions ~105: the angles differ by ~eps * 105 ~ 1e-5, times |q| entries of a few units
    assert torch.allclose(ours[0], theirs[0], atol=1e-4) and torch.allclose(ours[1], theirs[1], atol=1e-4)
    assert torch.allclose(ours[0], posenc.rotate(q, positions, inv_freq, layout=layout), atol=1e-4)


def test_rope_generator_takes_any_frequency_table():
    inv_freq, _ = posenc.rope_frequencies(D, {"rope_type": "linear", "factor": 4.0})
    x = generators.rope_generator(D, inv_freq=inv_freq, dtype=torch.float64)
    assert torch.allclose(group_encodings.one_parameter_group(x, 9.0), posenc.rope_matrix(9.0, inv_freq), atol=1e-12)


def test_alibi_block_equals_alibi_bias_under_a_causal_mask():
    n_heads, length = 4, 7
    slopes = posenc.alibi_slopes(n_heads).double()
    q_bar, k_bar = generators.alibi_vectors(slopes)
    encoding = posenc.GroupEncoding(generators.alibi_generator(dtype=torch.float64))
    positions = torch.arange(length)
    q = q_bar.expand(1, n_heads, length, 2)
    k = k_bar[None, :, None, :].expand(1, n_heads, length, 2)
    bias = logits(encoding, q, k, positions, positions)[0]
    # float32 reference: biases up to 0.25 * 6 carry ~1e-7 round-off
    assert torch.allclose(bias.float(), posenc.alibi_bias(length, slopes=slopes.float()), atol=1e-5)
    n = generators.alibi_generator(dtype=torch.float64)
    for m, a in ((0.5, 3.0), (0.125, 11.0)):  # the post's form: (1, 0)^T exp(aN) (0, -m) = -m a
        value = (
            torch.tensor([1.0, 0.0], dtype=torch.float64)
            @ group_encodings.one_parameter_group(n, a)
            @ torch.tensor([0.0, -m], dtype=torch.float64)
        )
        assert value.item() == pytest.approx(-m * a)
    assert jordan.classify_generator(n)[0].family == "real jordan"  # unipotent, not the exotic complex class


def test_alibi_through_attention_with_augmented_heads():
    """ALiBi as two extra feature dimensions per head with the generator 0 (+) N: same attention output."""
    n_heads, length, dim = 4, 9, 6
    q, k, v = (torch.randn(1, n_heads, length, dim, dtype=torch.float64) for _ in range(3))
    slopes = posenc.alibi_slopes(n_heads).double()
    q_bar, k_bar = generators.alibi_vectors(slopes)
    wide = dim + 2
    q_aug = torch.cat((q * math.sqrt(wide / dim), q_bar.expand(1, n_heads, length, 2) * math.sqrt(wide)), dim=-1)
    k_aug = torch.cat((k, k_bar[None, :, None, :].expand(1, n_heads, length, 2)), dim=-1)
    generator = torch.block_diag(torch.zeros(dim, dim, dtype=torch.float64), generators.alibi_generator(torch.float64))
    v_aug = torch.cat((v, torch.zeros(1, n_heads, length, 2, dtype=torch.float64)), dim=-1)
    ours = posenc.attention(q_aug, k_aug, v_aug, encoding=posenc.GroupEncoding(generator), causal=True)[..., :dim]
    theirs = posenc.attention(q, k, v, encoding=posenc.ALiBi(n_heads), causal=True)
    assert torch.allclose(ours, theirs.double(), atol=1e-6)  # posenc.ALiBi uses float32 slopes: ~1e-7 off


def test_xpos_generator_equals_direct_xpos():
    q, k = torch.randn(1, 2, 5, D, dtype=torch.float64), torch.randn(1, 2, 6, D, dtype=torch.float64)
    n, m = torch.arange(5.0) + 20, torch.arange(6.0) + 3
    inv_freq, _ = posenc.rope_frequencies(D)
    zeta = torch.cat([generators.xpos_scales(D)] * 2)  # half layout: pair j is features (j, j + D/2)
    q_direct = posenc.rotate(q, n, inv_freq).double() * zeta ** (n[:, None] / 512)
    k_direct = posenc.rotate(k, m, inv_freq).double() * zeta ** (-m[:, None] / 512)
    q_ours, k_ours = posenc.GroupEncoding(generators.xpos_generator(D, dtype=torch.float64)).encode_qk(q, k, n, m)
    # posenc.rotate works in float32 (angles up to 25 -> ~3e-6 absolute); the group side is float64
    assert torch.allclose(q_ours, q_direct, atol=1e-5) and torch.allclose(k_ours, k_direct, atol=1e-5)


def test_damped_rope_equals_retnet_decay_times_rope():
    gamma = 0.85
    q, k = torch.randn(1, 1, 7, D, dtype=torch.float64), torch.randn(1, 1, 7, D, dtype=torch.float64)
    positions = torch.arange(7.0)
    rope = logits(posenc.GroupEncoding(generators.rope_generator(D, dtype=torch.float64)), q, k, positions, positions)
    offsets = positions[:, None] - positions[None, :]
    retnet = logits(
        posenc.GroupEncoding(generators.damped_rope_generator(D, gamma, dtype=torch.float64)),
        q,
        k,
        positions,
        positions,
    )
    assert torch.allclose(retnet, rope * gamma**offsets, atol=1e-10)


def test_jordan_generator_closed_forms():
    a, b, t = -0.2, 0.7, 2.5
    x = generators.jordan_generator(4, a, b, block=2, dtype=torch.float64)
    c, s = math.cos(b * t), math.sin(b * t)
    rotation = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    expected = math.exp(a * t) * torch.cat(
        (torch.cat((rotation, t * rotation), 1), torch.cat((torch.zeros(2, 2, dtype=torch.float64), rotation), 1))
    )
    assert torch.allclose(group_encodings.one_parameter_group(x, t), expected, atol=1e-12)
    real = group_encodings.one_parameter_group(generators.jordan_generator(3, a, 0.0, block=3, dtype=torch.float64), t)
    assert real[0, 2].item() == pytest.approx(math.exp(a * t) * t**2 / 2)
    assert real[0, 1].item() == pytest.approx(math.exp(a * t) * t)


@pytest.mark.parametrize("extra", [0, 1, 3])
def test_common_torus_gives_one_linear_functional_per_plane(extra):
    true = torch.randn(2, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(extra))
    generators = torus_generators(true, seed=extra, extra=extra)
    basis, found = common_torus(generators)
    dim = generators.shape[-1]
    assert found.shape == (2, 5)
    assert torch.allclose(basis.T @ basis, torch.eye(dim, dtype=torch.float64), atol=1e-12)
    # the same planes up to order and orientation: each found column is +- one true column
    for column in found.T:
        gaps = torch.minimum((true.T - column).abs().amax(1), (true.T + column).abs().amax(1))
        assert gaps.min() < 1e-10
    p = torch.tensor([2.0, -3.0], dtype=torch.float64)
    turned = basis.T @ group_encodings.multi_parameter_group(generators, p) @ basis
    angle = torch.atan2(turned[1:10:2, 0:10:2].diagonal(), turned[0:10:2, 0:10:2].diagonal())
    wrapped = torch.remainder(angle - p @ found + math.pi, 2 * math.pi) - math.pi  # angles are defined mod 2 pi
    assert wrapped.abs().max() < 1e-10
    assert torch.allclose(turned[10:, 10:], torch.eye(extra, dtype=torch.float64), atol=1e-12)


def test_common_torus_bad_input():
    with pytest.raises(ValueError, match="must be skew-symmetric"):
        generators.common_torus(torch.stack([random_generator(), random_generator(seed=1)]))
    with pytest.raises(ValueError, match="do not commute"):
        generators.common_torus(random_skew_generators())
    with pytest.raises(ValueError, match=r"generators must have shape \(n, D, D\)"):
        generators.common_torus(torch.zeros(4, 4))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="decay must lie in"):
        generators.damped_rope_generator(D, 1.5)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        generators.jordan_generator(6, block=2)
    with pytest.raises(ValueError, match="head_dim must be even"):
        generators.rope_generator(5)
    with pytest.raises(ValueError, match="rates must be a number or a tensor of shape"):
        generators.decay_generator(3, torch.ones(4))
    with pytest.raises(ValueError, match="tol must lie in"):
        jordan.classify_generator(generators.rope_generator(4), tol=2.0)


@pytest.mark.parametrize("window", [1, 4, 16])
def test_window_bias_generator_reproduces_any_relative_bias_on_its_window(window):
    offsets = torch.arange(-window, window + 1, dtype=torch.float64)
    bias = torch.randn(2 * window + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(window))
    for target in (bias, -0.5 * offsets.abs()):  # an arbitrary bias, symmetric ALiBi
        X, q_bar, k_bar = generators.window_bias_generator(target)
        assert X.shape == (2 * window + 2, 2 * window + 2)
        assert torch.equal(X, -X.T)  # rotations only
        logit = torch.stack([q_bar @ group_encodings.relative_kernel(X, d) @ k_bar for d in offsets])
        # sums of 2L + 2 terms of size |bias|, angles up to 2 pi L: float64 round-off ~ L * 1e-15
        assert torch.allclose(logit, target, rtol=0, atol=1e-12 * (1 + target.abs().max()))
    with pytest.raises(ValueError, match="bias"):
        generators.window_bias_generator(torch.zeros(4))
    with pytest.raises(TypeError, match="bias"):
        generators.window_bias_generator([0.0, 1.0, 2.0])
