"""No hidden CPU tensors: every public function runs on the `meta` device, where any stray CPU tensor fails."""

import torch

import posenc

META = torch.device("meta")


def test_absolute_encodings_on_meta():
    positions = torch.arange(10, device=META)
    assert posenc.sinusoidal_encoding(positions, 16).device == META
    assert posenc.binary_encoding(positions, 4).device == META
    assert posenc.integer_encoding(positions, 4, length=10).device == META
    table = posenc.LearnedPositionalEmbedding(12, 4).to(META)
    assert table(positions).device == META


def test_frequencies_rope_and_alibi_on_meta():
    for rope_type, extra in [
        ("default", {}),
        ("yarn", {"factor": 2.0}),
        ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ]:
        inv_freq, _ = posenc.rope_frequencies(32, {"rope_type": rope_type, **extra}, device=META)
        assert inv_freq.device == META
    x = torch.randn(2, 3, 10, 32, device=META, dtype=torch.bfloat16)
    out = posenc.rotate(x, torch.arange(10, device=META) + 0.5, inv_freq)
    assert out.device == META and out.dtype == torch.bfloat16
    assert posenc.alibi_bias(5, slopes=posenc.alibi_slopes(4, device=META)).device == META


def test_attention_with_every_kind_on_meta():
    x = torch.randn(1, 6, 16, device=META)
    weights = [torch.randn(16, 16, device=META) for _ in range(3)]
    for encoding in (posenc.NoPE(), posenc.SinusoidalInput(16), posenc.RotaryEmbedding(8), posenc.ALiBi(2)):
        out = posenc.self_attention(x, *weights, 2, encoding=encoding.to(META), causal=True)
        assert out.device == META and out.shape == (1, 6, 16)
