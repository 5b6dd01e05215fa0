"""RoPE analysis helpers: the long-range bound, per-pair logits, wrapped angle errors, the relative check."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import rope_analysis


def test_upper_bound_matches_a_loop_and_starts_at_p_plus_one_over_two():
    inv_freq, _ = posenc.rope_frequencies(16)
    distances = torch.tensor([0.0, 1.0, 7.5, 40.0, -40.0])
    bound = rope_analysis.relative_upper_bound(distances, inv_freq)
    for value, distance in zip(bound.tolist(), distances.tolist()):
        partial, total = 0j, 0.0
        for theta in inv_freq.double().tolist():
            partial += complex(math.cos(distance * theta), math.sin(distance * theta))
            total += abs(partial)
        assert value == pytest.approx(total / len(inv_freq), rel=1e-12)
    assert bound[0] == pytest.approx((8 + 1) / 2)
    assert bound[3] == pytest.approx(bound[4])  # |S_j| does not see the sign of the distance


def test_upper_bound_decays_for_a_llama_head():
    inv_freq, _ = posenc.rope_frequencies(128)
    bound = rope_analysis.relative_upper_bound(torch.arange(0, 1001), inv_freq)
    assert bound[0] == pytest.approx(32.5)
    assert bound[200:].max() < 0.5 * bound[0]


@settings(max_examples=40, deadline=None)
@given(distance=st.integers(min_value=-3000, max_value=3000), seed=st.integers(0, 10_000))
def test_upper_bound_bounds_the_logit(distance, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 32, generator=generator, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(32)
    logit = rope_analysis.pair_logit_contributions(q, k, [distance], inv_freq).sum()
    h = torch.complex(q[:16], q[16:]).conj() * torch.complex(k[:16], k[16:])
    steps = (torch.cat((h[1:], h.new_zeros(1))) - h).abs().max()  # h_{P} = 0 closes the Abel sum
    bound = rope_analysis.relative_upper_bound([distance], inv_freq)[0]
    assert abs(logit) <= steps * len(inv_freq) * bound + 1e-9


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@settings(max_examples=25, deadline=None)
@given(m=st.integers(-5000, 5000), n=st.integers(-5000, 5000))
def test_pair_contributions_sum_to_the_rope_logit(layout, m, n):
    q, k = torch.randn(2, 24, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(24)
    logit = (posenc.rotate(q[None], [m], inv_freq, layout=layout) @
             posenc.rotate(k[None], [n], inv_freq, layout=layout).T).item()
    contributions = rope_analysis.pair_logit_contributions(q, k, [m - n], inv_freq, layout)
    assert contributions.shape == (1, 12)
    assert contributions.sum().item() == pytest.approx(logit, abs=1e-3)


def test_unrotated_pairs_contribute_a_constant():
    inv_freq, _ = posenc.rope_frequencies(16, {"rope_type": "proportional", "partial_rotary_factor": 0.5})
    q, k = torch.randn(2, 16, dtype=torch.float64)
    contributions = rope_analysis.pair_logit_contributions(q, k, torch.arange(-50, 50), inv_freq)
    assert torch.equal(contributions[:, 4:], contributions[:1, 4:].expand(100, -1))
    assert contributions[:, :4].std(0).min() > 0


def test_wrapped_angle_error():
    reference = torch.tensor([0.0, 1.0, 3.0, -3.0], dtype=torch.float64)
    assert torch.allclose(rope_analysis.wrapped_angle_error(reference + 2 * math.pi * 7, reference),
                          torch.zeros(4, dtype=torch.float64), atol=1e-12)
    errors = rope_analysis.wrapped_angle_error(torch.tensor([3.0]), torch.tensor([-3.0]))
    assert errors.item() == pytest.approx(2 * math.pi - 6)
    assert float(rope_analysis.wrapped_angle_error(torch.randn(100) * 50, torch.randn(100)).max()) <= math.pi


def test_offset_spread_is_zero_exactly_for_functions_of_the_offset():
    positions = torch.arange(12)
    toeplitz = torch.cos(0.3 * (positions[:, None] - positions[None, :]).double())
    assert rope_analysis.max_offset_spread(toeplitz, positions, positions) == 0.0
    absolute = toeplitz + 0.01 * positions[:, None].double()  # offset 0 appears at rows 0 .. 11
    assert rope_analysis.max_offset_spread(absolute, positions, positions) == pytest.approx(0.11, rel=1e-9)
    grid = posenc.nd_rope.grid_positions(3, 3)
    assert rope_analysis.max_offset_spread(torch.zeros(9, 9), grid, grid) == 0.0
    with pytest.raises(ValueError, match="scores"):
        rope_analysis.max_offset_spread(torch.zeros(3, 4), positions[:3], positions[:3])


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="inv_freq"):
        rope_analysis.relative_upper_bound([1.0], torch.ones(2, 2))
    with pytest.raises(ValueError, match="q and k"):
        rope_analysis.pair_logit_contributions(torch.randn(8), torch.randn(8), [0], torch.ones(3))
    with pytest.raises(TypeError, match="distances"):
        rope_analysis.relative_upper_bound(torch.ones(2, dtype=torch.bool), torch.ones(2))
