"""posenc.lab.tiny_models: the tiny random transformers models the tests and chapter 13 compare posenc against."""

import pytest
import torch

tf = pytest.importorskip("transformers")
from posenc.lab.tiny_models import tiny_model  # noqa: E402

SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=64)


def test_a_config_class_is_built_from_the_sizes_with_eager_attention():
    model = tiny_model(tf.LlamaConfig, num_hidden_layers=3, **SIZES)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 3
    assert model.config._attn_implementation == "eager" and not model.training
    assert isinstance(model, tf.LlamaForCausalLM)


def test_a_config_instance_is_copied_and_the_seed_fixes_the_weights():
    config = tf.LlamaConfig(num_hidden_layers=2, **SIZES)
    before = config._attn_implementation
    first, again, other = tiny_model(config, seed=1), tiny_model(config, seed=1), tiny_model(config, seed=2)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(first.state_dict()[weight], again.state_dict()[weight])  # the same draws: exact
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])
    sized = tiny_model(config, num_hidden_layers=1)
    assert sized.config.num_hidden_layers == 1 and config.num_hidden_layers == 2
    assert config._attn_implementation == before != "eager"  # the caller's config is untouched


def test_head_picks_the_class():
    model = tiny_model(tf.LlamaConfig, head=tf.LlamaModel, num_hidden_layers=1, **SIZES)
    assert type(model) is tf.LlamaModel


def test_bad_input():
    with pytest.raises(TypeError, match="config"):
        tiny_model({"hidden_size": 32})
    with pytest.raises(TypeError, match="config"):
        tiny_model(dict)
    with pytest.raises(TypeError, match="seed"):
        tiny_model(tf.LlamaConfig, seed=0.5, **SIZES)
