"""posenc.lab.experiments.model: the tiny transformer and its one forward, batched over a model axis.

The oracle is the model written plainly, block by block, with its own ``nn`` modules and the library's reference
attention :func:`posenc.multihead.self_attention` (:func:`reference_forward`)."""

import copy
from dataclasses import replace

import pytest
import torch

import posenc
from posenc.lab.experiments import registry
from posenc.lab.experiments.config import ExperimentConfig
from posenc.lab.experiments.model import ModelStack, TinyTransformer, build_model, stacked_parameters
from posenc.lab.experiments.registry import ENCODINGS, add_encoding, add_layer_pattern
from posenc.layer_patterns import LayerEncodings, LocalWindow, nope_every

TINY = ExperimentConfig(
    vocab_size=8, train_length=8, length_factors=(1, 2, 4), d_model=16, n_heads=2, n_layers=1, d_mlp=32, seeds=(0, 1)
)
DEEP = replace(TINY, n_layers=4)


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made in the test end with it."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))


def reference_forward(model: TinyTransformer, tokens: torch.Tensor):
    """``model``'s forward, one block at a time: ``(logits (B, L, V), hidden, weights)`` as lists per block."""
    positions = torch.arange(tokens.shape[-1])
    x, encoding = model.embed(tokens), model.encoding
    if encoding.kind == "input":  # added once, then no encoding inside the blocks
        x, encoding = encoding.encode_input(x, positions), posenc.NoPE()
    hidden, weights = [], []
    for index, block in enumerate(model.blocks):
        mixed, layer_weights = posenc.self_attention(
            block.attention_norm(x),
            block.q.weight,
            block.k.weight,
            block.v.weight,
            block.n_heads,
            encoding=encoding.layer(index) if isinstance(encoding, LayerEncodings) else encoding,
            positions=positions,
            causal=model.causal,
            w_o=block.o.weight,
            return_weights=True,
        )
        x = x + mixed
        x = x + block.mlp(block.mlp_norm(x))
        hidden.append(x)
        weights.append(layer_weights)
    return model.readout(model.norm(x)), hidden, weights


def _tokens(shape, seed=0):
    return torch.randint(TINY.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(registry.REGISTRY))
def test_the_forward_is_the_plain_model_for_every_registered_encoding(name):
    model = build_model(name, DEEP, seed=0)
    tokens = _tokens((2, 20))  # beyond the training length
    expected, hidden, weights = reference_forward(model, tokens)
    logits, our_hidden, our_weights = model(tokens, return_hidden=True, return_weights=True)
    # float32: the batched products (bmm, addcmul) may add in another order than nn.Linear and nn.LayerNorm
    assert logits.shape == (2, 20, DEEP.vocab_size) and torch.isfinite(logits).all()
    assert torch.allclose(model(tokens), expected, atol=1e-5) and torch.allclose(logits, expected, atol=1e-5)
    assert len(our_hidden) == len(our_weights) == DEEP.n_layers
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(our_hidden, hidden))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(our_weights, weights))
    torch.autograd.grad(model(tokens).square().sum(), model.embed.weight)  # gradients reach the model's own weights


def test_bidirectional_nope_is_permutation_equivariant_and_causal_nope_is_not():
    tokens, perm = _tokens((3, 12)), torch.randperm(12, generator=torch.Generator().manual_seed(1))
    for name, equivariant in (("nope-bidirectional", True), ("nope-causal", False)):
        model = build_model(name, TINY, seed=0)
        gap = (model(tokens[:, perm]) - model(tokens)[:, perm]).abs().max().item()
        assert (gap < 1e-5) == equivariant, (name, gap)


def test_bad_input_is_named():
    model = build_model("rope", TINY, seed=0)
    with pytest.raises(ValueError, match=r"tokens must be a tensor of shape \(B, L\)"):
        model(_tokens((12,)))
    with pytest.raises(ValueError, match="encoding must be one of"):
        build_model("sinusoid", TINY, seed=0)
    with pytest.raises(ValueError, match="one encoding per layer"):
        TinyTransformer(DEEP, LayerEncodings([posenc.NoPE()] * 3), causal=True)
    with pytest.raises(ValueError, match="share one configuration"):
        stacked_parameters([build_model("rope", TINY, 0), build_model("rope", DEEP, 0)])


def _stack(models):
    return ModelStack(*stacked_parameters(models), models[0].blocks[0].n_heads, len(models[0].blocks))


def test_the_stack_computes_what_each_model_computes():
    models = [build_model(name, TINY, seed) for name in ENCODINGS for seed in TINY.seeds]
    stack = _stack(models)
    tokens = _tokens((len(stack), 3, 12))
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(models)])
    # float32: the fused attention adds in another order than softmax(q k^T) v
    assert torch.allclose(stack.logits(tokens), alone, atol=1e-5)
    logits, hidden, weights = stack.logits(tokens, return_hidden=True, return_weights=True)
    assert torch.allclose(logits, alone, atol=1e-5) and len(weights) == len(hidden) == TINY.n_layers
    reference = [model(tokens[i], return_weights=True)[1][-1] for i, model in enumerate(models)]
    assert torch.allclose(weights[-1], torch.stack(reference), atol=1e-5)
    part = stack.part(3, 9)
    assert torch.allclose(part.logits(tokens[3:9]), alone[3:9], atol=1e-5)
    assert part.params["embed.weight"].data_ptr() == stack.params["embed.weight"][3].data_ptr()  # a view
    # equivalent parameter-free encodings share one call; the learned tables stay one per model
    assert [stop - start for start, stop, _, _ in stack.groups] == [len(TINY.seeds)] * len(ENCODINGS)
    with pytest.raises(ValueError, match="M = "):
        stack.logits(tokens[:2])


def test_a_single_model_is_a_stack_of_one_that_views_its_parameters():
    model = build_model("learned", TINY, seed=0)
    stack = ModelStack.of_model(model)
    assert len(stack) == 1 and not stack.fused
    assert stack.params["embed.weight"].data_ptr() == model.embed.weight.data_ptr()
    assert stack.encoding_params[0]["table.table"].data_ptr() == model.encoding.table.table.data_ptr()
    tokens = _tokens((2, 10))
    assert torch.equal(stack.logits(tokens[None])[0], model(tokens))  # the same function on the same tensors


def test_models_share_an_encoding_call_only_when_their_encodings_agree():
    models = [build_model("rope", TINY, 0), build_model("rope", TINY, 1)]
    stretched = copy.deepcopy(models[0])
    stretched.encoding = posenc.RotaryEmbedding(TINY.head_dim, {"rope_type": "linear", "factor": 4.0})
    models += [stretched, build_model("nope-causal", TINY, 0), build_model("nope-bidirectional", TINY, 0)]
    stack = _stack(models)
    assert [(start, stop) for start, stop, _, _ in stack.groups] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    tokens = _tokens((5, 2, 10), seed=3)
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(models)])
    assert torch.allclose(stack.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order


def test_hybrid_rope_layers_rotate_and_its_nope_layer_does_not():
    model = build_model("hybrid", DEEP, seed=0)
    layers = [model.encoding.layer(i) for i in range(4)]
    assert [type(e).__name__ for e in layers] == ["RotaryEmbedding"] * 3 + ["NoPE"]
    eight = build_model("hybrid", replace(DEEP, n_layers=8), seed=0).encoding
    assert [eight.layer(i).kind == "qk" for i in range(8)] == nope_every(8)  # transformers' default pattern
    # layer i runs with layer i's encoding: the logits differ from the same weights with every layer rotating (the
    # control) and with none rotating, and each of those is its own plain model
    tokens = _tokens((2, 12))
    for other in ([posenc.RotaryEmbedding(DEEP.head_dim)] * 4, [posenc.NoPE()] * 4):
        changed = copy.deepcopy(model)
        changed.encoding = LayerEncodings(other)
        assert torch.allclose(changed(tokens), reference_forward(changed, tokens)[0], atol=1e-5)
        assert not torch.allclose(changed(tokens), model(tokens), atol=1e-3)


def test_local_windows_mask_far_keys_in_their_layers_only(scratch):
    add_encoding("rope-window-test", "RoPE, window 3", lambda c: LocalWindow(posenc.RotaryEmbedding(c.head_dim), 3))
    add_layer_pattern("rnope-swa-test", ["rope-window-test"] * 3 + ["nope-causal"])
    models = [build_model("rnope-swa-test", DEEP, seed) for seed in (0, 1)] + [build_model("hybrid", DEEP, 0)]
    stack = _stack(models)
    assert len(stack.groups) == 2  # the windowed pattern and the plain hybrid never share a call
    tokens = _tokens((3, 2, 12), seed=2)
    alone = [m(tokens[i], return_weights=True) for i, m in enumerate(models)]
    stacked, weights = stack.logits(tokens, return_weights=True)
    # float32: the fused attention adds in another order than softmax(q k^T) v
    assert torch.allclose(stack.logits(tokens), torch.stack([a[0] for a in alone]), atol=1e-5)
    assert torch.allclose(stacked, torch.stack([a[0] for a in alone]), atol=1e-5)
    far = torch.arange(12)[:, None] - torch.arange(12)[None, :] >= 3  # keys 3 or more positions back
    assert (weights[0][:2][..., far] == 0).all() and (weights[2][:2][..., far] == 0).all()  # local RoPE layers
    assert (weights[3][:2][..., far] > 0).all()  # the global NoPE layer sees every earlier key
    assert (weights[0][2:][..., far] > 0).all()  # the plain hybrid's RoPE layers are global
    assert torch.allclose(weights[0], torch.stack([a[1][0] for a in alone]), atol=1e-5)


def test_alibi_slopes_stack_apart_and_as_alone(scratch):
    steep = add_encoding(
        "alibi-steep-test",
        "ALiBi, slopes 4, 2, ...",
        lambda c: posenc.ALiBi(c.n_heads, slopes=[4.0 / 2**h for h in range(c.n_heads)]),
    )
    models = [build_model(name, TINY, seed) for name in ("alibi", steep) for seed in TINY.seeds]
    stack = _stack(models)
    assert len(stack.groups) == 2  # other slopes: never one shared bias
    assert torch.equal(stack.groups[1][2].slopes, torch.tensor([4.0, 2.0]))
    tokens = _tokens((4, 2, 12), seed=2)
    alone = torch.stack([m(tokens[i]) for i, m in enumerate(models)])
    assert torch.allclose(stack.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order
