"""posenc.rope_frequencies against transformers' own tables, bit for bit, and its errors."""

import re

import pytest
import torch
from reference_rope import HEAD_DIM, MAX_POSITIONS, ROPE_CASES, llama_rotary, rope_parameters

import posenc
from posenc.rope_types import (
    ROPE_FREQUENCY_FUNCTIONS,
    ROPE_TYPES,
    check_rope_parameters,
    per_layer_types,
    rope_parameters_from_config,
)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_frequencies_equal_transformers(case):
    reference = llama_rotary(case)
    inv_freq, attention_factor = posenc.rope_frequencies(HEAD_DIM, rope_parameters(case), MAX_POSITIONS)
    # exact by construction, and the promise: the same float32 operations in the same order as transformers
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

    neox = GPTNeoXRotaryEmbedding(
        GPTNeoXConfig(
            hidden_size=HEAD_DIM * 4,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": fraction},
        )
    )
    params = {"rope_theta": 10000.0, "partial_rotary_factor": fraction}
    assert torch.equal(posenc.rope_frequencies(HEAD_DIM, params)[0], neox.inv_freq)
    if "proportional" in ROPE_INIT_FUNCTIONS:
        reference = llama_rotary("default")
        reference.config.rope_parameters = {
            "rope_type": "proportional",
            "rope_theta": 10000.0,
            "partial_rotary_factor": fraction,
        }
        expected, _ = ROPE_INIT_FUNCTIONS["proportional"](reference.config)
        mine, _ = posenc.rope_frequencies(HEAD_DIM, {**params, "rope_type": "proportional"})
        assert torch.equal(mine, expected)


def test_registry_is_complete_and_shares_one_signature():
    assert {"default", "linear", "dynamic", "yarn", "longrope", "llama3"} <= set(ROPE_FREQUENCY_FUNCTIONS)
    for name, fn in ROPE_FREQUENCY_FUNCTIONS.items():
        inv_freq, factor = fn(
            HEAD_DIM,
            rope_parameters("longrope")
            if name == "longrope"
            else {"rope_type": name, "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            MAX_POSITIONS,
            None,
            None,
        )
        assert inv_freq.shape == (HEAD_DIM // 2,) and isinstance(factor, float)


def test_unknown_rope_type_lists_the_known_ones():
    with pytest.raises(ValueError, match="rope_type") as error:
        posenc.rope_frequencies(HEAD_DIM, {"rope_type": "spiral"})
    for name in ROPE_FREQUENCY_FUNCTIONS:
        assert name in str(error.value)


MINIMAL = {
    "default": {},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 2.0},
    "longrope": {"short_factor": [1.0] * 32, "long_factor": [2.0] * 32},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "proportional": {},
}


def test_the_table_covers_the_registry_and_minimal_parameters_work():
    assert set(MINIMAL) == set(ROPE_TYPES) == set(ROPE_FREQUENCY_FUNCTIONS)
    for rope_type, spec in ROPE_TYPES.items():
        assert set(MINIMAL[rope_type]) == set(spec.required)
        inv_freq, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_type": rope_type, **MINIMAL[rope_type]})
        assert inv_freq.shape == (HEAD_DIM // 2,)
    assert {name for name, spec in ROPE_TYPES.items() if spec.uses_seq_len} == {"dynamic", "longrope"}


@pytest.mark.parametrize("rope_type", sorted(ROPE_TYPES))
def test_key_sets_are_transformers_own(rope_type):
    # transformers' validation must accept every key posenc accepts without a word, and posenc must accept
    # every key transformers does (it fills in rope_theta and original_max_position_embeddings itself)
    import logging

    from transformers import LlamaConfig

    spec = ROPE_TYPES[rope_type]
    params = {"rope_type": rope_type, "rope_theta": 10000.0, **MINIMAL[rope_type]}
    config = LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=1024, rope_parameters=dict(params)
    )

    def unrecognized(rope_parameters):
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())
        logger = logging.getLogger("transformers.modeling_rope_utils")
        logger.addHandler(handler)
        try:
            config.rope_parameters = dict(rope_parameters)
            config.validate_rope()
        finally:
            logger.removeHandler(handler)
        return [message for message in seen if "Unrecognized keys" in message]

    everything = {**params, **{key: SAMPLE_VALUES[key] for key in spec.optional + ("partial_rotary_factor",)}}
    assert unrecognized(everything) == []
    assert "not_a_key" in " ".join(unrecognized({**everything, "not_a_key": 1.0}))  # the check can see one
    posenc.rope_frequencies(HEAD_DIM, everything, 1024)
    with pytest.raises(ValueError, match="not_a_key"):
        posenc.rope_frequencies(HEAD_DIM, {**everything, "not_a_key": 1.0}, 1024)


SAMPLE_VALUES = {
    "partial_rotary_factor": 1.0,
    "original_max_position_embeddings": 256,
    "attention_factor": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "truncate": True,
    "factor": 4.0,
}


def test_a_key_the_rope_type_ignores_is_an_error():
    # the case: "default" would return unscaled frequencies and drop the factor
    with pytest.raises(ValueError, match=r"'factor'.*rope_type='default' does not use") as error:
        posenc.rope_frequencies(64, {"rope_type": "default", "factor": 4.0})
    message = str(error.value)
    assert "partial_rotary_factor, rope_theta, rope_type" in message  # the valid keys of "default"
    assert "'linear'" in message and "'yarn'" in message  # and where 'factor' would belong


def test_a_misspelled_key_names_the_closest_valid_one():
    params = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "orignal_max_position_embeddings": 8192,
    }
    with pytest.raises(ValueError, match="'orignal_max_position_embeddings'") as error:
        posenc.rope_frequencies(128, params, 131072)
    message = str(error.value)
    assert "did you mean 'original_max_position_embeddings'?" in message
    for key in ROPE_TYPES["llama3"].keys():
        assert key in message


def test_unknown_rope_type_names_the_closest():
    with pytest.raises(ValueError, match="did you mean 'llama3'"):
        posenc.rope_frequencies(HEAD_DIM, {"rope_type": "lama3"})


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_the_legacy_key_type_is_read_as_rope_type(case):
    params = rope_parameters(case)
    legacy = {"type" if key == "rope_type" else key: value for key, value in params.items()}
    new, _ = posenc.rope_frequencies(HEAD_DIM, params, MAX_POSITIONS)
    old, _ = posenc.rope_frequencies(HEAD_DIM, legacy, MAX_POSITIONS)
    assert torch.equal(new, old)  # one code path: the same numbers
    posenc.rope_frequencies(HEAD_DIM, {**params, "type": params["rope_type"]}, MAX_POSITIONS)  # both, agreeing
    with pytest.raises(ValueError, match="'type'"):
        posenc.rope_frequencies(HEAD_DIM, {**params, "type": "spiral"}, MAX_POSITIONS)


@pytest.mark.parametrize("rope_type", [name for name in sorted(ROPE_TYPES) if ROPE_TYPES[name].required])
def test_missing_required_parameter_is_named(rope_type):
    for missing in ROPE_TYPES[rope_type].required:
        for params in (
            {k: v for k, v in MINIMAL[rope_type].items() if k != missing},
            {**MINIMAL[rope_type], missing: None},
        ):
            with pytest.raises(ValueError, match=rf"\['{missing}'\] is required for rope_type='{rope_type}'"):
                posenc.rope_frequencies(HEAD_DIM, {"rope_type": rope_type, **params})


@pytest.mark.parametrize(
    "rope_type, key, value, expected",
    [
        ("linear", "factor", 0.5, ">= 1"),  # transformers warns: factor must be >= 1
        ("linear", "factor", "2", ">= 1"),
        ("yarn", "beta_fast", "32", "a number"),
        ("yarn", "truncate", None, "True or False"),
        ("yarn", "attention_factor", -1.0, ">= 0"),
        ("yarn", "original_max_position_embeddings", 256.5, "an int"),
        ("llama3", "high_freq_factor", 0.5, "greater than 'low_freq_factor'"),
        ("yarn", "beta_slow", 64, "'beta_fast'"),
        ("longrope", "short_factor", "1.0", "a list of numbers"),
        ("default", "rope_theta", 1.0, "> 1"),
        ("default", "partial_rotary_factor", 1.5, r"\[0, 1\]"),
    ],
)
def test_values_transformers_warns_about_are_errors(rope_type, key, value, expected):
    with pytest.raises(ValueError, match=key) as error:
        posenc.rope_frequencies(HEAD_DIM, {"rope_type": rope_type, **MINIMAL[rope_type], key: value})
    assert re.search(expected, str(error.value)), str(error.value)


def test_optional_keys_may_be_none_as_in_transformers():
    inv_freq, factor = posenc.rope_frequencies(
        HEAD_DIM,
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "beta_fast": None,
            "beta_slow": None,
            "attention_factor": None,
            "original_max_position_embeddings": 256,
        },
        1024,
    )
    expected = posenc.rope_frequencies(
        HEAD_DIM, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, 1024
    )
    assert torch.equal(inv_freq, expected[0]) and factor == expected[1]


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
        posenc.rope_frequencies(
            HEAD_DIM, {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [1.0] * 31}
        )


@pytest.mark.parametrize("head_dim", [4, 8, 16])
@pytest.mark.parametrize("original", [16, 64, 128])  # all below 32 * 2 pi: the low end is negative
@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_on_small_heads_where_the_clamp_decides_equals_transformers(head_dim, original, truncate):
    # heads this small put the pair index where a pair turns 32 times in `original` below 0, so transformers'
    # clamp max(low, 0) decides the ramp; posenc must apply it too
    import math

    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": original,
        "truncate": truncate,
    }
    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        max_position_embeddings=8 * original,
        rope_parameters=dict(params),
    )
    expected, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    inv_freq, factor = posenc.rope_frequencies(head_dim, params, 8 * original)
    assert torch.equal(inv_freq, expected)  # exact: the same float32 operations in the same order
    assert factor == expected_factor
    low = head_dim * math.log(original / (32 * 2 * math.pi)) / (2 * math.log(10000.0))
    assert low < 0  # the case this test is about: unclamped, the ramp would start before pair 0


def test_yarn_keeps_the_fastest_pair_of_an_8_dimensional_head_where_the_papers_ramp_does_not():
    # the small model of chapter 10: d = 8, base 1e4, L = 16, s = 8
    import math

    from posenc import context_extension as ext

    rope = posenc.rope_frequencies(8, {"rope_theta": 10000.0})[0].double()
    code, _ = posenc.rope_frequencies(
        8, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16}, 128
    )
    assert code[0] == rope[0] == 1  # exact: the clamped ramp starts at pair 0, whose keep weight is exactly 1
    assert torch.allclose(code[1:].double(), rope[1:] / 8, rtol=1e-6)  # float32 table against float64
    gamma = ext.yarn_ramp(ext.turns(rope, 16))  # the paper's ramp: pair 0 turns 16 / 2 pi = 2.55 times
    paper = (1 - gamma) * rope / 8 + gamma * rope
    assert math.isclose(gamma[0], (16 / (2 * math.pi) - 1) / 31, rel_tol=1e-12)
    assert 5.92 < rope[0] / paper[0] < 5.94


def test_layer_types_are_the_nested_dicts_even_beside_flat_keys():
    """transformers 5.15's Gemma 3 config can hold flat keys beside the per-layer-type tables: the layer types are
    the keys holding a dict, and a layer type reads its own table."""
    sliding, full = (
        {"rope_type": "default", "rope_theta": 1e4},
        {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
    )
    mixed = {"sliding_attention": sliding, "full_attention": full, "rope_type": "default", "rope_theta": None}
    assert per_layer_types(mixed) == ["full_attention", "sliding_attention"]
    assert per_layer_types({"rope_type": "default", "rope_theta": 1e4}) == [] and per_layer_types(None) == []
    config = {"rope_parameters": mixed, "max_position_embeddings": 64}
    assert rope_parameters_from_config(config, layer_type="full_attention") == full
    assert rope_parameters_from_config(config, layer_type="sliding_attention") == sliding
    with pytest.raises(ValueError, match="one rope_parameters per layer type"):
        rope_parameters_from_config(config)
    with pytest.raises(ValueError, match="per layer type"):
        check_rope_parameters(mixed)
