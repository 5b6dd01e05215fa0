"""Absolute encodings: integer, binary, sinusoidal (against transformers), learned."""
import pytest
import torch

import posenc


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
