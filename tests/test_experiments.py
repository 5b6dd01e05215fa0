"""posenc.lab.tasks and posenc.lab.experiments: task generators, the tiny transformer, training and its determinism."""

import copy
import itertools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.generators import jordan_generator
from posenc.lab import experiments
from posenc.lab.experiments import (
    ENCODINGS,
    Ensemble,
    ExperimentConfig,
    TinyTransformer,
    accuracies,
    accuracy_spread,
    add_encoding,
    add_layer_pattern,
    build_model,
    encoding_label,
    evaluate,
    evaluate_ensemble,
    fine_tune,
    jordan_frequencies,
    jordan_rotation_generator,
    results_table,
    run_encoding,
    run_experiments,
    run_plan,
    threads,
    train,
    with_rope,
)
from posenc.lab.tasks import IGNORE_INDEX, CopyBack, FetchPosition, position_blind_accuracy
from posenc.layer_patterns import LayerEncodings, nope_every

TINY = ExperimentConfig(
    vocab_size=8,
    train_length=8,
    length_factors=(1, 2, 4),
    d_model=16,
    n_heads=2,
    n_layers=1,
    d_mlp=32,
    steps=40,
    batch_size=16,
    learning_rate=1e-2,
    warmup_steps=5,
    eval_batch_size=32,
    seeds=(0, 1),
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models are all overhead: one thread avoids OpenMP spin-waits on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_threads_restores_the_count_even_after_an_error():
    torch.set_num_threads(2)  # the module's fixture runs at one thread; restored below
    with pytest.raises(RuntimeError), threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    with pytest.raises(ValueError, match="count"), threads(0):
        pass


def sample(task, length, seed, batch=5, vocab=7):
    return task.sample(batch, length, vocab, torch.Generator().manual_seed(seed))


# tasks ----------------------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(offset=st.integers(1, 6), extra=st.integers(0, 40), seed=st.integers(0, 2**31 - 1))
def test_copy_back_targets_are_the_token_offset_steps_back(offset, extra, seed):
    length = offset + 1 + extra
    inputs, targets, mask = sample(CopyBack(offset), length, seed)
    assert inputs.shape == targets.shape == mask.shape == (5, length)
    assert inputs.dtype == targets.dtype == torch.int64 and mask.dtype == torch.bool
    for b, i in itertools.product(range(5), range(length)):
        if i >= offset:
            assert mask[b, i] and targets[b, i] == inputs[b, i - offset]
        else:
            assert not mask[b, i] and targets[b, i] == IGNORE_INDEX


@settings(max_examples=40, deadline=None)
@given(position=st.integers(0, 6), extra=st.integers(0, 40), seed=st.integers(0, 2**31 - 1))
def test_fetch_position_targets_are_the_token_at_that_position(position, extra, seed):
    length = position + 1 + extra
    inputs, targets, mask = sample(FetchPosition(position), length, seed)
    for b, i in itertools.product(range(5), range(length)):
        if i >= position:
            assert mask[b, i] and targets[b, i] == inputs[b, position]
        else:
            assert not mask[b, i] and targets[b, i] == IGNORE_INDEX


@pytest.mark.parametrize("task", [CopyBack(2), FetchPosition(1)])
def test_sampling_is_deterministic_per_seed_and_uses_the_whole_vocabulary(task):
    first, again, other = sample(task, 64, 3, batch=32), sample(task, 64, 3, batch=32), sample(task, 64, 4, batch=32)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert set(first[0].unique().tolist()) == set(range(7))


def test_tasks_say_what_order_they_need_and_reject_bad_arguments():
    assert CopyBack(3).order == "relative" and FetchPosition(2).order == "absolute"
    with pytest.raises(ValueError, match="length"):
        CopyBack(3).sample(2, 3, 5, torch.Generator())
    with pytest.raises(ValueError, match="offset"):
        CopyBack(0)
    with pytest.raises(TypeError, match="generator"):
        CopyBack(1).sample(2, 4, 5, generator=0)
    with pytest.raises(ValueError, match="vocab_size"):
        FetchPosition(1).sample(2, 4, 1, torch.Generator())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("task", [CopyBack(1), CopyBack(2), FetchPosition(0), FetchPosition(1)])
def test_position_blind_accuracy_is_the_bayes_optimum_of_a_set_function(task, causal):
    """Brute force over every sequence of length 4 on 3 tokens: the best predictor that sees only its own token
    and the multiset of the sequence (causal: of the prefix, whose size reveals the position), pooled over all
    target positions, scores exactly the formula's mean."""
    length, vocab = 4, 3
    sequences = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    source = task.sources(length)
    votes = {}  # what the predictor sees -> counts of targets
    for sequence in sequences.tolist():
        for i in range(length):
            if source[i] >= 0:
                seen = sequence[: i + 1] if causal else sequence
                key = (tuple(sorted(seen)), sequence[i])
                votes.setdefault(key, [0] * vocab)[sequence[source[i]]] += 1
    best = sum(max(counts) for counts in votes.values()) / sum(sum(counts) for counts in votes.values())
    assert position_blind_accuracy(task, sequences, vocab, causal=causal) == pytest.approx(best, abs=1e-6)
    per_position = position_blind_accuracy(task, sequences, vocab, causal=causal, per_position=True)
    assert torch.isnan(per_position[source < 0]).all()
    assert per_position[source >= 0].mean().item() == pytest.approx(best, abs=1e-6)


# the model ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_every_encoding_builds_and_runs_beyond_the_training_length(name):
    model = build_model(name, TINY, seed=0)
    tokens = torch.randint(TINY.vocab_size, (2, max(TINY.eval_lengths)))
    logits = model(tokens)
    assert logits.shape == (2, max(TINY.eval_lengths), TINY.vocab_size)
    assert torch.isfinite(logits).all()
    assert isinstance(encoding_label(name), str)


def test_bidirectional_nope_is_permutation_equivariant_and_causal_nope_is_not():
    tokens = torch.randint(TINY.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    for name, equivariant in (("nope-bidirectional", True), ("nope-causal", False)):
        model = build_model(name, TINY, seed=0)
        gap = (model(tokens[:, perm]) - model(tokens)[:, perm]).abs().max().item()
        assert (gap < 1e-5) == equivariant, (name, gap)


def test_unknown_encoding_names_are_rejected():
    with pytest.raises(ValueError, match="encoding must be one of"):
        build_model("sinusoid", TINY, seed=0)


# training -------------------------------------------------------------------------------------------------------
def test_training_lowers_the_loss():
    _, losses = train(CopyBack(1), "rope", TINY)
    assert losses.shape == (2, TINY.steps)
    start, end = losses[:, :5].mean(1), losses[:, -5:].mean(1)
    assert (end < 0.8 * start).all(), (start, end)


def test_two_runs_give_identical_numbers():
    # exact on purpose: the same process runs the same operations in the same order on one thread
    first = run_experiments([FetchPosition(1)], ["learned", "alibi"], TINY)
    again = run_experiments([FetchPosition(1)], ["learned", "alibi"], TINY)
    assert [(r.losses, r.accuracy) for r in first] == [(r.losses, r.accuracy) for r in again]
    assert results_table(first, TINY) == results_table(again, TINY)


def test_seeds_trained_side_by_side_equal_seeds_trained_alone():
    together, _ = train(CopyBack(2), "sinusoidal", replace(TINY, steps=10))
    alone, _ = train(CopyBack(2), "sinusoidal", replace(TINY, steps=10, seeds=(1,)))
    for (key, value), (_, single) in zip(together.params.items(), alone.params.items()):
        assert torch.allclose(value[1], single[0], atol=1e-5), key
    assert not torch.allclose(together.params["embed.weight"][0], together.params["embed.weight"][1])


def test_the_stack_computes_what_each_model_computes():
    ensemble = Ensemble(list(ENCODINGS), TINY)
    tokens = torch.randint(TINY.vocab_size, (len(ensemble), 3, 12), generator=torch.Generator().manual_seed(0))
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(ensemble.models)])
    # float32 tolerance: the fused attention adds in another order than softmax(q k^T) v
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)
    logits, weights = ensemble.logits(tokens, return_weights=True)
    assert torch.allclose(logits, alone, atol=1e-5) and len(weights) == TINY.n_layers
    reference = [model(tokens[i], return_weights=True)[1][-1] for i, model in enumerate(ensemble.models)]
    assert torch.allclose(weights[-1], torch.stack(reference), atol=1e-5)
    part = ensemble.part(3, 9)
    assert torch.allclose(part.logits(tokens[3:9]), alone[3:9], atol=1e-5)
    assert part.params["embed.weight"].data_ptr() == ensemble.params["embed.weight"][3].data_ptr()  # a view
    # equivalent parameter-free encodings share one call; the learned tables stay one per model
    assert [stop - start for start, stop, _, _ in ensemble.groups] == [len(TINY.seeds)] * len(ENCODINGS)
    with pytest.raises(ValueError, match="M = "):
        ensemble.logits(tokens[:2])


def test_models_share_an_encoding_call_only_when_their_encodings_agree():
    models = [build_model("rope", TINY, 0), build_model("rope", TINY, 1)]
    stretched = with_rope(models[:1], {"rope_type": "linear", "factor": 4.0}, TINY.train_length)
    causal, bidirectional = build_model("nope-causal", TINY, 0), build_model("nope-bidirectional", TINY, 0)
    ensemble = Ensemble.from_models(models + stretched + [causal, bidirectional], TINY)
    assert [(start, stop) for start, stop, _, _ in ensemble.groups] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    tokens = torch.randint(TINY.vocab_size, (5, 2, 10), generator=torch.Generator().manual_seed(3))
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(models + stretched + [causal, bidirectional])])
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order
    with pytest.raises(TypeError, match="TinyTransformer"):
        Ensemble.from_models([], TINY)


def test_a_model_trains_the_same_in_a_mixed_stack_as_alone():
    short = replace(TINY, steps=10)
    mixed, _ = train([CopyBack(2), FetchPosition(1)], ["learned", "rope"], short)
    alone, _ = train(FetchPosition(1), "rope", short)
    seeds = len(short.seeds)
    for key, value in alone.params.items():
        assert torch.allclose(mixed.params[key][seeds:], value, atol=1e-5), key
    learned = mixed.trained_models()[0].encoding.table.table
    assert torch.equal(learned, mixed.encoding_params[0]["table.table"][0])
    with pytest.raises(ValueError, match="one per name"):
        train([CopyBack(2)], ["learned", "rope"], short)


def test_stacked_evaluation_agrees_with_one_model_at_a_time():
    models = train(CopyBack(1), "rope", replace(TINY, steps=10))[0].trained_models()
    models += train(CopyBack(1), "alibi", replace(TINY, steps=10))[0].trained_models()
    ensemble = Ensemble.from_models(models, TINY)
    overall, per_position = evaluate_ensemble(ensemble, CopyBack(1), 24, TINY)
    for index, model in enumerate(models):
        single, positions = evaluate(model, CopyBack(1), 24, TINY)
        # argmax of logits equal to float rounding: at most one target of the batch may flip
        assert abs(overall[index].item() - single) <= 1 / (TINY.eval_batch(24) * 23) + 1e-9
        assert torch.allclose(per_position[index], positions, atol=1 / TINY.eval_batch(24) + 1e-6, equal_nan=True)
    assert accuracies(models, CopyBack(1), TINY).shape == (len(models), len(TINY.eval_lengths))


def test_run_plan_keeps_the_plan_order_and_reports_each_pair():
    seen = []
    plan = [(CopyBack(2), "alibi"), (FetchPosition(1), "sinusoidal")]
    runs = run_plan(plan, replace(TINY, steps=5), progress=lambda pair: seen.append((pair[0].task, pair[0].encoding)))
    assert seen == [("copy 2 back", "alibi"), ("fetch position 1", "sinusoidal")]
    assert [(r.task, r.encoding, r.seed) for r in runs] == [(t.name, n, s) for t, n in plan for s in TINY.seeds]
    assert all(set(r.accuracy) == set(TINY.eval_lengths) for r in runs)


def test_learned_rows_beyond_the_training_length_are_never_trained():
    initial = build_model("learned", TINY, seed=0).encoding.table.table.detach().clone()
    trained, _ = train(FetchPosition(1), "learned", TINY)
    table = trained.trained_models()[0].encoding.table.table.detach()
    inside, beyond = slice(0, TINY.train_length), slice(TINY.train_length, None)
    assert not torch.allclose(table[inside], initial[inside], atol=1e-3)
    ratio = table[beyond] / initial[beyond]  # only AdamW's decoupled weight decay touches them
    assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), atol=1e-5)
    assert 0.9 < ratio.flatten()[0] <= 1.0


def test_evaluation_and_table_agree():
    runs = run_encoding(FetchPosition(1), "learned", TINY)
    model = build_model("learned", TINY, seed=0)
    accuracy, per_position = evaluate(model, FetchPosition(1), 16, TINY)
    assert 0 <= accuracy <= 1 and per_position.shape == (16,) and torch.isnan(per_position[0])
    mean, low, high = accuracy_spread(runs, "fetch position 1", "learned", 8)
    assert low <= mean <= high and {r.accuracy[8] for r in runs} >= {low, high}
    table = results_table(runs, TINY)
    cell = f"{100 * mean:5.1f} ({100 * low:.0f}-{100 * high:.0f})"
    assert cell in table
    assert table.count("\n") == 2  # header, rule, one row
    html = results_table(
        runs, TINY, baselines={"fetch position 1": {"bound <x>": {8: 0.5, 16: 0.25, 32: 0.125}}}, html=True
    )
    assert html.count("<tr>") == 3 and f'<td style="text-align:right">{cell}</td>' in html
    assert "bound &lt;x&gt;" in html and " 12.5</td>" in html


# the Jordan controls, long evaluations, rescaled RoPE and fine-tuning -------------------------------------------
@pytest.mark.parametrize("head_dim", [8, 16])
def test_the_jordan_control_is_the_jordan_generator_without_its_nilpotent_part(head_dim):
    jordan = jordan_generator(head_dim, dtype=torch.float64)
    control = jordan_rotation_generator(head_dim, dtype=torch.float64)
    nilpotent = jordan - control
    # exact: the entries are 0, 1 or one frequency, and each product entry has at most one non-zero term
    assert set(nilpotent.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(nilpotent @ nilpotent, torch.zeros_like(nilpotent))
    assert torch.equal(nilpotent @ control, control @ nilpotent)
    frequencies = torch.linalg.eigvals(control).imag.abs().sort().values
    assert torch.allclose(frequencies, jordan_frequencies(head_dim).repeat_interleave(2).sort().values, atol=1e-12)
    damped = jordan_rotation_generator(head_dim, eigenvalue=-0.05, dtype=torch.float64)
    assert torch.allclose(
        torch.linalg.eigvals(damped).real, torch.full((head_dim,), -0.05, dtype=torch.float64), atol=1e-12
    )


def test_long_evaluations_use_fewer_sequences():
    config = ExperimentConfig()
    assert [config.eval_batch(n) for n in config.eval_lengths] == [256, 128, 64, 16, 8]
    assert config.eval_batch(10**6) == 8


def test_with_rope_swaps_only_the_table():
    models = train(CopyBack(1), "rope", replace(TINY, steps=5))[0].trained_models()
    tokens = torch.randint(TINY.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    same = with_rope(models, {"rope_type": "default"}, TINY.train_length)
    # exact by construction: the rebuilt table is computed by the same code from the same parameters
    assert all(torch.equal(a(tokens), b(tokens)) for a, b in zip(models, same))
    stretched = with_rope(models, {"rope_type": "linear", "factor": 4.0}, TINY.train_length)
    assert torch.allclose(stretched[0].encoding.inv_freq, models[0].encoding.inv_freq / 4)
    assert not torch.allclose(stretched[0](tokens), models[0](tokens))
    with pytest.raises(TypeError, match="RoPE"):
        with_rope([build_model("alibi", TINY, 0)], {"rope_type": "default"}, 8)


def test_fine_tune_trains_copies_and_leaves_the_models_alone():
    models = train(CopyBack(1), "rope", replace(TINY, steps=5))[0].trained_models()
    before = [m.embed.weight.detach().clone() for m in models]
    tuned = fine_tune(models, CopyBack(1), TINY, length=16, steps=3, batch_size=4)
    assert all(torch.equal(m.embed.weight, b) for m, b in zip(models, before))
    assert all(not torch.allclose(t.embed.weight, b) for t, b in zip(tuned, before))
    table = accuracies(tuned, CopyBack(1), TINY, lengths=(8, 16))
    assert table.shape == (2, 2) and ((0 <= table) & (table <= 1)).all()
    with pytest.raises(ValueError, match="one model per seed"):
        fine_tune(models[:1], CopyBack(1), TINY, length=16, steps=3)
    with pytest.raises(ValueError, match="steps"):
        fine_tune(models, CopyBack(1), TINY, length=16, steps=0)


# hybrid layers (chapter 13) ---------------------------------------------------------------------------------------
DEEP = replace(TINY, n_layers=4, steps=30)


def test_hybrid_rope_layers_rotate_and_its_nope_layer_does_not():
    model = build_model("hybrid", DEEP, seed=0)
    layers = [model.encoding.layer(i) for i in range(4)]
    assert [type(e).__name__ for e in layers] == ["RotaryEmbedding"] * 3 + ["NoPE"]
    eight = build_model("hybrid", replace(DEEP, n_layers=8), seed=0).encoding
    assert [eight.layer(i).kind == "qk" for i in range(8)] == nope_every(8)  # transformers' default pattern
    q, k = torch.randn(2, 2, 9, DEEP.head_dim), torch.randn(2, 2, 9, DEEP.head_dim)
    positions = torch.arange(9)
    cos, sin = posenc.rope_cos_sin(positions, layers[0].inv_freq)
    for index, encoding in enumerate(layers):
        q_enc, k_enc = encoding.encode_qk(q, k, positions, positions)
        if index == 3:
            assert torch.equal(q_enc, q) and torch.equal(k_enc, k)
        else:
            assert torch.equal(q_enc, posenc.apply_rope(q, cos, sin))
            assert torch.equal(k_enc, posenc.apply_rope(k, cos, sin))
    # the model runs block i with layer i's encoding: its logits are those of that loop, and differ from the same
    # weights with every layer rotating (the control) and with none rotating
    tokens = torch.randint(DEEP.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = model.embed(tokens)
        for block, encoding in zip(model.blocks, layers):
            x = block(x, encoding, torch.arange(12), causal=True)
        assert torch.equal(model(tokens), model.readout(model.norm(x)))
        for other in ([posenc.RotaryEmbedding(DEEP.head_dim)] * 4, [posenc.NoPE()] * 4):
            changed = copy.deepcopy(model)
            changed.encoding = LayerEncodings(other)
            assert not torch.allclose(changed(tokens), model(tokens), atol=1e-3)


def test_hybrid_trains_in_the_stack_as_alone():
    ensemble, losses = train(CopyBack(1), ["hybrid", "rope"], DEEP)
    assert losses.shape == (4, DEEP.steps)
    assert torch.isfinite(losses).all() and (losses[:, -5:].mean(1) < losses[:, :5].mean(1)).all()
    assert [stop - start for start, stop, _, _ in ensemble.groups] == [2, 2]  # the hybrid is not RoPE
    tokens = torch.randint(DEEP.vocab_size, (4, 2, 10), generator=torch.Generator().manual_seed(2))
    models = ensemble.trained_models()
    alone = torch.stack([model(tokens[i]) for i, model in enumerate(models)])
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order


@pytest.fixture
def _pattern_names():
    added = []
    yield added
    for name in added:
        ENCODINGS.pop(name, None)
        experiments.LAYER_PATTERNS.pop(name, None)
        experiments._PATTERNS.pop(name, None)
        experiments._ADDED.discard(name)


def test_add_layer_pattern_registers_a_per_layer_model(_pattern_names):
    name = add_layer_pattern("nope-first-test", ["nope-causal", "rope"])
    _pattern_names.append(name)
    assert add_layer_pattern(name, ("nope-causal", "rope")) == name  # the same again: a re-run notebook
    model = build_model(name, DEEP, seed=0)
    assert [type(model.encoding.layer(i)).__name__ for i in range(4)] == ["NoPE", "RotaryEmbedding"] * 2
    assert model.causal and encoding_label(name).startswith("layers NoPE, causal, RoPE")
    with pytest.raises(ValueError, match="taken"):
        add_layer_pattern(name, ["rope"])
    with pytest.raises(ValueError, match="taken"):
        add_layer_pattern("rope", ["rope"])
    with pytest.raises(ValueError, match="'sinusoidal'"):
        add_layer_pattern("bad-input-test", ["rope", "sinusoidal"])
    with pytest.raises(ValueError, match="all causal"):
        add_layer_pattern("bad-causal-test", ["rope", "nope-bidirectional"])
    with pytest.raises(ValueError, match="encoding must be one of"):
        add_layer_pattern("bad-name-test", ["rope", "rotary"])
    with pytest.raises(TypeError, match="sequence"):
        add_layer_pattern("bad-str-test", "rope")
    with pytest.raises(ValueError, match="one encoding per layer"):
        TinyTransformer(DEEP, LayerEncodings([posenc.NoPE()] * 3), causal=True)
    assert not {"bad-input-test", "bad-causal-test", "bad-name-test", "bad-str-test"} & (
        set(ENCODINGS) | set(experiments.LAYER_PATTERNS)
    )
    assert name not in ENCODINGS and "hybrid" not in ENCODINGS  # chapter 11's plan over ENCODINGS is untouched


def test_add_encoding_then_a_pattern_with_it_trains(_pattern_names):
    from posenc.layer_patterns import AttentionTemperature

    def tuned(config):
        return AttentionTemperature(floor_scale=config.train_length // 2, attn_scale=0.5)

    _pattern_names.append(add_encoding("nope-temperature-test", "NoPE, temperature", tuned))
    assert add_encoding("nope-temperature-test", "NoPE, temperature", tuned)  # a re-run cell
    _pattern_names.append(add_layer_pattern("irope-test", ["rope"] * 3 + ["nope-temperature-test"]))
    model = build_model("irope-test", DEEP, seed=0)
    assert isinstance(model.encoding.layer(3), AttentionTemperature) and model.encoding.layer(3).floor_scale == 4
    ensemble, losses = train(CopyBack(1), "irope-test", replace(DEEP, steps=5))
    tokens = torch.randint(DEEP.vocab_size, (2, 2, 24), generator=torch.Generator().manual_seed(2))
    alone = torch.stack([m(tokens[i]) for i, m in enumerate(ensemble.trained_models())])
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order
    with pytest.raises(ValueError, match="taken"):
        add_encoding("rope", "RoPE again", lambda c: posenc.NoPE())
    with pytest.raises(ValueError, match="taken"):
        add_encoding("irope-test", "a pattern's name", lambda c: posenc.NoPE())
    with pytest.raises(TypeError, match="factory must return"):
        add_encoding("bad-factory-test", "bad", lambda c: None)
    with pytest.raises(TypeError, match="factory must be a callable"):
        add_encoding("bad-factory-test", "bad", posenc.NoPE())
    assert "bad-factory-test" not in ENCODINGS


def test_local_rope_layers_and_a_global_nope_layer_stack_as_alone(_pattern_names):
    from posenc.layer_patterns import LocalWindow

    _pattern_names.append(
        add_encoding("rope-window-test", "RoPE, window 3", lambda c: LocalWindow(posenc.RotaryEmbedding(c.head_dim), 3))
    )
    _pattern_names.append(add_layer_pattern("rnope-swa-test", ["rope-window-test"] * 3 + ["nope-causal"]))
    ensemble, _ = train(CopyBack(1), ["rnope-swa-test", "hybrid"], replace(DEEP, steps=5))
    assert len(ensemble.groups) == 2  # the windowed pattern and the plain hybrid never share a call
    tokens = torch.randint(DEEP.vocab_size, (4, 2, 12), generator=torch.Generator().manual_seed(2))
    models = ensemble.trained_models()
    alone = [m(tokens[i], return_weights=True) for i, m in enumerate(models)]
    stacked, weights = ensemble.logits(tokens, return_weights=True)
    # float32: the fused attention adds in another order than softmax(q k^T) v
    assert torch.allclose(ensemble.logits(tokens), torch.stack([a[0] for a in alone]), atol=1e-5)
    assert torch.allclose(stacked, torch.stack([a[0] for a in alone]), atol=1e-5)
    far = torch.arange(12)[:, None] - torch.arange(12)[None, :] >= 3  # keys 3 or more positions back
    assert (weights[0][:2][..., far] == 0).all() and (weights[2][:2][..., far] == 0).all()  # local RoPE layers
    assert (weights[3][:2][..., far] > 0).all()  # the global NoPE layer sees every earlier key
    assert (weights[0][2:][..., far] > 0).all()  # the plain hybrid's RoPE layers are global
    assert torch.allclose(weights[0], torch.stack([a[1][0] for a in alone]), atol=1e-5)


def test_alibi_slopes_stack_apart_and_as_alone(_pattern_names):
    _pattern_names.append(
        add_encoding(
            "alibi-steep-test",
            "ALiBi, slopes 4, 2, ...",
            lambda c: posenc.ALiBi(c.n_heads, slopes=[4.0 / 2**h for h in range(c.n_heads)]),
        )
    )
    ensemble, _ = train(CopyBack(1), ["alibi", "alibi-steep-test"], replace(TINY, steps=5))
    assert len(ensemble.groups) == 2  # other slopes: never one shared bias
    assert torch.equal(ensemble.groups[1][2].slopes, torch.tensor([4.0, 2.0]))
    tokens = torch.randint(TINY.vocab_size, (4, 2, 12), generator=torch.Generator().manual_seed(2))
    alone = torch.stack([m(tokens[i]) for i, m in enumerate(ensemble.trained_models())])
    assert torch.allclose(ensemble.logits(tokens), alone, atol=1e-5)  # float32: fused attention, another order
