"""posenc.lab.experiments_study: chapter 11's study (ALiBi's slope family, the budget checks), its committed
file posenc/lab/data/experiments_study.json (make experiments-study), its thin command line and the attention probes."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from book.tools import experiments_study as tool
from posenc.lab import experiments as ex
from posenc.lab import experiments_study as study
from posenc.lab import results


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Registrations (the slope family: register_slope_family, load) end with each test."""
    monkeypatch.setattr(ex.registry, "REGISTRY", dict(ex.REGISTRY))


def tiny(**changes):
    return dataclasses.replace(ex.ExperimentConfig(), length_factors=(1, 2), steps=2, seeds=(0,), **changes)


def trained(name, config, seed=0):
    model = ex.build_model(name, config, seed)
    model.eval()
    return model


def test_slope_family_is_registered_with_its_slopes(registry):
    names = study.register_slope_family()
    assert names == list(study.SLOPE_FAMILY) and study.FAMILY == ("alibi", *names)
    for name, slopes in study.SLOPE_FAMILY.items():
        assert ex.build_model(name, ex.ExperimentConfig(), 0).encoding.slopes.tolist() == list(slopes)
    assert ex.encoding_label("alibi-1") == "ALiBi, slopes 1, 1/2, 1/4, 1/8"
    assert study.register_slope_family() == names  # again: no error


def test_families_are_registered_with_their_scale_and_base(registry):
    names = study.register_families()
    jordans = [*study.JORDAN_BASES, *study.JORDAN_ROTATION_BASES]
    assert names == [*study.XPOS_SCALES, *study.ROPE_BASES, *jordans] and study.register_families() == names
    assert study.FAMILIES == {
        "xpos": ("xpos", *study.XPOS_SCALES),
        "rope": ("rope", *study.ROPE_BASES),
        "jordan": ("jordan", *study.JORDAN_BASES),
        "jordan-rotation": ("jordan-rotation", *study.JORDAN_ROTATION_BASES),
    }
    config = ex.ExperimentConfig()
    for name, base in study.ROPE_BASES.items():
        inv_freq = ex.build_model(name, config, 0).encoding.inv_freq.double()
        expected = base ** (-torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)
        torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)
    from posenc.generators import xpos_generator

    for name, scale in study.XPOS_SCALES.items():
        generator = ex.build_model(name, config, 0).encoding.generator
        torch.testing.assert_close(generator, xpos_generator(config.head_dim, scale_base=scale))
        assert not torch.equal(generator, ex.build_model("xpos", config, 0).encoding.generator)  # not B = 512
    assert ex.encoding_label("xpos-8") == "xPos, B = 8" and ex.encoding_label("rope-1e6") == "RoPE, base 1e6"
    from posenc.generators import jordan_generator

    for name, base in study.JORDAN_BASES.items():  # the coupled block and its control, at each base's frequencies
        generator = ex.build_model(name, config, 0).encoding.generator
        torch.testing.assert_close(generator, jordan_generator(config.head_dim, base=base))
        control = ex.build_model(f"jordan-rotation-{name.split('-')[1]}", config, 0).encoding.generator
        torch.testing.assert_close(control, ex.jordan_rotation_generator(config.head_dim, base=base))
        assert torch.equal(torch.diagonal(generator), torch.diagonal(control))  # no damping on either
        assert not torch.equal(generator, control)  # the coupling
    assert ex.encoding_label("jordan-1e6") == "Jordan block, base 1e6"


def test_families_study_names_an_unknown_family(registry):
    with pytest.raises(ValueError, match="families"):
        study.families_study(tiny(), families=["jordan", "nope"])


def test_a_tiny_families_part_can_remake_one_family(registry):
    part = study.families_study(tiny(), families=["jordan"])
    assert list(part) == ["jordan"] and list(part["jordan"]) == list(study.FAMILIES["jordan"])


def test_a_tiny_families_part_scores_every_length_and_validation(registry):
    config = tiny()
    part = study.families_study(config)
    assert {family: list(entries) for family, entries in part.items()} == {
        family: list(names) for family, names in study.FAMILIES.items()
    }
    for entries in part.values():
        for entry in entries.values():
            assert entry["seeds"] == list(study.FAMILY_SEEDS) and set(entry["fresh"]) == {"16", "32"}
            assert entry["fresh_targets"] == {"16": 14, "32": 30} and entry["validation_targets"] == {"32": 30}
            assert study.fresh_accuracy(entry, 32, "validation").shape == (3, config.eval_batch(32))


def test_fresh_and_validation_batches_are_new_sequences():
    config = ex.ExperimentConfig()
    fresh, validation = study.fresh_config(config), study.validation_config(config)
    assert fresh.eval_batch(512) == study.FRESH_SEQUENCES
    assert all(fresh.eval_batch(n) >= 128 for n in config.eval_lengths)
    task = study.chapter_tasks()[1]
    for other in (fresh, validation):
        for n in (16, 512):
            table = ex.evaluation_data(task, n, config)[0]
            assert not torch.equal(ex.evaluation_data(task, n, other)[0][:8], table[:8])


def test_attention_probes_on_uniform_attention():
    # q = k = 0: every query attends uniformly to itself and the past, so the profile is known exactly
    config = tiny()
    model = trained("nope-causal", config)
    with torch.no_grad():
        for block in model.blocks:
            block.q.weight.zero_()
            block.k.weight.zero_()
    length, from_query = 24, 8
    tokens = torch.randint(config.vocab_size, (3, length), generator=torch.Generator().manual_seed(0))
    profile = study.attention_by_offset([model, model], tokens, from_query)
    assert profile.shape == (2, length)
    queries = torch.arange(from_query, length, dtype=torch.float64)
    offsets = torch.arange(length, dtype=torch.float64)
    expected = ((offsets[None, :] <= queries[:, None]) / (queries[:, None] + 1)).mean(0)
    torch.testing.assert_close(profile[0].double(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(profile.sum(-1), torch.ones(2), atol=1e-5, rtol=0)
    for beyond in (0, 5, 12):
        far = study.far_attention([model], tokens, beyond, from_query)
        assert far.shape == (1,) and far[0].item() == pytest.approx(expected[beyond + 1 :].sum().item(), abs=1e-6)


def test_attention_probes_refuse_bad_input():
    model = trained("nope-causal", tiny())
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="from_query"):
        study.far_attention([model], tokens, 1, 8)
    with pytest.raises(TypeError, match="tokens"):
        study.attention_by_offset([model], tokens[0], 0)
    with pytest.raises(ValueError, match="models"):
        study.attention_by_offset([], tokens, 0)


def test_a_tiny_plan_records_counts_and_reads_back(registry):
    config = tiny()
    slopes = study.slope_study(config)
    task = study.chapter_tasks()[0]
    entry = slopes[task.name]["alibi-4"]
    assert entry["seeds"] == [0] and set(entry["accuracy"]) == {"16", "32"}
    assert entry["fresh_targets"] == {"32": 30}
    assert len(entry["fresh"]["32"][0]) == study.fresh_config(config).eval_batch(32)
    assert entry["validation_targets"] == {"32": 30}
    runs = study.runs_of(slopes[task.name], task.name)
    assert {r.encoding for r in runs} == set(study.FAMILY)
    assert ex.accuracy_spread(runs, task.name, "alibi-4", 32)[0] == entry["accuracy"]["32"][0]
    assert study.fresh_accuracy(entry, 32).shape == (1, study.fresh_config(config).eval_batch(32))


def test_a_tiny_copy_back_budget_trains_three_times_the_steps():
    config = tiny()
    part = study.copy_back_budget_study(config)
    assert list(part) == [str(study.BUDGET_FACTOR * config.steps)]
    entries = part[str(study.BUDGET_FACTOR * config.steps)]
    assert list(entries) == list(study.COPY_BACK_BUDGET_NAMES)
    for entry in entries.values():
        assert entry["seeds"] == list(study.BUDGET_SEEDS) and set(entry["fresh"]) == {"16", "32"}
        assert entry["fresh_targets"] == {"16": 14, "32": 30}  # copy 2 back: every query from 2 on


def test_a_tiny_table_part_scores_the_tables_models_at_16L_and_32L():
    config = dataclasses.replace(tiny(train_length=4), length_factors=(1, 16, 32))  # fresh at 64 and 128
    part = study.table_study(config)
    for task, names, offset in zip(study.chapter_tasks(), study.TABLE_NAMES, (2, 1)):
        assert list(part[task.name]) == list(names)
        for entry in part[task.name].values():
            assert entry["seeds"] == [0] and set(entry["accuracy"]) == {"4", "64", "128"}
            assert entry["fresh_targets"] == {"64": 64 - offset, "128": 128 - offset}
            assert study.fresh_accuracy(entry, 128).shape == (1, study.FRESH_SEQUENCES)


def test_compact_json_keeps_the_record():
    record = {"a": [1, 2, 3], "b": {"c": [[0.5, 1e-05], [-2, 3]]}, "d": "x [1, 2]"}
    text = tool.compact_json(record)
    assert json.loads(text) == record and "[1,2,3]" in text


def test_committed_file_matches_the_plan(registry):
    data = study.load()
    config = ex.ExperimentConfig()
    assert data["budget_steps"] == [config.steps, 3 * config.steps] and data["budget_seeds"] == [0, 1, 2]
    for task in study.chapter_tasks():
        for name in study.FAMILY:
            entry = data["slopes"][task.name][name]
            assert entry["seeds"] == list(config.seeds)
            assert [len(row) for row in entry["fresh"]["512"]] == [study.FRESH_SEQUENCES] * len(config.seeds)
            assert len(entry["validation"]["32"][0]) == config.eval_batch(32)
    for steps in data["budget_steps"]:
        part = data["budget"][str(steps)]
        assert list(part) == list(study.BUDGET_NAMES)
        for entry in part.values():
            assert entry["seeds"] == [0, 1, 2]
            assert {int(n): len(rows[0]) for n, rows in entry["fresh"].items()} == {
                n: study.fresh_config(config).eval_batch(n) for n in config.eval_lengths
            }
            assert all(entry["fresh_targets"][str(n)] == n - 1 for n in config.eval_lengths)  # fetch position 1
    part = data["budget_copy_back"][str(3 * config.steps)]
    assert list(part) == list(study.COPY_BACK_BUDGET_NAMES)
    for entry in part.values():
        assert entry["seeds"] == [0, 1, 2] and len(entry["final_loss"]) == 3
        assert all(entry["fresh_targets"][str(n)] == n - 2 for n in config.eval_lengths)  # copy 2 back
    for task, names in zip(study.chapter_tasks(), study.TABLE_NAMES):
        assert list(data["table"][task.name]) == list(names)
        for entry in data["table"][task.name].values():
            assert entry["seeds"] == list(config.seeds) and set(entry["accuracy"]) == {
                str(n) for n in config.eval_lengths
            }
            assert [len(row) for row in entry["fresh"]["512"]] == [study.FRESH_SEQUENCES] * len(config.seeds)
            assert [len(row) for row in entry["fresh"]["256"]] == [config.eval_batch_size] * len(config.seeds)
    assert data["family_seeds"] == list(study.FAMILY_SEEDS)
    for family, names in study.FAMILIES.items():
        assert list(data["families"][family]) == list(names)
        for entry in data["families"][family].values():
            assert entry["seeds"] == list(study.FAMILY_SEEDS) and set(entry["fresh"]) == {
                str(n) for n in config.eval_lengths
            }
            assert all(entry["fresh_targets"][str(n)] == n - 2 for n in config.eval_lengths)  # copy 2 back
            assert len(entry["validation"]["32"]) == len(study.FAMILY_SEEDS)


def test_load_names_a_field_that_disagrees(tmp_path):
    data = study.load()
    data["budget_seeds"] = [7]
    path = tmp_path / "study.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="budget_seeds"):
        study.load(path)
    data = study.load()
    del data["table"]["copy 2 back"]["jordan-damped"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="jordan-damped"):
        study.load(path)
    data = study.load()
    del data["families"]["rope"]["rope-1e6"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="rope-1e6"):
        study.load(path)
    with pytest.raises(FileNotFoundError, match="make experiments-study"):
        study.load(tmp_path / "missing.json")


def test_one_member_retrained_reproduces_the_file(registry):
    """Seeded training on the file's CPU, threads and torch gives the file's numbers bit for bit (and a model's
    numbers do not depend on what was trained beside it)."""
    data = study.load()
    if not results.same_platform(data):
        pytest.skip("another CPU or torch than the file's: training rounds differently")
    study.register_slope_family()
    config = dataclasses.replace(ex.ExperimentConfig(), seeds=(0,))
    task = study.chapter_tasks()[0]
    with ex.threads(1):
        run = ex.run_plan([(task, "alibi-4")], config)[0]
    entry = data["slopes"][task.name]["alibi-4"]
    assert run.losses[-1] == entry["final_loss"][0]
    assert [run.accuracy[n] for n in config.eval_lengths] == [entry["accuracy"][str(n)][0] for n in config.eval_lengths]


def test_a_forced_arithmetic_path_is_not_the_files_platform(monkeypatch):
    data = study.load()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert not results.same_platform(data)
