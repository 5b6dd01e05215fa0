"""posenc.layer_patterns: hybrid RoPE/NoPE layers, Llama 4's attention temperature, layer patterns of real configs."""

import pytest
import torch

import posenc
from posenc import layer_patterns as lp
from posenc.lab.tiny_models import TINY_SIZES

tf = pytest.importorskip("transformers")
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention  # noqa: E402

# conftest's tiny sizes with four layers of two heads, and the special tokens Llama 4's config asks for
COMMON = dict(
    TINY_SIZES, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, bos_token_id=1, eos_token_id=2
)


def llama4_config(**changes):
    # head_dim 16: the softmax scale 1/sqrt(16) = 1/4 is exact, so dividing (posenc) and multiplying (transformers)
    # by it give the same bits
    sizes = dict(
        COMMON,
        intermediate_size_mlp=64,
        head_dim=16,
        num_local_experts=2,
        attention_chunk_size=8,
        floor_scale=4,
        attn_scale=0.5,
    )
    return tf.Llama4TextConfig(**{**sizes, **changes})


def test_nope_every_fourth_layer_is_transformers_default_pattern():
    for config in (llama4_config(num_hidden_layers=8), tf.SmolLM3Config(**{**COMMON, "num_hidden_layers": 8})):
        assert lp.nope_every(8) == [bool(flag) for flag in config.no_rope_layers]
    assert lp.nope_every(8) == [True, True, True, False] * 2
    assert lp.nope_every(3) == [True] * 3  # too shallow for a fourth layer: pure RoPE


def test_attention_temperature_is_one_before_floor_scale_and_grows_like_a_log():
    positions = torch.arange(40)
    scale = lp.attention_temperature(positions, floor_scale=8, attn_scale=0.5)
    assert scale.dtype == torch.float32
    assert torch.equal(scale[:7], torch.ones(7))  # floor((p + 1) / 8) = 0 for p < 7
    assert scale[7] > 1 and torch.all(scale[1:] >= scale[:-1])
    expected = torch.log(torch.floor((positions.double() + 1) / 8) + 1) * 0.5 + 1
    assert torch.allclose(scale.double(), expected, rtol=4 * 2.0**-24, atol=0)  # one float32 log, two roundings


def test_temperature_nope_layer_equals_llama4_attention_bit_for_bit():
    config = llama4_config()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = Llama4TextAttention(config, layer_idx=3).eval()  # layer 3 of 4: the NoPE layer
    assert not theirs.use_rope
    x = torch.randn(2, 20, 32)
    mask = torch.full((20, 20), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out, weights = theirs(x, None, mask)
        q, k, v = (posenc.split_heads(x @ proj.weight.T, 2) for proj in (theirs.q_proj, theirs.k_proj, theirs.v_proj))
        ours, our_weights = posenc.attention(
            q, k, v, encoding=lp.AttentionTemperature(4, 0.5), causal=True, return_weights=True
        )
        ours = posenc.merge_heads(ours) @ theirs.o_proj.weight.T
    assert torch.equal(our_weights, weights) and torch.equal(ours, out)


def test_temperature_breaks_translation_invariance_of_the_logit():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    positions, shift = torch.arange(12), 5

    def logits(encoding, start):
        q_enc, k_enc = encoding.encode_qk(q, k, positions + start, positions + start)
        return q_enc @ k_enc.transpose(-1, -2)

    nope, tuned = posenc.NoPE(), lp.AttentionTemperature(floor_scale=4, attn_scale=0.5)
    assert torch.equal(logits(nope, 0), logits(nope, shift))  # the control: NoPE's logits ignore the shift
    before, after = logits(tuned, 0), logits(tuned, shift)
    assert not torch.allclose(before, after)  # same offsets m - n, other logits
    # the change is exactly the ratio of the query scales s(m + shift) / s(m), row by row
    ratio = lp.attention_temperature(positions + shift, 4, 0.5) / lp.attention_temperature(positions, 4, 0.5)
    assert torch.allclose(after, before * ratio[:, None], rtol=1e-6, atol=1e-6)
    assert ratio.max() > 1.2


def test_layer_encodings_hold_one_qk_or_none_encoding_per_layer():
    layers = lp.LayerEncodings([posenc.RotaryEmbedding(8), posenc.NoPE(), lp.AttentionTemperature(4, 0.1)])
    assert len(layers) == 3 and isinstance(layers.layer(1), posenc.NoPE)
    with pytest.raises(TypeError, match="layer"):
        layers.encode_qk(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), torch.arange(2), torch.arange(2))
    with pytest.raises(ValueError, match="index"):
        layers.layer(3)
    with pytest.raises(ValueError, match="encodings\\[0\\]"):
        lp.LayerEncodings([posenc.ALiBi(2)])
    with pytest.raises(TypeError, match="encodings\\[1\\]"):
        lp.LayerEncodings([posenc.NoPE(), "rope"])
    with pytest.raises(ValueError, match="none"):
        lp.LayerEncodings([])
    with pytest.raises(ValueError, match="floor_scale"):
        lp.AttentionTemperature(floor_scale=0)
    with pytest.raises(ValueError, match="attn_scale"):
        lp.attention_temperature(torch.arange(3), 8, -1.0)
    with pytest.raises(TypeError, match="attn_scale"):
        lp.attention_temperature(torch.arange(3), 8, "0.1")
    with pytest.raises(TypeError, match="config"):
        lp.layer_pattern({"num_hidden_layers": 2})


def test_llama4_pattern_is_the_models_own():
    config = llama4_config()
    pattern = lp.layer_pattern(config)
    assert [spec.rotary for spec in pattern] == [True, True, True, False]
    assert [bool(Llama4TextAttention(config, i).use_rope) for i in range(4)] == [spec.rotary for spec in pattern]
    assert [spec.window for spec in pattern] == [8, 8, 8, None]  # chunked local RoPE layers, global NoPE layer
    assert [spec.temperature for spec in pattern] == [None, None, None, (4, 0.5)]
    assert pattern[0].rope_parameters == {"rope_type": "default", "rope_theta": 500_000.0}
    assert pattern[0].layout == "interleaved" and pattern[3].rope_parameters is None
    assert lp.layer_pattern(tf.Llama4Config(text_config=config.to_dict())) == pattern  # through the text config


def test_cohere2_rotates_only_its_sliding_layers_in_interleaved_pairs():
    """Cohere2Attention rotates iff its layer has a sliding window (transformers' modeling_cohere2), with its own
    interleaved rotate_half; tests/test_transformers_rope.py checks the same against a model's logits."""
    pattern = lp.layer_pattern(tf.Cohere2Config(**COMMON, sliding_window=8))  # transformers' default 3:1 pattern
    assert [spec.rotary for spec in pattern] == [True, True, True, False]
    assert [spec.window for spec in pattern] == [8, 8, 8, None]
    assert {spec.layout for spec in pattern} == {"interleaved"} and pattern[3].rope_parameters is None
    assert pattern[0].rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert lp.rotary_layers(tf.Cohere2Config(**COMMON, sliding_window=None)) == [False] * 4  # no window: no RoPE
    assert {spec.layout for spec in lp.layer_pattern(tf.CohereConfig(**COMMON))} == {"interleaved"}
    assert lp.rotary_layers(tf.Gemma3TextConfig(**COMMON)) == [True] * 4  # Gemma 3 rotates its global layers too


def test_layers_without_softmax_attention_do_not_rotate():
    """Qwen3-Next's Gated DeltaNet layers (layer type "linear_attention") are never given the rotary embeddings
    (transformers' Qwen3NextDecoderLayer passes them to its full-attention layers only)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer

    config = tf.Qwen3NextConfig()
    pattern = lp.layer_pattern(config)
    assert [spec.rotary for spec in pattern] == [layer == "full_attention" for layer in config.layer_types]
    assert [spec.rotary for spec in pattern[:4]] == [False, False, False, True]
    assert all(spec.rope_parameters is None and spec.temperature is None for spec in pattern if not spec.rotary)
    assert pattern[3].rope_parameters["partial_rotary_factor"] == 0.25
    tiny = tf.Qwen3NextConfig(**COMMON, num_experts=0, linear_num_key_heads=2, linear_num_value_heads=2)
    kinds = [hasattr(Qwen3NextDecoderLayer(tiny, i), "self_attn") for i in range(4)]  # softmax attention or not
    assert kinds == [spec.rotary for spec in lp.layer_pattern(tiny)] == [False, False, False, True]
    # the control: a type outside the set keeps its RoPE (Cohere2's "sliding_attention", Gemma 3's layers)
    assert not lp.NON_ATTENTION_LAYER_TYPES & {"full_attention", "sliding_attention", "chunked_attention"}


def test_smollm3_pattern_reproduces_the_model_through_use_posenc_rope(tiny_model):
    config = tf.SmolLM3Config(**COMMON)
    pattern = lp.layer_pattern(config)
    assert [spec.rotary for spec in pattern] == [True, True, True, False]
    smol = tiny_model(config)
    assert [bool(layer.self_attn.use_rope) for layer in smol.model.layers] == [spec.rotary for spec in pattern]
    # a Llama with SmolLM3's weights, its NoPE layers taken from the pattern, computes SmolLM3's logits
    llama = tiny_model(tf.LlamaConfig(**COMMON, rope_parameters=dict(pattern[0].rope_parameters)))
    llama.load_state_dict(smol.state_dict())
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    nope = [i for i, spec in enumerate(pattern) if not spec.rotary]
    with torch.no_grad():
        expected = smol(ids).logits
        with posenc.use_posenc_rope(llama, nope_layers=nope) as patched:
            got = patched(ids).logits
        assert not torch.equal(llama(ids).logits, expected)  # the control: all four layers rotating
    assert torch.equal(got, expected)


def test_gemma3_pattern_has_a_table_per_layer_type(tiny_model):
    config = tf.Gemma3TextConfig(
        **{**COMMON, "num_attention_heads": 4},
        head_dim=8,
        sliding_window=8,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    )
    pattern = lp.layer_pattern(config)
    assert all(spec.rotary for spec in pattern) and [spec.window for spec in pattern] == [8, 8, 8, None]
    assert pattern[0].rope_parameters["rope_theta"] == 1e4 and pattern[3].rope_parameters["factor"] == 8.0
    model = tiny_model(config)
    for spec in pattern:  # each layer's table is the one the model builds for its layer type
        inv_freq, _ = posenc.rope_frequencies(8, spec.rope_parameters, config.max_position_embeddings)
        assert torch.equal(inv_freq, getattr(model.model.rotary_emb, f"{spec.layer_type}_inv_freq"))
    tables = {spec.layer_type: spec.rope_parameters for spec in pattern}
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        with posenc.use_posenc_rope(model, tables) as patched:
            got = patched(ids).logits
    assert torch.equal(got, expected)


def test_local_windows_are_transformers_sliding_and_chunked_masks():
    from transformers.masking_utils import chunked_overlay, sliding_window_overlay

    positions = torch.arange(20)
    m, n = positions[:, None], positions[None, :]
    for size in (1, 3, 8):
        sliding, chunked = lp.LocalWindow(posenc.NoPE(), size), lp.LocalWindow(posenc.NoPE(), size, "chunked")
        assert torch.equal(sliding.visible(positions, positions), sliding_window_overlay(size)(0, 0, m, n))
        no_padding = torch.zeros(1, dtype=torch.long)
        assert torch.equal(chunked.visible(positions, positions), chunked_overlay(size, no_padding)(0, 0, m, n))
        bias = chunked.logit_bias(positions[None], positions[None])
        assert bias.shape == (1, 1, 20, 20) and set(bias.unique().tolist()) <= {0.0, float("-inf")}
    rope = posenc.RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    windowed = lp.LocalWindow(rope, 4).encode_qk(q, k, torch.arange(6), torch.arange(6))
    expected = rope.encode_qk(q, k, torch.arange(6), torch.arange(6))
    assert all(torch.equal(a, b) for a, b in zip(windowed, expected))  # the window leaves the rotation alone
    with pytest.raises(ValueError, match="mode"):
        lp.LocalWindow(rope, 4, "global")
    with pytest.raises(ValueError, match="size"):
        lp.LocalWindow(rope, 0)
    with pytest.raises(ValueError, match="q and k"):
        lp.LocalWindow(posenc.ALiBi(2), 4)
    with pytest.raises(TypeError, match="encoding"):
        lp.LocalWindow("rope", 4)
