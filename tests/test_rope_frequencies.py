"""posenc.rope_frequencies against transformers' own tables, bit for bit, and its errors."""
import pytest
import torch
from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, llama_rotary, rope_parameters

import posenc
from posenc.rope_frequencies import ROPE_FREQUENCY_FUNCTIONS


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_frequencies_equal_transformers(case):
    reference = llama_rotary(case)
    inv_freq, attention_factor = posenc.rope_frequencies(HEAD_DIM, rope_parameters(case), MAX_POSITIONS)
    assert inv_freq.dtype == torch.float32
    assert torch.equal(inv_freq, reference.inv_freq)
    assert attention_factor == reference.attention_scaling


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
@pytest.mark.parametrize("seq_len", [100, 1500, 5000])
def test_length_dependent_tables_equal_transformers(rope_type, seq_len):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    reference = llama_rotary(rope_type)
    expected, expected_factor = ROPE_INIT_FUNCTIONS[rope_type](reference.config, seq_len=seq_len)
    inv_freq, factor = posenc.rope_frequencies(HEAD_DIM, rope_parameters(rope_type), MAX_POSITIONS, seq_len=seq_len)
    assert torch.equal(inv_freq, expected)
    assert factor == expected_factor


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_partial_and_proportional_equal_transformers(fraction):
    from transformers import GPTNeoXConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    neox = GPTNeoXRotaryEmbedding(GPTNeoXConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4,
                                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": fraction}))
    params = {"rope_theta": 10000.0, "partial_rotary_factor": fraction}
    assert torch.equal(posenc.rope_frequencies(HEAD_DIM, params)[0], neox.inv_freq)
    if "proportional" in ROPE_INIT_FUNCTIONS:
        reference = llama_rotary("default")
        reference.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0,
                                             "partial_rotary_factor": fraction}
        expected, _ = ROPE_INIT_FUNCTIONS["proportional"](reference.config)
        mine, _ = posenc.rope_frequencies(HEAD_DIM, {**params, "rope_type": "proportional"})
        assert torch.equal(mine, expected)


def test_registry_is_complete_and_shares_one_signature():
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3"} <= set(ROPE_FREQUENCY_FUNCTIONS)
    for name, fn in ROPE_FREQUENCY_FUNCTIONS.items():
        inv_freq, factor = fn(HEAD_DIM, rope_parameters("longrope") if name == "longrope" else
                              {"rope_type": name, "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
                              MAX_POSITIONS, None, None)
        assert inv_freq.shape == (HEAD_DIM // 2,) and isinstance(factor, float)


def test_unknown_rope_type_lists_the_known_ones():
    with pytest.raises(ValueError, match="rope_type") as error:
        posenc.rope_frequencies(HEAD_DIM, {"rope_type": "spiral"})
    for name in ROPE_FREQUENCY_FUNCTIONS:
        assert name in str(error.value)


@pytest.mark.parametrize("rope_type, missing", [("linear", "factor"), ("dynamic", "factor"), ("yarn", "factor"),
                                                ("llama3", "low_freq_factor"), ("llama3", "high_freq_factor"),
                                                ("longrope", "short_factor"), ("longrope", "long_factor")])
def test_missing_required_parameter_is_named(rope_type, missing):
    params = {"factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "short_factor": [1.0] * 32, "long_factor": [2.0] * 32, "rope_type": rope_type}
    del params[missing]
    with pytest.raises(ValueError, match=missing):
        posenc.rope_frequencies(HEAD_DIM, params)


@pytest.mark.parametrize("head_dim", [7, 0, 63])
def test_odd_or_tiny_head_dim_is_rejected(head_dim):
    with pytest.raises(ValueError, match="head_dim"):
        posenc.rope_frequencies(head_dim)


def test_wrong_types_are_rejected():
    with pytest.raises(TypeError, match="rope_parameters"):
        posenc.rope_frequencies(HEAD_DIM, ["default"])
    with pytest.raises(TypeError, match="head_dim"):
        posenc.rope_frequencies(64.0)
    with pytest.raises(ValueError, match="long_factor"):
        posenc.rope_frequencies(HEAD_DIM, {"rope_type": "longrope", "short_factor": [1.0] * 32,
                                           "long_factor": [1.0] * 31})
