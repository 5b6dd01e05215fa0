"""One attention for three kinds of encoding: equivariance, each kind's effect, masks, errors."""

import pytest
import torch

import posenc
from posenc.multihead import split_heads

D_MODEL, N_HEADS, LENGTH = 16, 2, 6


@pytest.fixture
def weights():
    return [torch.randn(D_MODEL, D_MODEL) / 2 for _ in range(3)]


ENCODINGS = {
    "none": lambda: posenc.NoPE(),
    "input-sinusoidal": lambda: posenc.SinusoidalInput(D_MODEL),
    "input-learned": lambda: posenc.LearnedInput(LENGTH, D_MODEL),
    "qk-rope": lambda: posenc.RotaryEmbedding(D_MODEL // N_HEADS),
    "logits-alibi": lambda: posenc.ALiBi(N_HEADS, causal=False),
}


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_only_nope_is_permutation_equivariant(name, weights):
    x = torch.randn(1, LENGTH, D_MODEL)
    perm = torch.randperm(LENGTH)
    encoding = ENCODINGS[name]()
    out = posenc.self_attention(x, *weights, N_HEADS, encoding=encoding)
    shuffled = posenc.self_attention(x[:, perm], *weights, N_HEADS, encoding=encoding)
    equivariant = torch.allclose(shuffled, out[:, perm], atol=1e-5)
    assert equivariant == (name == "none")


def test_each_kind_acts_where_it_should(weights):
    x = torch.randn(1, LENGTH, D_MODEL)
    w_q, w_k, w_v = weights
    q, k, v = (split_heads(x @ w.T, N_HEADS) for w in weights)
    # "qk": equal to rotating the projected queries and keys by hand
    rope = posenc.RotaryEmbedding(D_MODEL // N_HEADS)
    by_hand = torch.softmax(posenc.rotate(q) @ posenc.rotate(k).transpose(-1, -2) / (D_MODEL // N_HEADS) ** 0.5, -1)
    _, weights_rope = posenc.self_attention(x, w_q, w_k, w_v, N_HEADS, encoding=rope, return_weights=True)
    assert torch.allclose(weights_rope, by_hand, atol=1e-6)
    # "logits": equal to adding the ALiBi bias by hand
    plain_logits = q @ k.transpose(-1, -2) / (D_MODEL // N_HEADS) ** 0.5
    bias = posenc.alibi_bias(LENGTH, n_heads=N_HEADS)
    expected = torch.softmax((plain_logits + bias).masked_fill(~posenc.causal_mask(LENGTH, LENGTH), float("-inf")), -1)
    _, weights_alibi = posenc.self_attention(
        x, w_q, w_k, w_v, N_HEADS, encoding=posenc.ALiBi(N_HEADS), causal=True, return_weights=True
    )
    assert torch.allclose(weights_alibi, expected, atol=1e-6)
    # "input": equal to adding the table to x first
    sinusoidal = posenc.SinusoidalInput(D_MODEL)
    added = x + posenc.sinusoidal_encoding(torch.arange(LENGTH), D_MODEL)
    assert torch.allclose(
        posenc.self_attention(x, *weights, N_HEADS, encoding=sinusoidal),
        posenc.self_attention(added, *weights, N_HEADS),
        atol=1e-6,
    )


def test_causal_mask_blocks_the_future(weights):
    x = torch.randn(1, LENGTH, D_MODEL)
    _, attn = posenc.self_attention(x, *weights, N_HEADS, causal=True, return_weights=True)
    assert torch.equal(attn.triu(1), torch.zeros_like(attn))  # exp(-inf) is exactly 0 in IEEE arithmetic
    assert torch.allclose(attn.sum(-1), torch.ones(1, N_HEADS, LENGTH))
    assert posenc.causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_kv_cache_positions_match_full_sequence():
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    rope = posenc.RotaryEmbedding(8)
    full = posenc.attention(q, k, v, encoding=rope, causal=True)
    last = posenc.attention(q[:, :, -2:], k, v, encoding=rope, causal=True)
    assert torch.allclose(full[:, :, -2:], last, atol=1e-6)


def test_bad_input(weights):
    x = torch.randn(1, LENGTH, D_MODEL)
    with pytest.raises(ValueError, match="w_q"):
        posenc.self_attention(x, torch.randn(D_MODEL, D_MODEL + 1), *weights[1:], N_HEADS)
    with pytest.raises(ValueError, match="x must have shape"):
        posenc.self_attention(x[0], *weights, N_HEADS)
    with pytest.raises(ValueError, match="positions"):
        posenc.self_attention(x, *weights, N_HEADS, positions=torch.arange(LENGTH + 1))
    with pytest.raises(TypeError, match="encoding"):
        posenc.self_attention(x, *weights, N_HEADS, encoding="rope")
    with pytest.raises(ValueError, match="input"):
        posenc.attention(*(torch.randn(1, 1, 3, 4) for _ in range(3)), encoding=posenc.SinusoidalInput(4))
    with pytest.raises(ValueError, match="head dimension"):
        posenc.attention(torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 6), torch.randn(1, 1, 3, 6))
    with pytest.raises(ValueError, match="n_heads"):
        posenc.self_attention(x, *weights, 0)
