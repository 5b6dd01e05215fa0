"""posenc.use_posenc_rope on tiny random transformers models of every family it supports, and the clear refusal of
the rest (offline). Against the unpatched model: float32 logits and greedy generate bit for bit (left padding,
static cache), bf16 bit for bit with rounding="model", one instance patched at a time, torch.compile fullgraph."""

import threading

import pytest
import torch

import posenc

tf = pytest.importorskip("transformers")

VOCAB = 97
KV = dict(num_key_value_heads=2)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)


def _configs():
    """family -> (config class, its arguments beyond conftest's TINY_SIZES)."""
    yield "llama", tf.LlamaConfig, KV
    yield "mistral", tf.MistralConfig, dict(KV, sliding_window=8)
    yield "qwen2", tf.Qwen2Config, KV
    yield "qwen3", tf.Qwen3Config, dict(KV, head_dim=8)
    yield "gemma2", tf.Gemma2Config, dict(KV, head_dim=8, sliding_window=8)
    yield (
        "gemma3",
        tf.Gemma3TextConfig,
        dict(KV, head_dim=8, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    )
    yield (
        "phi3",
        tf.Phi3Config,
        dict(
            KV,
            original_max_position_embeddings=16,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.3, 1.7],
                "long_factor": [1.0, 1.5, 2.5, 4.0],
            },
        ),
    )
    yield "smollm3", tf.SmolLM3Config, dict(KV, no_rope_layers=[1, 0])
    yield (
        "gpt_neox",
        tf.GPTNeoXConfig,
        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    )
    # the families of issue 31's table: the same rotation under other names, partial rotary, interleaved pairs
    yield "mixtral", tf.MixtralConfig, dict(KV, num_local_experts=4, num_experts_per_tok=2)
    yield "qwen2_moe", tf.Qwen2MoeConfig, dict(**KV, **MOE, num_experts=4, shared_expert_intermediate_size=16)
    yield "qwen3_moe", tf.Qwen3MoeConfig, dict(**KV, **MOE, num_experts=4, head_dim=8)
    yield "olmo2", tf.Olmo2Config, KV
    yield "granite", tf.GraniteConfig, KV
    yield "cohere", tf.CohereConfig, KV  # interleaved pairs
    # interleaved pairs, RoPE only in the sliding-window layers (its global layer is NoPE)
    yield "cohere2", tf.Cohere2Config, dict(KV, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    yield "stablelm", tf.StableLmConfig, dict(KV, partial_rotary_factor=0.5)
    yield "phi", tf.PhiConfig, dict(KV, partial_rotary_factor=0.5)
    yield "starcoder2", tf.Starcoder2Config, KV
    yield "gemma", tf.GemmaConfig, dict(KV, head_dim=8)
    # MLA: the decoupled rope slice, interleaved in and half out (rope_interleave, the default)
    yield (
        "deepseek_v3",
        tf.DeepseekV3Config,
        dict(
            num_key_value_heads=4,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
    )


CONFIGS = {name: (cls, kwargs) for name, cls, kwargs in _configs()}
LAYOUTS = {"cohere": "interleaved", "cohere2": "interleaved"}  # every other family pairs halves


@pytest.fixture(scope="session")
def make(tiny_model):
    """make(family, seed=0, **config changes) -> a tiny random causal LM of that family."""

    def build(name, seed=0, **changes):
        cls, kwargs = CONFIGS[name]
        return tiny_model(cls, seed=seed, **{**kwargs, **changes})

    return build


def rebuilt(model, **changes):
    """The same weights under a changed config."""
    import copy

    config = copy.deepcopy(model.config)
    for key, value in changes.items():
        setattr(config, key, value)
    other = type(model)(config).eval()
    other.load_state_dict(model.state_dict())
    return other


def ids(length=24, batch=2, seed=1):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, x, **kwargs):
    with torch.no_grad():
        return model(x, **kwargs).logits


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request, make):
    return request.param, make(request.param)


def test_unchanged_logits_are_bit_identical(family):
    name, model = family
    x = ids(40 if name == "phi3" else 24)  # phi3: past original_max_position_embeddings, the long factors
    own = logits(model, x)
    with posenc.use_posenc_rope(model) as patched:
        ours = logits(patched, x)
        assert model._posenc_rope.layout == LAYOUTS.get(name, "half")
    assert torch.equal(own, ours)
    assert torch.equal(own, logits(model, x))  # removed on exit
    assert getattr(model, "_posenc_rope", None) is None


def test_layer_pattern_reads_what_the_model_does(family):
    """posenc.layer_patterns reads from the config alone what the probe and the logits show: the layout, and which
    layers rotate (a layer the model leaves unrotated is unchanged by nope_layers; a rotating one is changed)."""
    name, model = family
    specs = posenc.layer_patterns.layer_pattern(model.config)
    x = ids(16)
    own = logits(model, x)
    for index, spec in enumerate(specs):
        with posenc.use_posenc_rope(model, nope_layers=[index]) as patched:
            assert spec.layout == model._posenc_rope.layout == LAYOUTS.get(name, "half")
            assert model._posenc_rope.rotary_layers[index] == spec.rotary
            assert torch.equal(logits(patched, x), own) == (not spec.rotary), (name, index)


def assert_same_generation(model, x, **kwargs):
    """Greedy generate with and without the patch: the same tokens and the same scores at every step."""
    kwargs = dict(kwargs, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    own = model.generate(x, **kwargs)
    with posenc.use_posenc_rope(model):
        ours = model.generate(x, **kwargs)
    assert torch.equal(own.sequences, ours.sequences)
    assert all(torch.equal(a, b) for a, b in zip(own.scores, ours.scores))


def test_generate_with_cache_and_left_padding(family):
    _, model = family
    x = ids(12)
    mask = torch.ones_like(x)
    x[0, :4], mask[0, :4] = 0, 0  # left padding
    assert_same_generation(model, x, attention_mask=mask, max_new_tokens=6, use_cache=True)


@pytest.mark.parametrize("name", ["llama", "cohere"])
def test_generate_with_a_static_cache(make, name):
    assert_same_generation(make(name), ids(10), max_new_tokens=5, cache_implementation="static")


def test_llama4_complex_rotation_is_refused_with_the_reason(tiny_model):
    model = tiny_model(
        tf.Llama4TextConfig, num_key_value_heads=2, intermediate_size_mlp=64, head_dim=8, num_local_experts=2
    )
    with pytest.raises(TypeError, match="complex64 tensor.*complex product"):
        posenc.use_posenc_rope(model)
    assert getattr(model, "_posenc_rope", None) is None


def test_deepseek_v3_both_pair_orders(make):
    """Its attention calls one of two rotations (config.rope_interleave): both are found, each by its probe."""
    for interleave in (True, False):
        model = make("deepseek_v3", rope_interleave=interleave)
        x = ids(16)
        own = logits(model, x)
        with posenc.use_posenc_rope(model) as patched:
            found = model._posenc_rope.rotations[0]
            assert found == {"apply_rotary_pos_emb": "half", "apply_rotary_pos_emb_interleave": "deinterleaved"}
            assert torch.equal(logits(patched, x), own)


# ------------------------------------------------------------------------------------ support by structure
class MyLlama(tf.LlamaForCausalLM):
    """A user's subclass: not a name use_posenc_rope knows."""


@pytest.mark.parametrize(
    "head", [MyLlama, tf.LlamaForSequenceClassification, tf.LlamaModel], ids=lambda head: head.__name__
)
def test_subclasses_task_heads_and_base_models(tiny_model, head):
    model = tiny_model(tf.LlamaConfig, head=head, **KV)
    x = ids(16)

    def run(m):
        with torch.no_grad():
            out = m(x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state

    own = run(model)
    with posenc.use_posenc_rope(model, unrotate_pairs=[0]) as patched:
        changed = run(patched)
    with posenc.use_posenc_rope(model) as patched:
        assert torch.equal(run(patched), own)
    assert not torch.equal(changed, own)  # the control: the patch reaches the attention


def _gemma3_multimodal(tiny_model, head):
    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=8,
        max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"],
    )
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = tf.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=96,
        boi_token_index=94,
        eoi_token_index=95,
    )
    return tiny_model(config, head=head)


@pytest.mark.parametrize("head", [tf.Gemma3ForConditionalGeneration, tf.Gemma3Model], ids=lambda h: h.__name__)
def test_multimodal_wrappers_patch_their_language_model(tiny_model, head):
    model = _gemma3_multimodal(tiny_model, head)
    x = ids(16).clamp(max=90)

    def run(m):
        with torch.no_grad():
            out = m(input_ids=x)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state

    own = run(model)
    with posenc.use_posenc_rope(model) as patched:
        handle = model._posenc_rope
        assert type(handle.decoder).__name__ == "Gemma3TextModel"
        assert torch.equal(run(patched), own)
        with pytest.raises(RuntimeError, match="already patched"):
            posenc.use_posenc_rope(handle.decoder)  # its language model, patched through the wrapper


# ------------------------------------------------------------------------------------ one instance at a time
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_patching_one_model_leaves_another_of_its_family_alone(make, dtype):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    a, b = make("llama", seed=0).to(dtype), make("llama", seed=1).to(dtype)
    x = ids(20)
    own_a, own_b = logits(a, x), logits(b, x)
    changed = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}
    with posenc.use_posenc_rope(a, changed) as patched:
        assert modeling_llama.apply_rotary_pos_emb is original
        assert not torch.equal(logits(patched, x), own_a)  # A is changed ...
        assert torch.equal(logits(b, x), own_b)  # ... B is not, bit for bit
    assert torch.equal(logits(a, x), own_a)


def test_patching_and_removing_in_threads_does_not_leak(make):
    a, b = make("llama", seed=0), make("llama", seed=1)
    x = ids(12)
    own_a, own_b = logits(a, x), logits(b, x)
    seen_b, errors, stop = [], [], threading.Event()

    def patch_a_repeatedly():
        try:
            for _ in range(20):
                with posenc.use_posenc_rope(a, unrotate_pairs=range(4)) as patched:
                    logits(patched, x)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            stop.set()

    def run_b_meanwhile():
        while not stop.is_set():
            seen_b.append(logits(b, x))

    threads = [threading.Thread(target=patch_a_repeatedly), threading.Thread(target=run_b_meanwhile)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and seen_b
    assert all(torch.equal(seen, own_b) for seen in seen_b)
    assert torch.equal(logits(a, x), own_a) and getattr(a, "_posenc_rope", None) is None


# ------------------------------------------------------------------------------------ bf16: the model's rounding
@pytest.mark.parametrize("name", ["llama", "cohere", "phi", "gemma3", "deepseek_v3"])
def test_model_rounding_reproduces_bf16_logits_bit_for_bit(make, name):
    model = make(name).to(torch.bfloat16)  # its inv_freq buffer becomes bf16 too, as the model then computes
    x = ids(20)
    own = logits(model, x)
    with posenc.use_posenc_rope(model, rounding="model") as patched:
        exact = logits(patched, x)
    with posenc.use_posenc_rope(model) as patched:
        rotated_in_float32 = logits(patched, x)
    assert torch.equal(exact, own)
    assert not torch.equal(rotated_in_float32, own)  # the control: the default rounds otherwise


def test_float32_default_rotates_bf16_at_the_rounding_floor():
    """The use_posenc_rope docstring's rotation numbers: posenc's bf16 rotation errs by the rounding of the exact
    result; transformers' bf16 products with the table a bf16 model holds (frequencies rounded by .to(bf16)) err
    far more."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv_freq = posenc.rope_frequencies(64, {"rope_type": "default", "rope_theta": 10000.0})[0]
    positions = torch.arange(1024)[None]
    q = torch.randn(1, 8, 1024, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    angles = positions[..., None].double() * inv_freq.double()
    exact = posenc.apply_rope(q.double(), angles.cos(), angles.sin())
    floor = (exact.bfloat16().double() - exact).abs().mean()
    cos, sin = posenc.rope_cos_sin(positions, inv_freq)
    ours = (posenc.apply_rope(q, cos, sin).double() - exact).abs().mean()
    half = positions[..., None].float() * inv_freq.bfloat16().float()
    table = torch.cat((half, half), -1)
    theirs = apply_rotary_pos_emb(q, q, table.cos().bfloat16(), table.sin().bfloat16())[0].double() - exact
    assert ours <= floor * 1.001
    assert theirs.abs().mean() > 10 * floor


# ------------------------------------------------------------------------------------ torch.compile
@pytest.mark.parametrize(
    "rope_parameters", [None, {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}], ids=["default", "dynamic"]
)
def test_compiles_whole_with_no_more_graph_breaks(tiny_model, rope_parameters):
    """fullgraph=True fails on any graph break: the patched model compiles into one graph (0 breaks), for a static
    rope type (the unpatched model: 0 breaks too) and for dynamic NTK (the unpatched model breaks on its
    data-dependent branch: 5 breaks with transformers 5.23)."""
    changes = {} if rope_parameters is None else {"rope_parameters": rope_parameters}
    model = tiny_model(tf.LlamaConfig, **KV, **changes)
    x = ids(20)
    if rope_parameters is None:  # the unpatched model compiles whole: so must the patched one
        torch._dynamo.reset()
        with torch.no_grad():
            assert torch._dynamo.explain(model)(x).graph_break_count == 0
    with posenc.use_posenc_rope(model) as patched:
        torch._dynamo.reset()
        compiled = torch.compile(patched, fullgraph=True, backend="eager")
        with torch.no_grad():
            assert torch.equal(compiled(x).logits, patched(x).logits)
    torch._dynamo.reset()


def test_tables_are_built_once_per_forward(make):
    for name, per_forward in (("llama", 1), ("gemma3", 2)):  # Gemma 3: one table per layer type
        model = make(name)
        with posenc.use_posenc_rope(model) as patched:
            handle = model._posenc_rope
            calls = []
            cos_sin = handle.cos_sin
            handle.cos_sin = lambda *args, **kwargs: calls.append(1) or cos_sin(*args, **kwargs)  # noqa: B023
            logits(patched, ids(12))
        assert len(calls) == per_forward


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral", "smollm3", "gpt_neox"])
def test_changed_rope_parameters_equal_the_rebuilt_model(make, name):
    model = make(name)
    parameters = dict(model.config.rope_parameters)
    yarn = {
        **parameters,
        "rope_type": "yarn",
        "rope_theta": 5000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    x = ids(48)
    with torch.no_grad():
        expected = rebuilt(model, rope_parameters=yarn)(x).logits
        with posenc.use_posenc_rope(model, yarn) as patched:
            got = patched(x).logits
        assert not torch.equal(expected, model(x).logits)
    assert torch.equal(got, expected)


def test_gemma3_local_and_global_bases(make):
    model = make("gemma3")
    changed = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0},
    }
    x = ids(30)
    with torch.no_grad():
        expected = rebuilt(model, rope_parameters=changed)(x).logits
        with posenc.use_posenc_rope(model, changed) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="full_attention"):
        posenc.use_posenc_rope(model, {"sliding_attention": changed["sliding_attention"]})


@pytest.mark.parametrize(
    "flat",
    [{"rope_type": "default", "rope_theta": None}, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}],
    ids=["as_transformers_5_15_leaves_it", "a_flat_table_the_model_ignores"],
)
def test_gemma3_reads_the_nested_tables_beside_flat_keys(tiny_model, flat):
    """transformers 5.15 builds a Gemma 3 config whose layer_types lack one of its rope types (here: no global
    layer) with flat keys beside the nested tables; Gemma 3's rotary embedding reads only the nested ones, and so
    must posenc (it raised "rope_parameters has the key 'sliding_attention'" before). The config is given that
    shape by hand, so the test holds under every transformers version."""
    model = tiny_model(tf.Gemma3TextConfig, **KV, head_dim=8, sliding_window=8, layer_types=["sliding_attention"] * 2)
    nested = {t: v for t, v in model.config.rope_parameters.items() if isinstance(v, dict)}
    model.config.rope_parameters = {**nested, **flat}
    x = ids(20)
    own = logits(model, x)
    positions = torch.arange(20)[None]
    rotary = model.model.rotary_emb
    own_cos, own_sin = type(rotary).forward(rotary, torch.zeros(1, 20, 1), positions, "sliding_attention")
    with posenc.use_posenc_rope(model) as patched:
        cos, sin = model._posenc_rope.cos_sin(positions, "sliding_attention")
        assert torch.equal(logits(patched, x), own)
    assert torch.equal(cos, own_cos) and torch.equal(sin, own_sin)
    spec = posenc.layer_patterns.layer_pattern(model.config)[0]
    assert spec.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


def test_phi3_longrope_switches_tables_at_the_original_length(make):
    model = make("phi3")
    short = ids(16)
    handle = posenc.use_posenc_rope(model)
    try:
        inv_short = handle._table(None, 16)[0]
        inv_long = handle._table(None, 40)[0]
    finally:
        handle.remove()
    assert not torch.equal(inv_short, inv_long)
    with torch.no_grad(), posenc.use_posenc_rope(model) as patched:
        assert torch.equal(patched(short).logits, make("phi3")(short).logits)


def test_nope_layers_equal_smollm3_config(make):
    model = make("smollm3")  # layer 0 rotates, layer 1 is NoPE
    x = ids(20)
    with torch.no_grad():
        expected = rebuilt(model, no_rope_layers=[0, 0])(x).logits
        with posenc.use_posenc_rope(model, nope_layers=[0]) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)


def test_unrotate_every_pair_is_nope_everywhere(make):
    model = make("llama")
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


def test_unrotate_keeps_slow_pairs_position_free(make):
    model = make("llama")
    x = ids(20)
    with torch.no_grad():
        table = posenc.rope_frequencies(8, model.config.rope_parameters)[0].clone()
        table[:2] = 0
        with posenc.use_posenc_rope(model, inv_freq=table) as patched:
            expected = patched(x).logits
        with posenc.use_posenc_rope(model, unrotate_pairs=[0, 1]) as patched:
            got = patched(x).logits
    assert torch.equal(got, expected)


def test_drop_pairs_equals_zeroed_projection_rows(make):
    model = make("llama")  # head_dim 8: pair i is features i and i + 4 of every head
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


def test_capture_layers_returns_unrotated_qk(make):
    model = make("llama")
    x = ids(10, batch=1)
    with torch.no_grad(), posenc.use_posenc_rope(model, capture_layers=[1]) as patched:
        patched(x)
        handle = model._posenc_rope
        q, k = handle.captured[1]
    assert q.shape == (1, 4, 10, 8) and k.shape == (1, 2, 10, 8)
    assert list(handle.captured) == [1]


def test_capture_refuses_a_layer_the_model_does_not_rotate(make):
    model = make("cohere2")  # layer 0 sliding (rotates), layer 1 global (NoPE)
    with pytest.raises(ValueError, match=r"capture_layers: layers \[1\] .*do not rotate.*rotate: \[0\]"):
        posenc.use_posenc_rope(model, capture_layers=[1])
    with torch.no_grad(), posenc.use_posenc_rope(model, capture_layers=[0]) as patched:
        patched(ids(10, batch=1))
        assert list(model._posenc_rope.captured) == [0]


def test_gradients_flow(make):
    model = make("qwen2")
    model.train()
    with posenc.use_posenc_rope(model, unrotate_pairs=[0]) as patched:
        loss = patched(ids(12), labels=ids(12)).loss
    loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_bad_input(make):
    with pytest.raises(TypeError, match="rotary_emb.*Linear has no such module"):
        posenc.use_posenc_rope(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        posenc.use_posenc_rope("llama")
    model = make("llama")
    with pytest.raises(ValueError, match="rounding must be one of 'float32', 'model'"):
        posenc.use_posenc_rope(model, rounding="bf16")
    with pytest.raises(ValueError, match="unrotate_pairs"):
        posenc.use_posenc_rope(model, unrotate_pairs=[7])
    with pytest.raises(ValueError, match="nope_layers"):
        posenc.use_posenc_rope(model, nope_layers=[2])
    with pytest.raises(ValueError, match="rope_type"):
        posenc.use_posenc_rope(model, {"rope_type": "nope"})
    with pytest.raises(ValueError, match="rotates 4 pairs per head, inv_freq gives 3"):
        posenc.use_posenc_rope(model, inv_freq=torch.ones(3))
    edited = make("llama")
    edited.config.rope_parameters = {**edited.config.rope_parameters, "rope_theta": 500.0}  # not its rotary's
    with pytest.raises(ValueError, match="differs from its rotary embedding's own"):
        posenc.use_posenc_rope(edited)
    with posenc.use_posenc_rope(model):
        with pytest.raises(RuntimeError, match="already patched"):
            posenc.use_posenc_rope(model)
        with pytest.raises(RuntimeError, match="already patched"):
            posenc.use_posenc_rope(model.model)  # its base model, through the same decoder
    assert getattr(model.model, "_posenc_rope", None) is None and "forward" not in vars(model.model.rotary_emb)


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
    legacy = {
        "rope_theta": 5e5,
        "rope_scaling": {"type": "yarn", "factor": 4.0},
        "rotary_pct": 0.5,
        "original_max_position_embeddings": 2048,
        "max_position_embeddings": 8192,
    }
    assert posenc.rope_parameters_from_config(legacy) == {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 5e5,
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 2048,
    }
    llama = tf.LlamaConfig(
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e5,
            "factor": 2.0,
            "original_max_position_embeddings": 8192,
        }
    )
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
