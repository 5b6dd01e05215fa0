"""posenc.lab.experiments.registry: one registry of the encodings by name, each tagged with its group."""

import pytest
import torch

import posenc
from posenc.generators import jordan_generator
from posenc.lab.experiments import registry
from posenc.lab.experiments.config import ExperimentConfig
from posenc.lab.experiments.registry import (
    BEYOND_ENCODINGS,
    ENCODINGS,
    GROUPS,
    LAYER_PATTERNS,
    EncodingGroup,
    add_encoding,
    add_layer_pattern,
    encoding_label,
    registered,
    remove_encoding,
)
from posenc.layer_patterns import AttentionTemperature, LayerEncodings

CHAPTER_11 = [
    "nope-bidirectional",
    "nope-causal",
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "xpos",
    "jordan",
    "jordan-damped",
    "jordan-rotation",
    "jordan-rotation-damped",
]


@pytest.fixture
def scratch(monkeypatch):
    """Registrations made in the test end with it."""
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))


def test_each_name_has_one_group_and_the_three_tables_are_its_views():
    assert list(ENCODINGS) == CHAPTER_11  # chapter 11's plan, in its order
    assert list(LAYER_PATTERNS) == ["hybrid"] and list(BEYOND_ENCODINGS) == ["cope", "fox", "path"]
    views = [EncodingGroup(group) for group in GROUPS]
    assert sorted(name for view in views for name in view) == sorted(registry.REGISTRY)
    for name, entry in registry.REGISTRY.items():
        assert ENCODINGS.get(name) == (
            (entry.label, entry.causal, entry.factory) if entry.group == "position" else None
        )
        assert isinstance(entry.factory(ExperimentConfig()), posenc.PositionalEncoding) and not entry.added
    label, causal, factory = ENCODINGS["nope-bidirectional"]
    assert (label, causal, type(factory(ExperimentConfig()))) == ("NoPE, bidirectional", False, posenc.NoPE)
    assert encoding_label("path") == "PaTH" and "cope" not in ENCODINGS and len(BEYOND_ENCODINGS) == 3
    with pytest.raises(TypeError):
        ENCODINGS["mine"] = ENCODINGS["rope"]  # a read-only view: names are added by the functions below
    with pytest.raises(ValueError, match="group must be one of"):
        EncodingGroup("positions")


def test_unknown_names_are_rejected_with_the_list_of_names():
    with pytest.raises(ValueError, match="encoding must be one of .*'rope'.*'path'.*'hybrid'"):
        registered("sinusoid")
    with pytest.raises(ValueError, match="encoding must be one of"):
        encoding_label(3)


def test_add_layer_pattern_registers_a_per_layer_model(scratch):
    name = add_layer_pattern("nope-first-test", ["nope-causal", "rope"])
    assert add_layer_pattern(name, ("nope-causal", "rope")) == name  # the same again: a re-run notebook
    entry = registered(name)
    assert (entry.group, entry.layers, entry.causal, entry.added) == ("pattern", ("nope-causal", "rope"), True, True)
    layers = entry.factory(ExperimentConfig(n_layers=4))
    assert isinstance(layers, LayerEncodings)
    assert [type(layers.layer(i)).__name__ for i in range(4)] == ["NoPE", "RotaryEmbedding"] * 2
    assert encoding_label(name).startswith("layers NoPE, causal, RoPE") and name in LAYER_PATTERNS
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
    with pytest.raises(ValueError, match="at least one"):
        add_layer_pattern("bad-empty-test", [])
    assert not {"bad-input-test", "bad-causal-test", "bad-name-test", "bad-str-test"} & set(registry.REGISTRY)
    assert name not in ENCODINGS and "hybrid" not in ENCODINGS  # chapter 11's plan over ENCODINGS is untouched


def test_add_encoding_registers_replaces_and_refuses(scratch):
    def tuned(config):
        return AttentionTemperature(floor_scale=config.train_length // 2, attn_scale=0.5)

    assert add_encoding("nope-temperature-test", "NoPE, temperature", tuned) == "nope-temperature-test"
    assert add_encoding("nope-temperature-test", "NoPE, temperature 2", tuned)  # a re-run cell replaces it
    assert list(ENCODINGS) == CHAPTER_11 + ["nope-temperature-test"]
    assert encoding_label("nope-temperature-test") == "NoPE, temperature 2"
    add_layer_pattern("irope-test", ["rope"] * 3 + ["nope-temperature-test"])
    assert registered("irope-test").factory(ExperimentConfig(n_layers=4)).layer(3).floor_scale == 8
    for name in ("rope", "irope-test", "path", "hybrid"):
        with pytest.raises(ValueError, match="taken"):
            add_encoding(name, "again", lambda c: posenc.NoPE())
    with pytest.raises(TypeError, match="factory must return"):
        add_encoding("bad-factory-test", "bad", lambda c: None)
    with pytest.raises(TypeError, match="factory must be a callable"):
        add_encoding("bad-factory-test", "bad", posenc.NoPE())
    with pytest.raises(TypeError, match="name"):
        add_encoding("", "empty", lambda c: posenc.NoPE())
    with pytest.raises(TypeError, match="causal"):
        add_encoding("bad-causal-test", "bad", lambda c: posenc.NoPE(), causal=1)
    assert "bad-factory-test" not in registry.REGISTRY


def test_remove_encoding_forgets_only_added_names(scratch):
    add_encoding("removable-test", "removable", lambda c: posenc.NoPE())
    assert remove_encoding("removable-test") and "removable-test" not in ENCODINGS
    assert not remove_encoding("removable-test")
    with pytest.raises(ValueError, match="built in"):
        remove_encoding("hybrid")


def test_the_scratch_fixture_leaves_the_registry_as_it_was():
    assert list(ENCODINGS) == CHAPTER_11 and list(LAYER_PATTERNS) == ["hybrid"]


@pytest.mark.parametrize("head_dim", [8, 16])
def test_the_jordan_control_is_the_jordan_generator_without_its_nilpotent_part(head_dim):
    jordan = jordan_generator(head_dim, dtype=torch.float64)
    control = registry.jordan_rotation_generator(head_dim, dtype=torch.float64)
    nilpotent = jordan - control
    # exact: the entries are 0, 1 or one frequency, and each product entry has at most one non-zero term
    assert set(nilpotent.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(nilpotent @ nilpotent, torch.zeros_like(nilpotent))
    assert torch.equal(nilpotent @ control, control @ nilpotent)
    frequencies = torch.linalg.eigvals(control).imag.abs().sort().values
    expected = registry.jordan_frequencies(head_dim).repeat_interleave(2).sort().values
    assert torch.allclose(frequencies, expected, atol=1e-12)
    damped = registry.jordan_rotation_generator(head_dim, eigenvalue=-0.05, dtype=torch.float64)
    assert torch.allclose(
        torch.linalg.eigvals(damped).real, torch.full((head_dim,), -0.05, dtype=torch.float64), atol=1e-12
    )
