"""posenc.use_posenc_rope on tiny random transformers models of every supported family (offline, float32)."""
import copy

import pytest
import torch

import posenc
from posenc import transformers_rope

tf = pytest.importorskip("transformers")

VOCAB = 97
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64, pad_token_id=0)
PHI3_PAIRS = 4  # head_dim 8


def _configs():
    yield "llama", tf.LlamaConfig(**COMMON, num_key_value_heads=2)
    yield "mistral", tf.MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=8)
    yield "qwen2", tf.Qwen2Config(**COMMON, num_key_value_heads=2)
    yield "qwen3", tf.Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=8)
    yield "gemma2", tf.Gemma2Config(**COMMON, num_key_value_heads=2, head_dim=8, sliding_window=8)
    yield "gemma3", tf.Gemma3TextConfig(**COMMON, num_key_value_heads=2, head_dim=8, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"])
    yield "phi3", tf.Phi3Config(**{**COMMON, "max_position_embeddings": 64}, num_key_value_heads=2,
                                original_max_position_embeddings=16,
                                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                 "short_factor": [1.0, 1.1, 1.3, 1.7],
                                                 "long_factor": [1.0, 1.5, 2.5, 4.0]})
    yield "smollm3", tf.SmolLM3Config(**COMMON, num_key_value_heads=2, no_rope_layers=[1, 0])
    yield "gpt_neox", tf.GPTNeoXConfig(**{k: v for k, v in COMMON.items()},
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.5})


CONFIGS = dict(_configs())


def make(config, seed=0):
    torch.manual_seed(seed)
    config = copy.deepcopy(config)
    config._attn_implementation = "eager"
    return tf.AutoModelForCausalLM.from_config(config).eval()


def rebuilt(model, **changes):
    """The same weights under a changed config."""
    config = copy.deepcopy(model.config)
    for key, value in changes.items():
        setattr(config, key, value)
    other = tf.AutoModelForCausalLM.from_config(config).eval()
    other.load_state_dict(model.state_dict())
    return other


def ids(length=24, batch=2, seed=1):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request):
    return request.param, make(CONFIGS[request.param])


def test_unchanged_logits_are_bit_identical(family):
    name, model = family
    x = ids(40 if name == "phi3" else 24)  # phi3: past original_max_position_embeddings, the long factors
    with torch.no_grad():
        own = model(x).logits
        with posenc.use_posenc_rope(model) as patched:
            ours = patched(x).logits
        again = model(x).logits
    assert torch.equal(own, ours)
    assert torch.equal(own, again)  # removed on exit
    assert getattr(model, "_posenc_rope", None) is None


def test_generate_with_cache_and_left_padding(family):
    name, model = family
    x = ids(12)
    mask = torch.ones_like(x)
    x[0, :4], mask[0, :4] = 0, 0  # left padding
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=True,
                  output_scores=True, return_dict_in_generate=True)
    own = model.generate(x, **kwargs)
    with posenc.use_posenc_rope(model):
        ours = model.generate(x, **kwargs)
    assert torch.equal(own.sequences, ours.sequences)
    assert all(torch.equal(a, b) for a, b in zip(own.scores, ours.scores))


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral", "smollm3", "gpt_neox"])
def test_changed_rope_parameters_equal_the_rebuilt_model(name):
    model = make(CONFIGS[name])
    parameters = dict(model.config.rope_parameters)
    yarn = {**parameters, "rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
            "original_max_position_embeddings": 16}
    x = ids(48)
    with torch.no_grad():
        expected = rebuilt(model, rope_parameters=yarn)(x).logits
        with posenc.use_posenc_rope(model, yarn) as patched:
            got = patched(x).logits
        assert not torch.equal(expected, model(x).logits)
    assert torch.equal(got, expected)


def test_gemma3_local_and_global_bases():
    model = make(CONFIGS["gemma3"])
    changed = {"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
               "full_attention": {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0}}
    x = ids(30)
    with torch.no_grad():
        expected = rebuilt(model, rope_parameters=changed)(x).logits
        with posenc.use_posenc_rope(model, changed) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="full_attention"):
        posenc.use_posenc_rope(model, {"sliding_attention": changed["sliding_attention"]})


def test_phi3_longrope_switches_tables_at_the_original_length():
    model = make(CONFIGS["phi3"])
    short, long = ids(16), ids(40)
    handle = posenc.use_posenc_rope(model)
    try:
        inv_short = handle._table(None, 16)[0]
        inv_long = handle._table(None, 40)[0]
    finally:
        handle.remove()
    assert not torch.equal(inv_short, inv_long)
    with torch.no_grad(), posenc.use_posenc_rope(model) as patched:
        assert torch.equal(patched(short).logits, make(CONFIGS["phi3"])(short).logits)


def test_nope_layers_equal_smollm3_config():
    model = make(CONFIGS["smollm3"])  # layer 0 rotates, layer 1 is NoPE
    x = ids(20)
    with torch.no_grad():
        expected = rebuilt(model, no_rope_layers=[0, 0])(x).logits
        with posenc.use_posenc_rope(model, nope_layers=[0]) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)


def test_unrotate_every_pair_is_nope_everywhere():
    model = make(CONFIGS["llama"])
    pairs = model.config.head_dim // 2
    x = ids(20)
    with torch.no_grad():
        with posenc.use_posenc_rope(model, unrotate_pairs=range(pairs)) as patched:
            unrotated = patched(x).logits
        with posenc.use_posenc_rope(model, nope_layers=[0, 1]) as patched:
            nope = patched(x).logits
        with posenc.use_posenc_rope(model, rotate_pairs=[]) as patched:
            none_kept = patched(x).logits
    assert torch.equal(unrotated, nope)
    assert torch.equal(unrotated, none_kept)


def test_unrotate_keeps_slow_pairs_position_free():
    model = make(CONFIGS["llama"])
    x = ids(20)
    with torch.no_grad():
        table = posenc.rope_frequencies(8, model.config.rope_parameters)[0].clone()
        table[:2] = 0
        with posenc.use_posenc_rope(model, inv_freq=table) as patched:
            expected = patched(x).logits
        with posenc.use_posenc_rope(model, unrotate_pairs=[0, 1]) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)


def test_drop_pairs_equals_zeroed_projection_rows():
    model = make(CONFIGS["llama"])  # head_dim 8: pair i is features i and i + 4 of every head
    drop = [0, 3]
    zeroed = rebuilt(model)
    with torch.no_grad():
        for layer in zeroed.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                rows = proj.weight.view(-1, 8, proj.weight.shape[-1])
                for i in drop:
                    rows[:, i] = 0
                    rows[:, i + 4] = 0
        x = ids(20)
        expected = zeroed(x).logits
        with posenc.use_posenc_rope(model, drop_pairs=torch.isin(torch.arange(4), torch.tensor(drop))) as patched:
            got = patched(x).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)  # zero products summed in another order
    with pytest.raises(ValueError, match="both dropped and un-rotated"):
        posenc.use_posenc_rope(model, drop_pairs=[0], unrotate_pairs=[0])


def test_capture_layers_returns_unrotated_qk():
    model = make(CONFIGS["llama"])
    x = ids(10, batch=1)
    with torch.no_grad(), posenc.use_posenc_rope(model, capture_layers=[1]) as patched:
        patched(x)
        handle = model._posenc_rope
        q, k = handle.captured[1]
    assert q.shape == (1, 4, 10, 8) and k.shape == (1, 2, 10, 8)
    assert list(handle.captured) == [1]


def test_gradients_flow():
    model = make(CONFIGS["qwen2"])
    model.train()
    with posenc.use_posenc_rope(model, unrotate_pairs=[0]) as patched:
        loss = patched(ids(12), labels=ids(12)).loss
    loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_bad_input():
    with pytest.raises(TypeError, match="LlamaForCausalLM.*GPTNeoXForCausalLM"):
        posenc.use_posenc_rope(torch.nn.Linear(2, 2))
    model = make(CONFIGS["llama"])
    with pytest.raises(ValueError, match="unrotate_pairs"):
        posenc.use_posenc_rope(model, unrotate_pairs=[7])
    with pytest.raises(ValueError, match="nope_layers"):
        posenc.use_posenc_rope(model, nope_layers=[2])
    with pytest.raises(ValueError, match="rope_type"):
        posenc.use_posenc_rope(model, {"rope_type": "nope"})
    with posenc.use_posenc_rope(model):
        with pytest.raises(RuntimeError, match="already patched"):
            posenc.use_posenc_rope(model)
    assert transformers_rope._PATCHED_MODULES == {}


# ------------------------------------------------------------------------------------ rope_parameters_from_config
def test_rope_parameters_from_config_nested_and_legacy():
    gemma = tf.Gemma3TextConfig()
    assert posenc.rope_parameters_from_config(gemma, layer_type="sliding_attention")["rope_theta"] == 10000.0
    assert posenc.rope_parameters_from_config(gemma, layer_type="full_attention")["rope_theta"] == 1e6
    with pytest.raises(ValueError, match="'full_attention', 'sliding_attention'"):
        posenc.rope_parameters_from_config(gemma)
    with pytest.raises(ValueError, match="per layer type.*'full_attention', 'sliding_attention'"):
        posenc.rope_frequencies(256, gemma.rope_parameters)
    neox = posenc.rope_parameters_from_config(tf.GPTNeoXConfig())
    assert neox == {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    legacy = {"rope_theta": 5e5, "rope_scaling": {"type": "yarn", "factor": 4.0}, "rotary_pct": 0.5,
              "original_max_position_embeddings": 2048, "max_position_embeddings": 8192}
    assert posenc.rope_parameters_from_config(legacy) == {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5, "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 2048}
    llama = tf.LlamaConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 1e5, "factor": 2.0,
                                            "original_max_position_embeddings": 8192})
    assert posenc.rope_parameters_from_config(llama)["factor"] == 2.0
    with pytest.raises(ValueError, match="layer_type must be one of"):
        posenc.rope_parameters_from_config(tf.Qwen2Config(), layer_type="local")
    with pytest.raises(TypeError, match="config"):
        posenc.rope_parameters_from_config(3)


def test_readme_example_runs():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### A transformers model with posenc's RoPE", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["tokens"].shape == (1, 40)
