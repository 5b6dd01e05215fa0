"""posenc.lab.experiments.training: many models trained side by side, evaluation, plans and tables."""

from dataclasses import replace

import pytest
import torch

import posenc
from posenc.lab.experiments import registry, training
from posenc.lab.experiments.config import ExperimentConfig
from posenc.lab.experiments.model import build_model
from posenc.lab.experiments.registry import add_encoding, add_layer_pattern
from posenc.lab.experiments.training import (
    Ensemble,
    accuracies,
    accuracy_spread,
    evaluate,
    evaluate_ensemble,
    fine_tune,
    mean_position_accuracy,
    results_table,
    run_encoding,
    run_experiments,
    run_plan,
    sequence_accuracies,
    train,
)
from posenc.lab.tasks import CopyBack, FetchPosition

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
DEEP = replace(TINY, n_layers=4, steps=30)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models are all overhead: one thread avoids OpenMP spin-waits on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made in the test end with it."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))


def _alone(ensemble, tokens):
    return torch.stack([model(tokens[i]) for i, model in enumerate(ensemble.trained_models())])


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


def test_the_ensemble_keeps_names_and_models_and_its_parts_view_them():
    ensemble = Ensemble(["rope", "alibi"], TINY)
    assert ensemble.names == ["rope", "rope", "alibi", "alibi"] and len(ensemble.models) == len(ensemble) == 4
    part = ensemble.part(1, 3)
    assert isinstance(part, Ensemble) and part.names == ["rope", "alibi"] and part.models == ensemble.models[1:3]
    assert part.params["embed.weight"].data_ptr() == ensemble.params["embed.weight"][1].data_ptr()
    tokens = torch.randint(TINY.vocab_size, (4, 2, 10), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(ensemble.logits(tokens), _alone(ensemble, tokens), atol=1e-5)  # float32: fused attention
    with pytest.raises(TypeError, match="TinyTransformer"):
        Ensemble.from_models([], TINY)
    with pytest.raises(ValueError, match="encoding must be one of"):
        Ensemble(["rope", "rotary"], TINY)


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
    with pytest.raises(ValueError, match="one task per model"):
        evaluate_ensemble(ensemble, [CopyBack(1)], 24, TINY)


def test_run_plan_keeps_the_plan_order_and_reports_each_pair():
    seen = []
    plan = [(CopyBack(2), "alibi"), (FetchPosition(1), "sinusoidal")]
    runs = run_plan(plan, replace(TINY, steps=5), progress=lambda pair: seen.append((pair[0].task, pair[0].encoding)))
    assert seen == [("copy 2 back", "alibi"), ("fetch position 1", "sinusoidal")]
    assert [(r.task, r.encoding, r.seed) for r in runs] == [(t.name, n, s) for t, n in plan for s in TINY.seeds]
    assert all(set(r.accuracy) == set(TINY.eval_lengths) for r in runs)
    curve = mean_position_accuracy(runs, "copy 2 back", "alibi", 16)
    assert curve.shape == (16,) and torch.isnan(curve[:2]).all()
    with pytest.raises(ValueError, match="encoding must be one of"):
        run_plan([(CopyBack(2), "rotary")], TINY)


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
    with pytest.raises(ValueError, match="no run"):
        accuracy_spread(runs, "fetch position 1", "rope", 8)


def test_with_rope_swaps_only_the_table():
    models = train(CopyBack(1), "rope", replace(TINY, steps=5))[0].trained_models()
    tokens = torch.randint(TINY.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    same = training.with_rope(models, {"rope_type": "default"}, TINY.train_length)
    # exact by construction: the rebuilt table is computed by the same code from the same parameters
    assert all(torch.equal(a(tokens), b(tokens)) for a, b in zip(models, same))
    stretched = training.with_rope(models, {"rope_type": "linear", "factor": 4.0}, TINY.train_length)
    assert torch.allclose(stretched[0].encoding.inv_freq, models[0].encoding.inv_freq / 4)
    assert not torch.allclose(stretched[0](tokens), models[0](tokens))
    with pytest.raises(TypeError, match="RoPE"):
        training.with_rope([build_model("alibi", TINY, 0)], {"rope_type": "default"}, 8)


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
    with pytest.raises(ValueError, match="batch_size"):
        fine_tune(models, CopyBack(1), TINY, length=16, steps=3, batch_size=0)
    with pytest.raises(TypeError, match="batch_sise"):
        fine_tune(models, CopyBack(1), TINY, length=16, steps=3, batch_sise=4)


def test_hybrid_trains_in_the_stack_as_alone():
    ensemble, losses = train(CopyBack(1), ["hybrid", "rope"], DEEP)
    assert losses.shape == (4, DEEP.steps)
    assert torch.isfinite(losses).all() and (losses[:, -5:].mean(1) < losses[:, :5].mean(1)).all()
    assert [stop - start for start, stop, _, _ in ensemble.groups] == [2, 2]  # the hybrid is not RoPE
    tokens = torch.randint(DEEP.vocab_size, (4, 2, 10), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(ensemble.logits(tokens), _alone(ensemble, tokens), atol=1e-5)  # float32: fused attention


def test_an_added_encoding_in_a_pattern_trains(scratch):
    from posenc.layer_patterns import AttentionTemperature

    add_encoding("nope-temperature-test", "NoPE, temperature", lambda c: AttentionTemperature(c.train_length // 2))
    add_layer_pattern("irope-test", ["rope"] * 3 + ["nope-temperature-test"])
    ensemble, losses = train(CopyBack(1), "irope-test", replace(DEEP, steps=5))
    assert isinstance(ensemble.models[0].encoding.layer(3), AttentionTemperature) and torch.isfinite(losses).all()
    tokens = torch.randint(DEEP.vocab_size, (2, 2, 24), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(ensemble.logits(tokens), _alone(ensemble, tokens), atol=1e-5)  # float32: fused attention


def test_alibi_slopes_train_apart(scratch):
    steep = add_encoding(
        "alibi-steep-test",
        "ALiBi, slopes 4, 2, ...",
        lambda c: posenc.ALiBi(c.n_heads, slopes=[4.0 / 2**h for h in range(c.n_heads)]),
    )
    ensemble, _ = train(CopyBack(1), ["alibi", steep], replace(TINY, steps=5))
    assert len(ensemble.groups) == 2  # other slopes: never one shared bias
    tokens = torch.randint(TINY.vocab_size, (4, 2, 12), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(ensemble.logits(tokens), _alone(ensemble, tokens), atol=1e-5)  # float32: fused attention


def test_sequence_accuracies_pool_to_the_harness_accuracy():
    task = FetchPosition(1)  # every sequence holds the same number of targets
    models = [build_model("rope", TINY, seed) for seed in (0, 1)]
    inputs, targets, mask = training.evaluation_data(task, 16, TINY)
    pooled, per_sequence = sequence_accuracies(models, inputs, targets, mask, TINY)
    assert per_sequence.shape == (2, TINY.eval_batch(16)) and per_sequence.dtype == torch.float64
    for model, total, row in zip(models, pooled, per_sequence):
        harness = evaluate(model, task, 16, TINY)[0]
        assert total.item() == pytest.approx(harness, abs=1e-6) and row.mean().item() == pytest.approx(
            harness, abs=1e-6
        )
    with pytest.raises(TypeError, match="models"):
        sequence_accuracies([], inputs, targets, mask, TINY)
