"""posenc.lab.hybrid_study: chapter 13's trained comparison of layer patterns and its committed result."""

import json

import pytest
import torch

import posenc
from posenc.lab import experiments as ex
from posenc.lab import hybrid_study as hs
from posenc.layer_patterns import LocalWindow


@pytest.fixture(autouse=True, scope="module")
def _unregister():
    # register() adds names to the harness's tables (two, and the controls'); leave them as other modules expect them
    yield
    controls = [name for _, names in hs.CONTROLS_PLAN for name in names]
    for name in ("rnope-swa", "rope-window", *controls, "hybrid-1e5", f"rope-window-w{hs.WIDE_WINDOW}"):
        ex.remove_encoding(name)


def test_study_is_chapter_11s_config_with_four_layers():
    config = hs.study_config()
    assert config.n_layers == 4
    assert config == ex.ExperimentConfig(n_layers=4)  # nothing else differs from chapter 11
    assert [task.name for task in hs.study_tasks()] == ["copy 2 back", "fetch position 1", "copy after marker 1"]


def test_register_builds_the_windowed_layers_and_is_idempotent():
    hs.register()
    hs.register()  # a re-run notebook registers again
    config = hs.study_config()
    model = ex.build_model("rnope-swa", config, seed=0)
    layers = [model.encoding.layer(i) for i in range(4)]
    assert [type(layer).__name__ for layer in layers] == ["LocalWindow"] * 3 + ["NoPE"]
    assert all(layer.size == hs.WINDOW and layer.mode == "sliding" for layer in layers[:3])
    window = ex.build_model("rope-window", config, seed=0).encoding
    assert isinstance(window, LocalWindow) and isinstance(window.inner, posenc.RotaryEmbedding)
    hybrid = ex.build_model("hybrid", config, seed=0).encoding
    assert [type(hybrid.layer(i)).__name__ for i in range(4)] == ["RotaryEmbedding"] * 3 + ["NoPE"]


def test_the_controls_change_only_the_base_or_the_window():
    # the controls of CONTROLS_PLAN: the same layer patterns as the study's, with theta = 1e5 or 1e6 in place of the
    # harness's 1e4, or a window of WIDE_WINDOW (the training length) in place of WINDOW
    hs.register()
    config = hs.controls_config()
    assert config.head_dim == 8 and config.seeds == hs.BUDGET_SEEDS and config.steps == hs.study_config().steps

    def tables(name):
        encoding = ex.build_model(name, config, seed=0).encoding
        layers = [encoding.layer(i) for i in range(4)] if hasattr(encoding, "layer") else [encoding] * 4
        return [getattr(getattr(layer, "inner", layer), "inv_freq", None) for layer in layers], layers

    def plain(base):
        return posenc.rope_frequencies(8, {"rope_theta": base})[0]

    assert torch.equal(tables("rope")[0][0], plain(1e4))  # the harness's base
    for name, base in (("rope-1e5", 1e5), ("rope-1e6", 1e6), ("hybrid-1e6", 1e6), ("rnope-swa-1e6", 1e6)):
        inv_freq, layers = tables(name)
        assert all(torch.equal(table, plain(base)) for table in inv_freq[:3])
        nope = name.startswith(("hybrid", "rnope"))
        assert (type(layers[3]).__name__ == "NoPE") == nope
        windowed = [layer.size if isinstance(layer, LocalWindow) else None for layer in layers[:3]]
        assert windowed == [hs.WINDOW if name.startswith("rnope") else None] * 3
    _, wide = tables(f"rnope-swa-w{hs.WIDE_WINDOW}")
    assert [layer.size for layer in wide[:3]] == [hs.WIDE_WINDOW] * 3 == [config.train_length] * 3
    assert torch.equal(wide[0].inner.inv_freq, plain(1e4)) and type(wide[3]).__name__ == "NoPE"
    # with the window as long as the training sequences, it hides nothing in training: the model computes the
    # unwindowed hybrid's logits there (same seed, same weights)
    tokens = torch.randint(0, config.vocab_size, (2, config.train_length))
    with torch.no_grad():
        pair = [ex.build_model(name, config, seed=0)(tokens) for name in (f"rnope-swa-w{hs.WIDE_WINDOW}", "hybrid")]
    assert torch.equal(pair[0], pair[1])


def test_window_hides_keys_beyond_it_and_the_ensemble_computes_the_same_model():
    # a windowed model's attention weights are zero beyond the window, and the batched Ensemble the harness trains
    # computes the models' own logits
    hs.register()
    config = hs.study_config()
    model = ex.build_model("rope-window", config, seed=0)
    tokens = torch.randint(0, config.vocab_size, (1, 20))
    with torch.no_grad():
        _, weights = model(tokens, return_weights=True)
    m, n = torch.arange(20)[:, None], torch.arange(20)[None, :]
    outside = (m - n >= hs.WINDOW) | (n > m)
    for layer_weights in weights:
        assert (layer_weights[..., outside] == 0).all()
    models = [ex.build_model(name, config, seed=0) for name in ("rnope-swa", "hybrid")]
    with torch.no_grad():
        batched = ex.Ensemble.from_models(models, config).logits(tokens.expand(len(models), -1, -1))
        for index, single in enumerate(models):
            assert torch.allclose(batched[index], single(tokens), rtol=1e-4, atol=1e-5)  # other summation order


def test_committed_result_matches_the_code():
    record, runs = hs.load_results()
    config = hs.study_config()
    assert len(runs) == len(hs.study_tasks()) * len(hs.NAMES) * len(config.seeds) == 75
    assert record["window"] == hs.WINDOW and record["names"] == list(hs.NAMES)
    assert all(set(run.accuracy) == set(config.eval_lengths) for run in runs)
    assert "todays_models" in record.get("command", "book.tools.todays_models")


def test_committed_result_has_the_marker_tasks_depth_evaluation():
    _, runs = hs.load_results()
    marker = hs.study_tasks()[2].name
    keys = {hs.depth_key(n, d) for n, d in hs.DEPTHS}
    assert all(set(run.depth) == keys for run in runs if run.task == marker)
    assert not any(hasattr(run, "depth") for run in runs if run.task != marker)


def test_committed_result_has_the_fresh_evaluation():
    _, runs = hs.load_results()
    marker = hs.study_tasks()[2].name
    lengths = {str(n) for n in hs.FRESH_LENGTHS}
    depths = {hs.depth_key(n, d) for n, d in hs.DEPTHS}
    for run in runs:
        assert set(run.fresh) == (lengths | depths if run.task == marker else lengths)
        assert all(entry["sequences"] == hs.FRESH_SEQUENCES >= 128 for entry in run.fresh.values())


def test_fresh_data_is_new_seeded_and_the_same_for_every_model():
    config = hs.study_config()
    for task in hs.study_tasks():
        for length in hs.FRESH_LENGTHS:
            inputs, targets, mask = hs.fresh_data(task, length, config)
            assert inputs.shape == targets.shape == mask.shape == (hs.FRESH_SEQUENCES, length)
            assert torch.equal(inputs, hs.fresh_data(task, length, config)[0])
            fixed = ex.evaluation_data(task, length, config)[0]
            # no fresh sequence repeats one of the fixed batch's
            assert not (inputs[:, None] == fixed[None]).all(-1).any()
    task = hs.study_tasks()[2]
    inputs = hs.deep_marker_data(task, 256, 224, hs.study_config(), fresh=True)[0]
    assert inputs.shape == (hs.FRESH_SEQUENCES, 256) and (inputs[:, 224] == task.marker(16)).all()
    with pytest.raises(TypeError, match="fresh"):
        hs.deep_marker_data(task, 256, 224, hs.study_config(), fresh=1)


def test_sequence_accuracies_pool_the_targets_and_chunking_changes_nothing():
    hs.register()
    config = hs.study_config()
    task = hs.study_tasks()[2]
    models = [ex.build_model(name, config, seed=1) for name in ("rnope-swa", "rope")]
    inputs, targets, mask = hs.fresh_data(task, 64, config, sequences=12)
    pooled, per_sequence = ex.sequence_accuracies(models, inputs, targets, mask, config)
    chunked, per_chunked = ex.sequence_accuracies(models, inputs, targets, mask, config, max_scores=4 * 64 * 64 * 5)
    assert torch.equal(pooled, chunked) and torch.equal(per_sequence, per_chunked)
    assert per_sequence.shape == (2, 12)
    for index, model in enumerate(models):
        alone = ex.batch_accuracy(model, inputs, targets, mask)[0]
        assert abs(pooled[index].item() - alone) < 1e-6  # the single model's own accuracy (same argmax)
        weights = mask.sum(1).double()
        assert torch.isclose((per_sequence[index] * weights).sum() / weights.sum(), pooled[index].double())


def test_deep_marker_data_moves_the_source_to_the_depth():
    config = hs.study_config()
    task = hs.study_tasks()[2]
    marker = task.marker(config.vocab_size)
    for length, depth in hs.DEPTHS:
        inputs, targets, mask = hs.deep_marker_data(task, length, depth, config)
        plain = ex.evaluation_data(task, length, config)[0]
        assert inputs.shape == plain.shape
        assert (inputs[:, :depth] != marker).all() and (inputs[:, depth] == marker).all()
        assert (inputs[:, depth + 1] != marker).all()
        assert not mask[:, : depth + 1].any() and mask[:, depth + 1 :].all()
        assert (targets[:, depth + 1 :] == inputs[:, depth + 1 : depth + 2]).all()
        assert torch.equal(inputs[:, depth + 2 :], plain[:, depth + 2 :])  # the rest of the batch is untouched
        again = hs.deep_marker_data(task, length, depth, config)[0]
        assert torch.equal(inputs, again)  # seeded: the same batch for every model
    with pytest.raises(ValueError, match="depth"):
        hs.deep_marker_data(task, 64, 63, config)
    with pytest.raises(TypeError, match="CopyAfterMarker"):
        hs.deep_marker_data(hs.study_tasks()[0], 64, 32, config)
    with pytest.raises(TypeError, match="depth"):
        hs.deep_marker_data(task, 64, 3.0, config)


def test_last_tokens_rule_answers_from_the_window_only():
    config = hs.study_config()
    task = hs.study_tasks()[2]
    marker = task.marker(config.vocab_size)
    # one sequence, marker at 2, source 5 at 3; a later marker at 9 (its next token 7 is not the target)
    inputs = torch.tensor([[1, 4, marker, 5, 6, 1, 2, 3, 4, marker, 7, 1]])
    sources = task.sources_of(inputs, config.vocab_size)
    mask = sources >= 0
    targets = torch.where(mask, torch.gather(inputs, 1, sources.clamp(min=0)), torch.zeros_like(inputs))
    assert mask.sum() == 9  # positions 3 (the source itself) to 11
    # a window reaching the first marker from every position answers right everywhere
    assert hs.last_tokens_rule(task, inputs, targets, mask, 12, config.vocab_size) == 1.0
    # window 4: positions 3 to 5 still see the marker at 2, 6 to 9 see no marker with its next token in the
    # window, 10 and 11 see only the marker at 9 and answer 7, wrong
    assert hs.last_tokens_rule(task, inputs, targets, mask, 4, config.vocab_size) == 3 / 9
    # on the chapter's deep probe at D = 224 every target is at most 30 past the source: 32 tokens suffice
    batch = hs.deep_marker_data(task, 256, 224, config, fresh=True)
    assert hs.last_tokens_rule(task, *batch, 32, config.vocab_size) == 1.0
    assert hs.last_tokens_rule(task, *batch, 8, config.vocab_size) < 0.5
    with pytest.raises(ValueError, match="window"):
        hs.last_tokens_rule(task, inputs, targets, mask, 1, config.vocab_size)
    with pytest.raises(TypeError, match="CopyAfterMarker"):
        hs.last_tokens_rule(hs.study_tasks()[0], inputs, targets, mask, 4, config.vocab_size)
    with pytest.raises(ValueError, match="shape"):
        hs.last_tokens_rule(task, inputs, targets[:, :5], mask, 4, config.vocab_size)


def test_load_results_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="make todays-models"):
        hs.load_results(tmp_path / "absent.json")
    with pytest.raises(TypeError, match="path"):
        hs.load_results(3)
    record = json.loads(hs.RESULTS_FILE.read_text())
    broken = tmp_path / "broken.json"
    changed = dict(record, config=dict(record["config"], n_layers=2))
    broken.write_text(json.dumps(changed))
    with pytest.raises(ValueError, match="config"):
        hs.load_results(broken)
    bad_run = dict(record["runs"][0], accuracy=dict(record["runs"][0]["accuracy"], **{"16": 1.5}))
    broken.write_text(json.dumps(dict(record, runs=[bad_run] + record["runs"][1:])))
    with pytest.raises(ValueError, match=r"accuracy\['16'\]"):
        hs.load_results(broken)
    marker_index = next(i for i, run in enumerate(record["runs"]) if "depth" in run)
    runs = list(record["runs"])
    runs[marker_index] = dict(runs[marker_index], depth={})
    broken.write_text(json.dumps(dict(record, runs=runs)))
    with pytest.raises(ValueError, match=r"depth\['64@32'\]"):
        hs.load_results(broken)
    runs = list(record["runs"])
    runs[0] = {key: value for key, value in runs[0].items() if key != "fresh"}
    broken.write_text(json.dumps(dict(record, runs=runs)))
    with pytest.raises(ValueError, match=r"fresh\['64'\]"):
        hs.load_results(broken)
    broken.write_text(json.dumps(dict(record, runs=record["runs"][1:])))
    with pytest.raises(ValueError, match="every task x name x seed"):
        hs.load_results(broken)
    broken.write_text(json.dumps(dict(record, runs=record["runs"] + record["runs"][:1])))
    with pytest.raises(ValueError, match="repeats"):
        hs.load_results(broken)


@pytest.mark.parametrize("part", ["study", "budget", "controls"])
def test_the_make_target_writes_what_load_results_reads(tmp_path, monkeypatch, part):
    # book/tools/todays_models.py (make todays-models, both parts), with the training replaced by the committed runs
    tools = pytest.importorskip("book.tools.todays_models")
    train, load, config = {
        "study": ("train_study", hs.load_results, hs.study_config),
        "budget": ("train_budget", hs.load_budget, hs.budget_config),
        "controls": ("train_controls", hs.load_controls, hs.controls_config),
    }[part]
    _, runs = load()
    monkeypatch.setattr(hs, train, lambda threads=1: (config(), runs))
    if part == "controls":  # and its 3x-budget part, written into the same file
        _, budget_runs = hs.load_controls(budget=True)
        monkeypatch.setattr(hs, "train_controls_budget", lambda threads=1: (hs.budget_config(), budget_runs))
    output = tmp_path / f"{part}.json"
    assert tools.main(["--part", part, "--output", str(output)]) == 0
    record, again = load(output)
    if part == "controls":
        _, budget_again = hs.load_controls(output, budget=True)
        assert [(r.task, r.encoding, r.seed, r.accuracy, r.fresh) for r in budget_again] == [
            (r.task, r.encoding, r.seed, r.accuracy, r.fresh) for r in budget_runs
        ]
    assert [(r.task, r.encoding, r.seed, r.accuracy) for r in again] == [
        (r.task, r.encoding, r.seed, r.accuracy) for r in runs
    ]
    assert [getattr(r, "depth", None) for r in again] == [getattr(r, "depth", None) for r in runs]
    assert [r.fresh for r in again] == [r.fresh for r in runs]
    assert "todays_models" in record["command"] and record["machine"]["threads"] == 1
    assert ("plan" in record) == (part != "study")


def test_fresh_view_swaps_in_the_fresh_numbers_and_keeps_the_fixed_ones():
    _, runs = hs.load_results()
    view = hs.fresh_view(runs)
    config = hs.study_config()
    marker = hs.study_tasks()[2].name
    for run, seen in zip(runs, view):
        for n in config.eval_lengths:
            expected = run.fresh[str(n)]["accuracy"] if n in hs.FRESH_LENGTHS else run.accuracy[n]
            assert seen.accuracy[n] == expected
        assert set(seen.sequence_sd) == set(run.fresh)
        if run.task == marker:
            assert seen.depth == {key: run.fresh[key]["accuracy"] for key in run.depth}
            assert run.depth != seen.depth  # the stored runs keep the fixed batch's
    task = hs.study_tasks()[2]
    assert torch.equal(hs.evaluation_batch(task, 16, config)[0], ex.evaluation_data(task, 16, config)[0])
    assert torch.equal(hs.evaluation_batch(task, 256, config)[0], hs.fresh_data(task, 256, config)[0])
    assert torch.equal(
        hs.evaluation_batch(task, 256, config, 224)[0], hs.deep_marker_data(task, 256, 224, config, fresh=True)[0]
    )


def test_committed_budget_check_matches_the_code():
    record, runs = hs.load_budget()
    config = hs.budget_config()
    assert config.steps == hs.BUDGET_STEPS == 3 * hs.study_config().steps and len(config.seeds) >= 2
    assert len(runs) == sum(len(names) for _, names in hs.BUDGET_PLAN) * len(config.seeds)
    assert {run.task for run in runs} == {task for task, _ in hs.BUDGET_PLAN}
    marker = hs.study_tasks()[2].name
    for run in runs:
        assert all(entry["sequences"] == hs.FRESH_SEQUENCES >= 128 for entry in run.fresh.values())
        assert (run.task == marker) == hasattr(run, "depth")
    assert record["plan"] == [[task, list(names)] for task, names in hs.BUDGET_PLAN]
    assert "todays_models" in record["command"] and record["machine"]["threads"] == 1


def test_committed_controls_match_the_code():
    record, runs = hs.load_controls()
    config = hs.controls_config()
    assert len(runs) == sum(len(names) for _, names in hs.CONTROLS_PLAN) * len(config.seeds)
    for run in runs:
        assert all(entry["sequences"] == hs.FRESH_SEQUENCES >= 128 for entry in run.fresh.values())
        assert run.task == hs.study_tasks()[2].name and set(run.depth) == {hs.depth_key(*p) for p in hs.DEPTHS}
    assert record["plan"] == [[task, list(names)] for task, names in hs.CONTROLS_PLAN]
    assert "todays_models" in record["command"] and record["machine"]["threads"] == 1
    with pytest.raises(FileNotFoundError, match="--part controls"):
        hs.load_controls(hs.CONTROLS_FILE.with_name("absent.json"))
    with pytest.raises(ValueError, match="config"):  # the budget file: 600 steps
        hs.load_controls(hs.BUDGET_FILE)
    # the 3x-budget part: the plan's models at 600 steps, fetch and the marker task, in the file's "budget" field
    budget_record, budget_runs = hs.load_controls(budget=True)
    assert budget_record["config"]["steps"] == hs.BUDGET_STEPS and budget_record["plan"] == [
        [task, list(names)] for task, names in hs.CONTROLS_BUDGET_PLAN
    ]
    assert len(budget_runs) == sum(len(names) for _, names in hs.CONTROLS_BUDGET_PLAN) * len(hs.BUDGET_SEEDS)
    assert {name for _, names in hs.CONTROLS_BUDGET_PLAN for name in names} <= {
        name for _, names in hs.CONTROLS_PLAN for name in names
    }
    marker = hs.study_tasks()[2].name
    assert all((run.task == marker) == hasattr(run, "depth") for run in budget_runs)
    with pytest.raises(ValueError, match="'budget' is missing"):
        hs.load_controls(hs.BUDGET_FILE, budget=True)
    with pytest.raises(TypeError, match="budget"):
        hs.load_controls(budget="yes")


def test_load_budget_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="--part budget"):
        hs.load_budget(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="config"):  # the study's own file: 200 steps, five seeds
        hs.load_budget(hs.RESULTS_FILE)
    record = json.loads(hs.BUDGET_FILE.read_text())
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(dict(record, runs=record["runs"][1:])))
    with pytest.raises(ValueError, match="every task x name x seed"):
        hs.load_budget(broken)
