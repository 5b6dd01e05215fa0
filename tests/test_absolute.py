"""Absolute encodings: integer, binary, sinusoidal (against transformers), learned; and what chapters 2-4 add,
consecutive_distances and sinusoidal_dot_product."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.absolute import binary_encoding, consecutive_distances, sinusoidal_dot_product, sinusoidal_encoding


def test_sinusoidal_equals_transformers_table():
    from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings

    reference = torch.empty(300, 64)
    _create_sinusoidal_embeddings(300, 64, reference)
    assert torch.allclose(posenc.sinusoidal_encoding(torch.arange(300), 64), reference, atol=1e-6)


@pytest.mark.parametrize("base", [100.0, 10_000.0, 500_000.0])
def test_sinusoidal_layouts_and_frequencies(base):
    positions = torch.arange(50)
    interleaved = posenc.sinusoidal_encoding(positions, 16, base)
    half = posenc.sinusoidal_encoding(positions, 16, base, layout="half")
    # exact by construction: both layouts take sin and cos of the same angle tensor and only reorder the results
    assert torch.equal(interleaved[..., 0::2], half[..., :8]) and torch.equal(interleaved[..., 1::2], half[..., 8:])
    omega = posenc.sinusoidal_frequencies(16, base)
    assert torch.allclose(omega[1:] / omega[:-1], torch.full((7,), base ** (-2 / 16), dtype=omega.dtype))


def test_integer_and_binary():
    # exact by construction: a small integer converts to float exactly, and 3 / 4 is a correctly rounded IEEE
    # division whose result (0.75) is representable
    assert torch.equal(posenc.integer_encoding(torch.arange(4), 3)[2], torch.full((3,), 2.0))
    assert torch.equal(posenc.integer_encoding(torch.arange(4), 2, length=4)[3], torch.full((2,), 0.75))
    bits = posenc.binary_encoding(torch.tensor([0, 1, 6, 255]), 8)
    assert bits[2].tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
    assert bits[3].sum() == 8
    batched = posenc.binary_encoding(torch.arange(6).view(2, 3), 4)
    assert batched.shape == (2, 3, 4)


def test_binary_code_refuses_positions_it_cannot_tell_apart():
    # 4 bits tell apart 16 positions: 16..19 would silently get the codes of 0..3
    with pytest.raises(ValueError, match=r"positions must be < 2\*\*bits = 16 for bits=4, got 19") as error:
        posenc.binary_encoding(torch.arange(20), 4)
    assert "wrap=True" in str(error.value)
    assert posenc.binary_encoding(torch.arange(16), 4).shape == (16, 4)  # the largest range 4 bits cover
    wrapped = posenc.binary_encoding(torch.arange(20), 4, wrap=True)  # on purpose: periodic bits
    assert torch.equal(wrapped[16:], wrapped[:4])  # zeros and ones from integer arithmetic
    with pytest.raises(TypeError, match="wrap"):
        posenc.binary_encoding(torch.arange(3), 4, wrap="yes")


def test_learned_table():
    table = posenc.LearnedPositionalEmbedding(10, 4)
    assert table(torch.arange(3)).shape == (3, 4)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        table(torch.arange(11))
    with pytest.raises(TypeError, match="integers"):
        table(torch.tensor([0.5]))


def test_bad_input():
    with pytest.raises(ValueError, match="dim"):
        posenc.sinusoidal_encoding(torch.arange(3), 7)
    with pytest.raises(ValueError, match="base"):
        posenc.sinusoidal_encoding(torch.arange(3), 8, base=-1.0)
    with pytest.raises(ValueError, match="layout"):
        posenc.sinusoidal_encoding(torch.arange(3), 8, layout="pairs")
    with pytest.raises(ValueError, match="positions must be >= 0"):
        posenc.binary_encoding(torch.tensor([-1]), 4)
    with pytest.raises(ValueError, match="length"):
        posenc.integer_encoding(torch.arange(3), 2, length=0)


@settings(max_examples=30, deadline=None)
@given(length=st.integers(2, 40), dim=st.integers(1, 12), batch=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_consecutive_distances_match_a_loop(length, dim, batch, seed):
    table = torch.randn(batch, length, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    steps = consecutive_distances(table)
    assert steps.shape == (batch, length - 1) and steps.dtype == torch.float64
    for b in range(batch):
        for p in range(length - 1):
            expected = math.sqrt(sum((table[b, p + 1, i] - table[b, p, i]).item() ** 2 for i in range(dim)))
            assert steps[b, p].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(bits=st.integers(1, 12))
def test_binary_steps_grow_with_the_trailing_ones(bits):
    # p -> p + 1 flips the trailing ones of p and one zero: 1 + (trailing zeros of p + 1) bits
    positions = torch.arange(2**bits)
    steps = consecutive_distances(binary_encoding(positions, bits))
    for p in range(2**bits - 1):
        flipped = 1 + ((p + 1) & -(p + 1)).bit_length() - 1
        assert steps[p].item() == pytest.approx(math.sqrt(flipped))


def test_consecutive_distances_promote_integers_and_reject_bad_shapes():
    steps = consecutive_distances(torch.tensor([[0, 0], [3, 4]]))
    assert steps.dtype == torch.float32 and steps.item() == pytest.approx(5.0, rel=2e-7)  # a float32 norm: 1 ulp
    with pytest.raises(ValueError, match="L >= 2"):
        consecutive_distances(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="encodings"):
        consecutive_distances(torch.zeros(4))
    with pytest.raises(TypeError, match="encodings"):
        consecutive_distances([[0.0], [1.0]])


@settings(max_examples=40, deadline=None)
@given(p=st.integers(0, 10**6), q=st.integers(0, 10**6), half_dim=st.integers(1, 64), base=st.floats(2.0, 1e6))
def test_sinusoidal_dot_product_is_the_dot_product_of_two_encodings(p, q, half_dim, base):
    table = sinusoidal_encoding(torch.tensor([p, q]), 2 * half_dim, base, dtype=torch.float64)
    kernel = sinusoidal_dot_product(torch.tensor([q - p]), 2 * half_dim, base)
    assert kernel.dtype == torch.float64
    assert kernel.item() == pytest.approx((table[0] @ table[1]).item(), abs=1e-8)


def test_sinusoidal_dot_product_keeps_shape_and_does_not_depend_on_chunk():
    offsets = torch.arange(-300, 300).view(3, 200)
    whole = sinusoidal_dot_product(offsets, 64)
    assert whole.shape == (3, 200)
    # a sum of 32 cosines, each within an ulp (2.2e-16): two evaluations that split the work differently may
    # take other vector/scalar paths, so they agree to 32 ulps of the largest possible sum (32), not bit for bit
    tolerance = 32 * 32 * 2.3e-16
    torch.testing.assert_close(whole, sinusoidal_dot_product(offsets, 64, chunk=1), atol=tolerance, rtol=0)
    torch.testing.assert_close(whole, sinusoidal_dot_product(offsets, 64, chunk=100), atol=tolerance, rtol=0)
    assert whole[1, 100].item() == pytest.approx(32.0, rel=0, abs=tolerance)  # offset 0: d/2
    assert torch.allclose(whole, sinusoidal_dot_product(-offsets, 64))  # even in the offset
    assert sinusoidal_dot_product(torch.arange(0), 8).shape == (0,)


def test_sinusoidal_dot_product_bad_input():
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_dot_product(torch.arange(3), 7)
    with pytest.raises(ValueError, match="chunk"):
        sinusoidal_dot_product(torch.arange(3), 8, chunk=0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_dot_product(torch.arange(3), 8, base=0.0)
    with pytest.raises(ValueError, match="offsets"):
        sinusoidal_dot_product(torch.tensor([math.inf]), 8)
