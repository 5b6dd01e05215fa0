"""ALiBi: slopes and biases against BLOOM's build_alibi_tensor, and errors."""

import pytest
import torch

import posenc
from posenc.alibi import alibi_bias_at


@pytest.mark.parametrize("n_heads", list(range(1, 41)) + [64, 96, 128])
def test_slopes_equal_bloom(n_heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    # exact by construction: the same float32 base raised with torch.pow to the same integer powers as BLOOM
    assert torch.equal(posenc.alibi_slopes(n_heads), _get_alibi_slopes(n_heads, torch.device("cpu")))


def test_slopes_follow_the_paper_for_powers_of_two():
    slopes = posenc.alibi_slopes(8)
    assert torch.allclose(slopes, torch.tensor([2.0 ** (-h) for h in range(1, 9)]))
    # 12 heads: the 8 slopes of the 8-head set, then every other slope of the 16-head set
    twelve = posenc.alibi_slopes(12)
    assert torch.equal(twelve[:8], slopes)  # the same pow call on the same 8 exponents, bit for bit
    assert torch.allclose(twelve[8:], posenc.alibi_slopes(16)[0::2][:4])


@pytest.mark.parametrize("n_heads, length", [(8, 10), (12, 7), (5, 16)])
def test_causal_bias_gives_bloom_attention(n_heads, length):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, length), n_heads, torch.float32).view(n_heads, 1, length)
    ours = posenc.alibi_bias(length, n_heads=n_heads, causal=True)
    assert ours.shape == (n_heads, length, length)
    mask = posenc.causal_mask(length, length)
    logits = torch.randn(n_heads, length, length)
    weights = lambda bias: torch.softmax((logits + bias).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.allclose(weights(ours), weights(bloom), atol=1e-6)
    # BLOOM's bias m*j differs from -m*(i - j) by the constant -m*i along each row
    difference = (ours - bloom)[:, :, :]
    assert torch.allclose(difference, difference[..., :1].expand_as(difference), atol=1e-5)


def test_symmetric_and_offset_biases():
    # exact by construction: distances are integers (exact in float32), and -m * |i - j| is one rounding of the
    # same two numbers for (i, j) and (j, i), and for a cached query and the same query in the full sequence
    bias = posenc.alibi_bias(4, n_heads=2, causal=False)
    assert torch.equal(bias, bias.transpose(-1, -2)) and bool((bias <= 0).all())
    cached = posenc.alibi_bias(2, key_length=6, n_heads=2, offset=4)
    assert torch.equal(cached, posenc.alibi_bias(6, n_heads=2)[:, 4:])


def test_bad_input():
    with pytest.raises(ValueError, match="n_heads"):
        posenc.alibi_slopes(0)
    with pytest.raises(TypeError, match="n_heads"):
        posenc.alibi_slopes(2.0)
    with pytest.raises(ValueError, match="slopes"):
        posenc.alibi_bias(3)
    with pytest.raises(ValueError, match="slopes"):
        posenc.alibi_bias(3, slopes=torch.ones(2, 2))


def test_chosen_slopes_replace_the_schedule():
    positions = torch.arange(6)
    steep = posenc.ALiBi(4, slopes=(4, 2, 1, 0.5))
    # exact: the same float32 slopes times the same integer distances
    assert torch.equal(
        steep.logit_bias(positions, positions), alibi_bias_at(positions, positions, torch.tensor([4.0, 2.0, 1.0, 0.5]))
    )
    assert torch.equal(posenc.ALiBi(4).slopes, posenc.alibi_slopes(4))  # the default: the standard schedule
    # the steepest standard head (1/4) spreads a query's weight over many offsets; slope 4 puts 98 % on offset 0
    offsets = torch.arange(16.0)
    assert torch.softmax(-0.25 * offsets, 0)[0] < 0.25 < 0.98 < torch.softmax(-4 * offsets, 0)[0]


def test_bad_slopes():
    with pytest.raises(ValueError, match="slopes"):
        posenc.ALiBi(4, slopes=(1.0, 0.5))
    with pytest.raises(ValueError, match="slopes"):
        posenc.ALiBi(2, slopes=(1.0, 0.0))
    with pytest.raises(ValueError, match="slopes"):
        posenc.ALiBi(2, slopes=(1.0, float("nan")))
    with pytest.raises(TypeError, match="slopes"):
        posenc.ALiBi(2, slopes="steep")
    with pytest.raises(TypeError, match="n_heads"):
        posenc.ALiBi(2.0, slopes=(1.0, 0.5))
