"""posenc.context_extension: the measures, YaRN's ramp, and cross-checks of the scaled tables against formulas."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import context_extension as ext

HEAD_DIM, BASE, ORIGINAL = 128, 10_000.0, 4096
ROPE = posenc.rope_frequencies(HEAD_DIM, {"rope_theta": BASE}, ORIGINAL)[0]


def test_wavelengths_and_turns_of_rope():
    exponents = torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM
    assert torch.allclose(ext.wavelengths(ROPE), 2 * math.pi * BASE**exponents, rtol=1e-6)
    assert torch.allclose(
        ext.turns(ROPE, ORIGINAL) * ext.wavelengths(ROPE), torch.full((64,), float(ORIGINAL), dtype=torch.float64)
    )
    assert int((ext.turns(ROPE, ORIGINAL) < 1).sum()) == 18
    assert ext.wavelengths(torch.tensor([0.0, 1.0]))[0] == math.inf


@given(r=st.floats(0, 100), alpha=st.floats(0.1, 10), width=st.floats(0.1, 50))
def test_yarn_ramp_is_the_papers_piecewise_linear_function(r, alpha, width):
    beta = alpha + width
    gamma = ext.yarn_ramp(torch.tensor([r], dtype=torch.float64), alpha, beta).item()
    expected = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
    assert math.isclose(gamma, expected, abs_tol=1e-12)


def test_yarn_ramp_is_monotone_and_rejects_bad_edges():
    gamma = ext.yarn_ramp(torch.logspace(-2, 3, 200))
    assert (gamma.diff() >= 0).all() and gamma[0] == 0 and gamma[-1] == 1
    with pytest.raises(ValueError, match="beta"):
        ext.yarn_ramp(torch.ones(3), alpha=4.0, beta=4.0)
    with pytest.raises(ValueError, match="alpha"):
        ext.yarn_ramp(torch.ones(3), alpha=0.0)
    with pytest.raises(TypeError, match="r must be a torch.Tensor"):
        ext.yarn_ramp([1.0, 2.0])


@settings(deadline=None, max_examples=30)
@given(
    factor=st.floats(1.0, 32.0),
    low=st.floats(0.5, 2.0),
    spread=st.floats(1.5, 8.0),
    exponent=st.floats(3.5, 6.0),
    length=st.sampled_from([1024, 4096, 8192]),
)
def test_llama3_is_the_papers_yarn_ramp_with_low_and_high_as_edges(factor, low, spread, exponent, length):
    high, base = low * spread, 10.0**exponent
    params = {
        "rope_type": "llama3",
        "rope_theta": base,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": length,
    }
    scaled, _ = posenc.rope_frequencies(HEAD_DIM, params, int(factor * length))
    rope = posenc.rope_frequencies(HEAD_DIM, {"rope_theta": base})[0].double()
    gamma = ext.yarn_ramp(ext.turns(rope, length), alpha=low, beta=high)
    assert torch.allclose(scaled.double(), (1 - gamma) * rope / factor + gamma * rope, rtol=1e-5, atol=0)


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_untruncated_yarn_ramps_linearly_in_log_turns(factor):
    params = {
        "rope_type": "yarn",
        "rope_theta": BASE,
        "factor": factor,
        "original_max_position_embeddings": ORIGINAL,
        "truncate": False,
    }
    scaled, temperature = posenc.rope_frequencies(HEAD_DIM, params, int(factor * ORIGINAL))
    rope = ROPE.double()
    gamma = ((ext.turns(rope, ORIGINAL).log() - math.log(1)) / (math.log(32) - math.log(1))).clamp(0, 1)
    assert torch.allclose(scaled.double(), (1 - gamma) * rope / factor + gamma * rope, rtol=1e-5, atol=0)
    assert math.isclose(temperature, 0.1 * math.log(factor) + 1)
    paper = ext.yarn_ramp(ext.turns(rope, ORIGINAL))
    assert (paper - gamma).abs().max() > 0.3  # the paper's ramp (linear in r) is a different function


@pytest.mark.parametrize("scale", [1.5, 2.0, 4.0, 8.0])
def test_ntk_aware_base_is_dynamic_ntk_at_the_scaled_length(scale):
    ntk_base = BASE * scale ** (HEAD_DIM / (HEAD_DIM - 2))
    ntk, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_theta": ntk_base}, ORIGINAL)
    dynamic, _ = posenc.rope_frequencies(
        HEAD_DIM, {"rope_type": "dynamic", "rope_theta": BASE, "factor": 1.0}, ORIGINAL, seq_len=int(scale * ORIGINAL)
    )
    # exact by construction: scale * ORIGINAL / ORIGINAL is exactly scale for these values, so both compute the
    # same base with the same operations; pair 0 is base'^0 = 1 exactly
    assert torch.equal(ntk, dynamic)
    assert math.isclose(ROPE[-1] / ntk[-1], scale, rel_tol=1e-5) and ntk[0] == 1.0


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_tradeoffs_of_unscaled_and_interpolated_tables(scale):
    extended = scale * ORIGINAL
    # finest_step == 1 and 1 / scale: theta_0 = 1 exactly, and dividing by a power of two is exact
    unscaled = ext.tradeoffs(ROPE, ROPE, ORIGINAL, extended)
    assert unscaled["kept_pairs"] == 64 and unscaled["unseen_pairs"] == 18 and unscaled["finest_step"] == 1.0
    assert math.isclose(unscaled["worst_overshoot"], scale, rel_tol=1e-6)
    interpolated = ext.tradeoffs(ROPE / scale, ROPE, ORIGINAL, extended)
    assert interpolated["unseen_pairs"] == 0 and interpolated["kept_pairs"] == 0
    assert interpolated["finest_step"] == 1 / scale and interpolated["worst_overshoot"] == 1.0
    assert math.isclose(interpolated["slowest_turns"], ext.turns(ROPE, ORIGINAL)[-1].item(), rel_tol=1e-6)
    assert interpolated["long_pairs"] > unscaled["long_pairs"] == 18


@given(scale=st.floats(1.0, 64.0))
def test_unseen_arc_caps_at_a_full_turn(scale):
    arc = ext.unseen_arc(ROPE, ROPE, ORIGINAL, int(scale * ORIGINAL))
    turned_in_training = ext.turns(ROPE, ORIGINAL) >= 1
    assert torch.all(arc[turned_in_training] == 1)  # exact: both arcs are capped at the same 2 pi
    assert torch.all(arc >= 1 - 1e-6) and torch.all(arc <= scale + 1e-6)


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="inv_freq"):
        ext.wavelengths([1.0, 0.5])
    with pytest.raises(ValueError, match=r"inv_freq must be a 1-D"):
        ext.turns(torch.ones(2, 3), 10)
    with pytest.raises(TypeError, match="length"):
        ext.turns(ROPE, 10.0)
    with pytest.raises(ValueError, match="same shape"):
        ext.unseen_arc(ROPE[:10], ROPE, ORIGINAL, ORIGINAL)
    with pytest.raises(ValueError, match="trained_length"):
        ext.tradeoffs(ROPE, ROPE, 0, ORIGINAL)


def test_score_kernel_starts_at_the_temperature_squared_and_stretches_with_interpolation():
    distances = torch.arange(0, 2000, dtype=torch.float64)
    kernel = ext.score_kernel(ROPE, distances)
    assert math.isclose(kernel[0].item(), 1.0, rel_tol=1e-15) and (kernel.abs() <= 1 + 1e-12).all()
    assert math.isclose(ext.score_kernel(ROPE, distances[:1], 1.5)[0].item(), 2.25, rel_tol=1e-15)
    stretched = ext.score_kernel(ROPE / 4, 4 * distances[:500])  # dividing by 4 is exact in float32
    assert torch.allclose(stretched, kernel[:500], atol=1e-12)  # cos of the same float64 angles
    with pytest.raises(ValueError, match="attention_factor"):
        ext.score_kernel(ROPE, distances, attention_factor=0.0)


def test_critical_dimension_of_llama_2_and_the_extrapolation_bound():
    assert ext.critical_pair(HEAD_DIM, BASE, ORIGINAL) == 46  # d_c = 92 (Liu et al. 2023)
    assert int((ext.turns(ROPE, ORIGINAL) < 1).sum()) == HEAD_DIM // 2 - 46
    assert math.isclose(ext.extrapolation_bound(HEAD_DIM, BASE, 92), ext.wavelengths(ROPE)[46].item(), rel_tol=1e-6)
    assert 128_000 < ext.extrapolation_bound(HEAD_DIM, 1e6, 92) < 130_000
    assert ext.critical_pair(HEAD_DIM, BASE, 1) == 0 and ext.critical_pair(HEAD_DIM, BASE, 10**30) == 64
    with pytest.raises(ValueError, match="base"):
        ext.critical_pair(HEAD_DIM, 1.0, ORIGINAL)
    with pytest.raises(ValueError, match="head_dim"):
        ext.critical_pair(7, BASE, ORIGINAL)


def test_phi3_longrope_lists_are_monotone_and_match_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    phi3 = ext.PHI3_VISION_128K
    assert len(phi3["long_factor"]) == len(phi3["short_factor"]) == phi3["head_dim"] // 2
    parameters = {
        "rope_type": "longrope",
        "rope_theta": phi3["rope_theta"],
        "original_max_position_embeddings": phi3["original_max_position_embeddings"],
        "long_factor": phi3["long_factor"],
        "short_factor": phi3["short_factor"],
    }
    config = transformers.LlamaConfig(
        hidden_size=4 * phi3["head_dim"],
        num_attention_heads=4,
        max_position_embeddings=phi3["max_position_embeddings"],
        rope_parameters=dict(parameters),
    )
    for seq_len in (phi3["original_max_position_embeddings"], phi3["max_position_embeddings"]):
        ours = posenc.rope_frequencies(phi3["head_dim"], parameters, phi3["max_position_embeddings"], seq_len)
        theirs = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len)
        assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1]  # same operations, same order
    long = torch.tensor(phi3["long_factor"])
    assert (long.diff() >= 0).all() and long[0] < 1.05 and long[-1] > 64
